"""`bench.py throughput`: training tokens/s on one shape, fp32 AdamW GPT-2 (the baseline, as nanoGPT runs it)
against a config's settings, each step taken as train.py takes it, each as a share of the matmul peak measured
here for the precision it trains in."""

import statistics
from dataclasses import dataclass, replace

import torch

from benchmarks.common import device_name, seconds_per_step, training_step
from gptkit.base.settings import parse_config, require
from gptkit.machine.flops import peak_flops
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.machine.timing import matmul_peak
from gptkit.training.train_config import TrainConfig
from model import GPTConfig


@dataclass
class ThroughputBenchConfig:
    config: str = "config/shakespeare_char.py"  # whose dtype, optimizer, architecture and compile setting to time
    n_layer: int = 6  # the timed shape: nanoGPT's baby GPT
    n_head: int = 6  # attention heads
    n_embd: int = 384  # width
    block_size: int = 256  # context length
    batch_size: int = 64  # sequences per step (nanoGPT: 64 x 256 = 16,384 tokens)
    vocab_size: int = 65  # the random tokens' vocabulary: tinyshakespeare's characters, or GPT-2's 50304
    steps: int = 10  # timed optimizer steps of each, shared among the rounds
    rounds: int = 5  # rounds of each candidate and of the matmul peak, alternating; the median round counts
    warmup: int = 2  # untimed steps first (compilation happens here)
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    compiled: bool = True  # also time the config's settings compiled, when the config itself runs eagerly

    def __post_init__(self):
        require(self, ["n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size", "steps", "rounds"],
                lambda v: v >= 1, "at least 1")
        require(self, ["warmup"], lambda v: v >= 0, "at least 0")
        check_device_name(self.device)
        GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size)


def main(argv):
    """Training tokens/s on one shape: fp32 AdamW GPT-2 (the baseline) against a config's settings,
    and against them compiled when the config itself runs eagerly; each as a share of the matmul peak
    measured here for the precision it trains in. The steps and the peaks are timed in alternating rounds in
    one process and the median round counts, so that a machine whose speed drifts slows each of them alike."""
    cfg = parse_config(ThroughputBenchConfig, argv, prog="bench.py throughput")
    device = pick_device(cfg.device)
    candidates = throughput_candidates(cfg)
    print(f"machine: {device_name(device)}, torch {torch.__version__}", flush=True)
    taken = {}
    for name, tcfg in candidates.items():
        step, model, dtype, path = training_step(tcfg, device, cfg.vocab_size)
        for _ in range(cfg.warmup):
            step()
        taken[name] = step, model.flops_per_token(tcfg.model.block_size), dtype, path
    rounds = timed_rounds(taken, cfg, device)
    print_throughput_table(candidates, taken, rounds, cfg.batch_size * cfg.block_size, device)


def throughput_candidates(cfg):
    """{name: the TrainConfig timed}: the baseline, the config, and the config compiled where it runs eagerly,
    all on cfg's shape without dropout."""
    shape = [f"--{k}={getattr(cfg, k)}" for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size")]
    baseline = [*shape, "--dtype=float32", "--dropout=0.0", "--attention_path=fused"]  # as nanoGPT runs
    candidates = {"fp32 AdamW GPT-2": parse_config(TrainConfig, baseline),
                  cfg.config: parse_config(TrainConfig, [cfg.config, *shape, "--dropout=0.0"])}
    if cfg.compiled and not candidates[cfg.config].compile:
        candidates[f"{cfg.config}, compiled"] = replace(candidates[cfg.config], compile=True)
    return candidates


def timed_rounds(taken, cfg, device):
    """[(seconds a step took, the matmul peak of its precision timed just before)] of each candidate, one of each
    a round, in cfg.rounds rounds sharing cfg.steps timed steps per candidate (at least one a round): on a
    machine whose speed moves from minute to minute, a step's share of the peak is the share of that moment's."""
    rounds, per_round = {name: [] for name in taken}, max(1, cfg.steps // cfg.rounds)
    print(f"{cfg.rounds} rounds of {per_round} step{'s' * (per_round > 1)} each, alternating", flush=True)
    for _ in range(cfg.rounds):
        for name, (step, _, dtype, _) in taken.items():
            peak = matmul_peak(dtype, device)
            rounds[name].append((seconds_per_step(step, per_round, device), peak))
    return rounds


def print_throughput_table(candidates, taken, rounds, tokens, device):
    """Each candidate's median-round tokens/s, GFLOP/s and share of its precision's peak, then each one's
    throughput against the first (the baseline)."""
    rates = {}
    for name, (_, token_flops, dtype, path) in taken.items():
        rates[name] = statistics.median(tokens / s for s, _ in rounds[name])
        share = statistics.median(tokens / s * token_flops / peak for s, peak in rounds[name])
        peaks = sorted(peak / 1e9 for _, peak in rounds[name])
        print(f"{name:<36} {dtype:>9} {candidates[name].optimizer:>6} compile={candidates[name].compile!s:<5} "
              f"attention={path:<7} {rates[name]:8,.0f} tokens/s {rates[name] * token_flops / 1e9:7.1f} GFLOP/s = "
              f"{100 * share:3.0f}% of the {dtype} matmul peak measured here (median round; peaks "
              f"{peaks[0]:.0f}-{peaks[-1]:.0f} GFLOP/s){datasheet_mfu(rates[name] * token_flops, device, dtype)}")
    base, *others = rates
    for name in others:
        print(f"throughput ratio, {name}: {rates[name] / rates[base]:.2f}x")


def datasheet_mfu(flops, device, dtype):
    """', N% MFU' against the device's datasheet peak for dtype (TF32's for float32), or '' where none is known."""
    peak = peak_flops(device, dtype)
    return f", {100 * flops / peak:.1f}% MFU of the datasheet's {peak / 1e12:.0f} TFLOP/s" if peak else ""
