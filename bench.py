"""
Benchmarks, one subcommand each; every subcommand takes its own --key=value options (--help lists them).

    python bench.py sample                         # KV cache vs full recompute on a random baby GPT
    python bench.py sample --out_dir=out           # the same on a trained checkpoint
    python bench.py sample --dtype=bfloat16 --threads=1
"""

import os
import platform
import sys
import time
from dataclasses import dataclass

import torch

from config import parse_config
from errors import UserError, run_main
from hardware import autocast, pick_device, pick_dtype
from sample import decode_threads


@dataclass
class SampleBenchConfig:
    out_dir: str = ""  # folder holding ckpt.pt ('' = a random-weight model of the shape below)
    n_layer: int = 6  # random model: transformer blocks (nanoGPT's baby GPT)
    n_head: int = 6  # random model: attention heads
    n_embd: int = 384  # random model: width
    block_size: int = 256  # random model: context length
    vocab_size: int = 65  # random model: vocabulary (tinyshakespeare characters)
    pos_emb: str = "learned"  # random model: 'learned' or 'rope'
    max_new_tokens: int = 1000  # tokens generated per timed run
    batch_size: int = 1  # sequences generated together
    warmup_tokens: int = 16  # untimed tokens generated first, per mode
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    seed: int = 1337  # weights of the random model and the sampling generator
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    dtype: str = "float32"  # 'float32', 'bfloat16' or 'float16' (autocast, as sample.py)
    threads: int = 0  # torch CPU threads (0 = as sample.py: 1 on CPU, where more stall on a busy machine)
    repeats: int = 1  # timed runs per mode; the fastest counts
    modes: str = "cache,nocache"  # which decoders to time, comma-separated

    def validate(self):
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.warmup_tokens < 0 or self.repeats < 1:
            raise UserError("need max_new_tokens >= 1, batch_size >= 1, repeats >= 1 and warmup_tokens >= 0")
        modes = self.mode_list()
        if not modes or set(modes) - {"cache", "nocache"}:
            raise UserError(f"modes must be 'cache', 'nocache' or both, comma-separated (got {self.modes!r})")

    def mode_list(self):
        return [m.strip() for m in self.modes.split(",") if m.strip()]


def device_name(device):
    """What the numbers were measured on, e.g. 'Intel(R) Xeon(R) Processor, 2 cores'."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    if device != "cpu":
        return device
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_model(cfg, device):
    """The checkpoint's model, or a random-weight one of the configured shape; and a description."""
    from model import GPT, GPTConfig

    if cfg.out_dir:
        from checkpoint import load_model

        model, _ = load_model(cfg.out_dir, device)
        source = f"checkpoint {cfg.out_dir}/ckpt.pt"
    else:
        torch.manual_seed(cfg.seed)
        shape = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                     vocab_size=cfg.vocab_size, pos_emb=cfg.pos_emb, bias=False, dropout=0.0)
        try:
            model = GPT(GPTConfig(**shape)).to(device).eval()
        except ValueError as e:
            raise UserError(str(e)) from None
        source = "random weights"
    c = model.config
    return model, (f"{c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, block {c.block_size}, "
                   f"vocab {c.vocab_size}, {c.pos_emb} positions ({model.num_params() / 1e6:.2f}M parameters), "
                   f"{source}")


def time_generation(model, prompt, cfg, kv_cache, device, ctx):
    """Wall and CPU seconds to generate max_new_tokens after an untimed warm-up; and the tokens."""
    with torch.no_grad(), ctx:
        if cfg.warmup_tokens:
            for _ in model.generate_stream(prompt, cfg.warmup_tokens, kv_cache=kv_cache):
                pass
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = list(model.generate_stream(prompt, cfg.max_new_tokens, temperature=cfg.temperature,
                                            kv_cache=kv_cache, generator=generator))
        sync(device)
        return time.perf_counter() - t0, time.process_time() - c0, torch.cat(tokens, dim=1)


def bench_sample(argv):
    cfg = parse_config(SampleBenchConfig, argv, prog="bench.py sample")
    device = pick_device(cfg.device)
    threads = decode_threads(cfg.threads, device)  # the same choice as sample.py makes
    if threads:
        torch.set_num_threads(threads)
    dtype = pick_dtype(cfg.dtype, device)
    ctx = autocast(device, dtype)
    model, description = bench_model(cfg, device)
    prompt = torch.zeros((cfg.batch_size, 1), dtype=torch.long, device=device)
    print(f"model: {description}")
    print(f"machine: {device_name(device)}, torch {torch.__version__}")
    n = torch.get_num_threads()
    cpu_threads = f", {n} CPU thread{'s' if n > 1 else ''}" if device == "cpu" else ""
    print(f"device {device}{cpu_threads}, {dtype}, batch {cfg.batch_size}, {cfg.max_new_tokens} new tokens "
          "from a 1-token prompt", flush=True)
    results = {}
    for mode in cfg.mode_list():
        runs = [time_generation(model, prompt, cfg, mode == "cache", device, ctx) for _ in range(cfg.repeats)]
        seconds, cpu_seconds, tokens = min(runs, key=lambda run: run[0])
        results[mode] = (seconds, tokens)
        label = "with KV cache:" if mode == "cache" else "without cache:"
        rate = cfg.max_new_tokens * cfg.batch_size / seconds
        best = f"best of {cfg.repeats}, " if cfg.repeats > 1 else ""
        print(f"{label:<15} {rate:9.1f} tokens/s  ({best}{seconds:.2f} s wall, {cpu_seconds:.2f} s CPU)", flush=True)
    if len(results) == 2:
        (t_cache, a), (t_full, b) = results["cache"], results["nocache"]
        print(f"speedup: {t_full / t_cache:.1f}x")
        print(f"same tokens: {'yes' if torch.equal(a, b) else 'no (float rounding differs between the paths)'}")


# subcommand -> function taking the remaining arguments
COMMANDS = {
    "sample": bench_sample,
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    names = ", ".join(COMMANDS)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python bench.py {{{names}}} [--key=value ...]   (python bench.py NAME --help for options)")
        return
    if argv[0] not in COMMANDS:
        raise UserError(f"unknown benchmark {argv[0]!r}; choose one of: {names}")
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    run_main(main)
