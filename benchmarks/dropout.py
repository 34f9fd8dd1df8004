"""`bench.py dropout`: the share of a config's training steps that dropout costs, the step taken as train.py
takes it, without dropout and with it, in alternating rounds in one process."""

import statistics
from dataclasses import dataclass

import torch

from benchmarks.common import device_name, seconds_per_step, training_step
from gptkit.base.settings import parse_config, require
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.training.train_config import TrainConfig


@dataclass
class DropoutBenchConfig:
    config: str = "config/shakespeare_char.py"  # whose model, batch, optimizer, precision and compile setting to time
    dropout: float = 0.1  # the rate timed against no dropout
    rounds: int = 16  # rounds of each, alternating; the median round counts
    steps: int = 6  # timed optimizer steps per round
    warmup: int = 3  # untimed steps of each first (compilation happens here)
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'

    def __post_init__(self):
        require(self, ["rounds", "steps"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup"], lambda v: v >= 0, "at least 0")
        require(self, ["dropout"], lambda v: 0 < v < 1, "above 0 and below 1")
        check_device_name(self.device)


def main(argv):
    """The share of the steps dropout costs: the config's training step without dropout and with it, in
    alternating rounds in one process, so that a machine whose speed drifts slows both alike."""
    cfg = parse_config(DropoutBenchConfig, argv, prog="bench.py dropout")
    device = pick_device(cfg.device)
    steps, seconds = {}, {}
    for p in (0.0, cfg.dropout):
        step, _, dtype, path = training_step(parse_config(TrainConfig, [cfg.config, f"--dropout={p}"]), device)
        for _ in range(cfg.warmup):
            step()
        steps[p], seconds[p] = step, []
        if p and path == "fused" and device == "cpu":
            path = "folded (SDPA's fused CPU kernel takes no dropout)"
        print(f"dropout {p}: {dtype}, attention path {path}", flush=True)
    print(f"machine: {device_name(device)}, torch {torch.__version__}; {cfg.config}, {cfg.rounds} rounds of "
          f"{cfg.steps} steps each")
    for _ in range(cfg.rounds):
        for p, step in steps.items():
            seconds[p].append(seconds_per_step(step, cfg.steps, device))
    print_dropout_table(seconds, cfg.dropout)


def print_dropout_table(seconds, dropout):
    """Each rate's median-round step and the range of its rounds, then the share of the steps dropout costs."""
    median = {p: statistics.median(s) for p, s in seconds.items()}
    for p, s in seconds.items():
        print(f"dropout {p:<4} {1000 * median[p]:7.1f} ms a step (median round; rounds "
              f"{1000 * min(s):.0f}-{1000 * max(s):.0f} ms)")
    print(f"dropout {dropout} costs {1 - median[0.0] / median[dropout]:.1%} of the steps")
