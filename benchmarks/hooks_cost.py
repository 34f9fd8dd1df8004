"""`bench.py hooks`: what model.py's idle hook points cost, on a config's training step (taken as train.py takes it)
and on cached decoding, against the same model with every hook point a bare `return x`, in alternating rounds."""

import collections
import math
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from benchmarks.common import device_name, seconds_per_step, training_step
from gptkit.base.settings import parse_config, require
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.sampling.decoding import generate_stream
from gptkit.training.train_config import TrainConfig
from model import HookPoint


@dataclass
class HooksBenchConfig:
    config: str = "config/shakespeare_char.py"  # whose model, batch, precision and kernels to time
    rounds: int = 40  # rounds of each, alternating (short and many: a slow minute of the machine hits both); median
    steps: int = 1  # timed optimizer steps per round
    tokens: int = 50  # tokens decoded (one at a time, with the KV cache) per round
    warmup: int = 2  # untimed steps and decodes of each first
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'

    def __post_init__(self):
        require(self, ["rounds", "steps", "tokens"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup"], lambda v: v >= 0, "at least 0")
        check_device_name(self.device)


@contextmanager
def bare_hook_points():
    """Every HookPoint a plain `return x`, without even the check for a hook: the least a hook point can cost."""
    call = HookPoint.__call__
    HookPoint.__call__ = lambda self, x: x
    try:
        yield
    finally:
        HookPoint.__call__ = call


def main(argv):
    """Seconds per training step and per decoded token, the hook points idle as shipped and bare, in turns."""
    cfg = parse_config(HooksBenchConfig, argv, prog="bench.py hooks")
    device = pick_device(cfg.device)
    step, model, dtype, _ = training_step(parse_config(TrainConfig, [cfg.config]), device)
    prompt = torch.zeros((1, 1), dtype=torch.long, device=device)

    def decode():
        model.eval()
        collections.deque(generate_stream(model, prompt, cfg.tokens), maxlen=0)
        model.train()

    points = sum(isinstance(m, HookPoint) for m in model.modules())
    print(f"machine: {device_name(device)}, torch {torch.__version__}; {cfg.config} in {dtype}, {points} hook points "
          f"a pass; {cfg.rounds} rounds of {cfg.steps} steps and {cfg.tokens} decoded tokens each", flush=True)
    # (what is timed, how many calls a round, how many units each call does)
    work = {"training step": (step, cfg.steps, 1), "decoded token": (decode, 1, cfg.tokens)}
    seconds = {(what, bare): [] for what in work for bare in (False, True)}
    for _ in range(cfg.warmup):
        step(), decode()
    for r in range(cfg.rounds):
        for what, (run, calls, units) in work.items():
            for bare in (r % 2 == 1, r % 2 == 0):  # who goes first alternates: the first after other work is slower
                with bare_hook_points() if bare else nullcontext():
                    seconds[what, bare].append(seconds_per_step(run, calls, device) / units)
    print_hooks_table(seconds)
    print_call_cost(points, seconds)


def call_cost(runs=200_000):
    """Seconds one idle HookPoint call takes beyond a bare function's, timed over many calls: what the fast path
    leaves of nn.Module's call machinery."""
    point, x = HookPoint(), torch.zeros(1)

    def bare(x):
        return x

    timings = {}
    for name, call in [("idle", point), ("bare", bare), ("idle", point), ("bare", bare)]:
        start = time.perf_counter()
        for _ in range(runs):
            call(x)
        timings[name] = min(timings.get(name, math.inf), (time.perf_counter() - start) / runs)
    return max(0.0, timings["idle"] - timings["bare"])


def print_call_cost(points, seconds):
    """The idle hook points' own cost, from one call's, against a step and a decoded token."""
    extra = call_cost()
    step = statistics.median(seconds["training step", False])
    token = statistics.median(seconds["decoded token", False])
    print(f"an idle hook point costs {extra * 1e6:.2f} us a call more than a bare function; {points} a pass: "
          f"{100 * points * extra / step:.3f}% of a training step's forward, {100 * points * extra / token:.2f}% of "
          "a decoded token")


def print_hooks_table(seconds):
    """Each kind of work's median round, idle hook points against bare ones, and the cost of idle ones."""
    for what in dict.fromkeys(what for what, _ in seconds):
        idle, bare = (statistics.median(seconds[what, b]) for b in (False, True))
        print(f"{what:<14} hook points idle {1e3 * idle:8.3f} ms, bare {1e3 * bare:8.3f} ms: idle ones cost "
              f"{idle / bare - 1:+.1%}")
