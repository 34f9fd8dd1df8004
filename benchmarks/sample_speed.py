"""`bench.py sample`: sample.py's decoding (KV cache, the precision it picks, its thread count) against
nanoGPT's (the whole context every token, float32), on a random baby GPT or a trained checkpoint."""

import copy
import time
from dataclasses import dataclass
from typing import Literal

import torch

from benchmarks.common import device_name
from gptkit.base.settings import check_seed, check_threads, comma_items, parse_config, require
from gptkit.machine.precision import DTYPES, pick_decode_dtype
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.machine.threads import pick_decode_threads
from gptkit.machine.timing import synchronize
from gptkit.sampling.decoding import generate_stream, lay_out_for_decoding
from model import GPT, GPTConfig


@dataclass
class SampleBenchConfig:
    out_dir: str = ""  # a run folder, whose best.pt is timed ('' = a random-weight model of the shape below)
    n_layer: int = 6  # random model: transformer blocks (nanoGPT's baby GPT)
    n_head: int = 6  # random model: attention heads
    n_embd: int = 384  # random model: width
    block_size: int = 256  # random model: context length
    vocab_size: int = 65  # random model: vocabulary (tinyshakespeare characters)
    pos_emb: Literal["learned", "rope"] = "learned"  # random model: position encoding
    max_new_tokens: int = 1000  # tokens generated per timed run
    batch_size: int = 1  # sequences generated together
    warmup_tokens: int = 16  # untimed tokens generated first, per mode
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    seed: int = 1337  # weights of the random model and the sampling generator
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # cached decoder's weights, as sample.py
    threads: int = 0  # torch CPU threads (0 = measured, as sample.py does)
    repeats: int = 1  # timed runs per mode; the fastest counts
    modes: str = "cache,nocache"  # which decoders to time, comma-separated

    def __post_init__(self):
        require(self, ["max_new_tokens", "batch_size", "repeats"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup_tokens", "temperature", "threads"], lambda v: v >= 0, "at least 0")
        check_seed(self.seed)
        check_threads(self.threads)
        check_device_name(self.device)
        self.shape()  # the random model's settings are checked by the model's own config
        modes = self.mode_list()
        if not modes or set(modes) - {"cache", "nocache"}:
            raise ValueError(f"modes must be 'cache', 'nocache' or both, comma-separated (got {self.modes!r})")

    def mode_list(self):
        return comma_items(self.modes)

    def shape(self):
        return GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size,
                         vocab_size=self.vocab_size, pos_emb=self.pos_emb, bias=False, dropout=0.0)


def bench_model(cfg, device):
    """The checkpoint's model, or a random-weight one of the configured shape; and a description."""
    if cfg.out_dir:
        from gptkit.run.run_folder import load_model

        model, _ = load_model(cfg.out_dir, device)
        source = f"checkpoint in {cfg.out_dir}"
    else:
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.shape()).to(device).eval()
        source = "random weights"
    c = model.config
    return model, (f"{c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, block {c.block_size}, "
                   f"vocab {c.vocab_size}, {c.pos_emb} positions ({model.num_params() / 1e6:.2f}M parameters), "
                   f"{source}")


def time_generation(model, prompt, cfg, kv_cache, device):
    """Wall and CPU seconds to generate max_new_tokens after an untimed warm-up; and the tokens."""
    with torch.no_grad():
        if cfg.warmup_tokens:
            for _ in generate_stream(model, prompt, cfg.warmup_tokens, kv_cache=kv_cache):
                pass
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = list(generate_stream(model, prompt, cfg.max_new_tokens, temperature=cfg.temperature,
                                      kv_cache=kv_cache, generator=generator))
        synchronize(device)
        return time.perf_counter() - t0, time.process_time() - c0, torch.cat(tokens, dim=1)


def cached_decoder(cfg, model, device):
    """A copy of model that decodes as sample.py's does (weights laid out for decoding, the threads and precision
    it measures): (the copy, its dtype, why those threads, why that dtype)."""
    cached = copy.deepcopy(model)
    if device == "cpu":  # as sample.py
        lay_out_for_decoding(cached)
    _, why_threads = pick_decode_threads(cfg.threads, cached, device, cfg.batch_size)  # both decode on these
    dtype, why = pick_decode_dtype(cfg.dtype, cached, device, cfg.batch_size)
    return cached.to(DTYPES[dtype]), dtype, why_threads, why


def main(argv):
    """sample.py's decoding against nanoGPT's, at the same thread count: each mode's tokens/s as it is timed,
    then the speedup. Returns {mode: tokens/s}."""
    cfg = parse_config(SampleBenchConfig, argv, prog="bench.py sample")
    device = pick_device(cfg.device)
    model, description = bench_model(cfg, device)
    cached, dtype, why_threads, why = cached_decoder(cfg, model, device)
    decoders = {"cache": (cached, True, f"with KV cache ({dtype}):"),
                "nocache": (model, False, "without cache (float32):")}
    prompt = torch.zeros((cfg.batch_size, 1), dtype=torch.long, device=device)
    print(f"model: {description}")
    print(f"machine: {device_name(device)}, torch {torch.__version__}")
    n = torch.get_num_threads()
    cpu_threads = f", {n} CPU thread{'s' if n > 1 else ''}" if device == "cpu" else ""
    print(f"device {device}{cpu_threads}, batch {cfg.batch_size}, {cfg.max_new_tokens} new tokens from a 1-token "
          f"prompt; {'; '.join(w for w in (why_threads, why) if w)}", flush=True)
    results = {}
    for mode in cfg.mode_list():
        decoder, kv_cache, label = decoders[mode]
        runs = [time_generation(decoder, prompt, cfg, kv_cache, device) for _ in range(cfg.repeats)]
        seconds, cpu_seconds, tokens = min(runs, key=lambda run: run[0])
        results[mode] = (seconds, tokens)
        print_sample_row(label, cfg, seconds, cpu_seconds)
    print_sample_comparison(results, dtype)
    return {mode: cfg.max_new_tokens * cfg.batch_size / seconds for mode, (seconds, _) in results.items()}


def print_sample_row(label, cfg, seconds, cpu_seconds):
    """One mode's rate, printed as soon as it is timed."""
    rate = cfg.max_new_tokens * cfg.batch_size / seconds
    best = f"best of {cfg.repeats}, " if cfg.repeats > 1 else ""
    print(f"{label:<27} {rate:9.1f} tokens/s  ({best}{seconds:.2f} s wall, {cpu_seconds:.2f} s CPU)", flush=True)


def print_sample_comparison(results, dtype):
    """With both modes timed: the speedup, and in float32 whether both wrote the same tokens."""
    if len(results) == 2:
        (t_cache, a), (t_full, b) = results["cache"], results["nocache"]
        print(f"speedup: {t_full / t_cache:.1f}x")
        if dtype == "float32":
            print(f"same tokens: {'yes' if torch.equal(a, b) else 'no (float rounding differs between the paths)'}")
