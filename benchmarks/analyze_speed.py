"""`bench.py analyze`: what `analyze.py` spends on its two heavy answers, timed through gptkit.interp.experiments: every
head's ablation delta on a slice of val tokens, and an activation-patching heatmap of a prompt. The model is a
run's, or one of a config's shape with random weights: weights do not change the time, the shape does."""

import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.common import device_name
from gptkit.base.settings import parse_config, require
from gptkit.interp.experiments import ablation_deltas, open_run, patching
from gptkit.machine.precision import fast_dtype
from gptkit.machine.runtime import autocast, check_device_name, pick_device
from gptkit.training.train_config import TrainConfig
from model import GPT


@dataclass
class AnalyzeBenchConfig:
    out_dir: str = ""  # a run whose model is timed ('' = config's shape, random weights)
    config: str = "config/shakespeare_char.py"  # the shape timed without out_dir, as configured (never shrunk)
    vocab_size: int = 65  # its vocabulary without out_dir (tinyshakespeare's characters)
    tokens: int = 65_536  # tokens the ablation deltas are measured on, in block_size windows
    prompt_tokens: int = 64  # the patched prompts' length
    ablation: str = "zero"  # 'zero' or 'mean' (one more pass, for the means)
    rounds: int = 3  # timed rounds of each; the median counts
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'

    def __post_init__(self):
        require(self, ["tokens", "prompt_tokens", "rounds", "vocab_size"], lambda v: v >= 1, "at least 1")
        require(self, ["ablation"], lambda v: v in ("zero", "mean"), "'zero' or 'mean'")
        check_device_name(self.device)


def bench_model(cfg, device):
    """The model timed: the run's, or a fresh one of the config's model settings (its time-budget shrinking, which
    train.py decides as it starts, never applies here)."""
    if cfg.out_dir:
        return open_run(cfg.out_dir, device=device).model
    model_config = parse_config(TrainConfig, [cfg.config, "--min_tokens_per_param=0"], prog="train.py").model
    model_config.vocab_size = cfg.vocab_size
    torch.manual_seed(0)
    return GPT(model_config).to(device).eval()


def median_seconds(work, rounds):
    """The median and the fastest of `rounds` timings of work()."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def main(argv):
    """Seconds for every head's ablation delta, in float32 and, where the device has fast bf16 matmuls, in bfloat16
    as analyze.py takes them there; and for one patching heatmap (float32, as analyze.py patches). Each the median
    of a few rounds."""
    cfg = parse_config(AnalyzeBenchConfig, argv, prog="bench.py analyze")
    device = pick_device(cfg.device)
    model = bench_model(cfg, device)
    c = model.config
    generator = torch.Generator().manual_seed(0)
    T = min(c.block_size, cfg.tokens)
    windows = max(1, cfg.tokens // T)
    xy = torch.randint(c.vocab_size, (windows, T + 1), generator=generator).to(device)
    prompt_T = min(cfg.prompt_tokens, c.block_size)
    clean, corrupt = torch.randint(c.vocab_size, (2, 1, prompt_T), generator=generator).to(device)
    print(f"machine: {device_name(device)}, torch {torch.__version__}, {torch.get_num_threads()} threads; model "
          f"{c.n_layer} layers x {c.n_head} heads x {c.n_embd} wide, block_size {c.block_size}, vocabulary "
          f"{c.vocab_size}, {'from ' + cfg.out_dir if cfg.out_dir else 'random weights'}", flush=True)
    for dtype in dict.fromkeys(["float32", fast_dtype(device)]):
        with autocast(device, dtype):
            ablation_deltas(model, xy[:1, :-1], xy[:1, 1:], cfg.ablation)  # warm-up: first calls allocate
            median, best = median_seconds(lambda: ablation_deltas(model, xy[:, :-1], xy[:, 1:], cfg.ablation),
                                          cfg.rounds)
        print(f"every head's {cfg.ablation}-ablation delta ({c.n_layer * c.n_head} heads) on {windows * T:,} tokens, "
              f"{dtype}: {median:.2f} s (median of {cfg.rounds}; fastest {best:.2f} s)", flush=True)
    patching(model, clean, corrupt)
    median, best = median_seconds(lambda: patching(model, clean, corrupt), cfg.rounds)
    print(f"patching heatmap of a {prompt_T}-token prompt ({c.n_layer} x {prompt_T} residual cells, "
          f"{c.n_layer * c.n_head} heads), float32: {median:.3f} s (median of {cfg.rounds}; fastest {best:.3f} s)")
