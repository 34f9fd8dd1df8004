"""Timing on this machine: candidates timed in turns, the matmul peak that utilisation figures are measured
against, the precision and thread count for decoding (each timed on the model itself in milliseconds), and the
threads a training run keeps adjusting as it goes (ThreadTuner). A training run's start-up choices are made in
gptkit/machine/choices.py."""

import collections
import contextlib
import copy
import functools
import math
import statistics
import sys
import time

import torch

from gptkit.sampling.decoding import generate_stream
from gptkit.base.errors import UserError


def synchronize(device):
    """Wait for the device's queued work, so that a clock read afterwards has seen it finish."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fastest_seconds(run, repeats, device="cpu"):
    """The fastest of `repeats` timings of run(), after one untimed call that pays for kernel selection."""
    return fastest_in_turns({None: run}, repeats, device)[None]


def fastest_in_turns(runs, repeats, device="cpu", slow=math.inf, settled=None, deadline=None):
    """{name: the fastest of `repeats` timings of runs[name]()}, after one untimed call of each (where one of
    those took over `slow` seconds, two timings each will do; where settled(the fastest so far) says, after two
    turns, that what they are timed for is decided already, no more turns). The runs take turns, so that a machine
    whose speed moves while they are timed (a shared virtual machine's does, from minute to minute:
    docs/speed.md#machines) slows each of them alike rather than the ones timed last; and each keeps its fastest
    turn, so that a passing spike, which slows one turn of one run, is passed over, even where it would seem to
    decide the matter in the first turn. Past `deadline` (a time.perf_counter() reading), no turn after the first
    timed one begins."""
    if max(seconds_of(run, device) for run in runs.values()) > slow:
        repeats = min(repeats, 2)
    best = dict.fromkeys(runs, math.inf)
    for turn in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], seconds_of(run, device))
        if turn and settled is not None and settled(best):
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
    return best


def seconds_of(run, device):
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - start


def cpu_has_bf16():
    """AVX-512 BF16 or AMX in the CPU flags: bf16 matmul instructions exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.cache
def matmul_peak(dtype, device="cpu", size=0, repeats=5):
    """FLOP/s of the fastest of a few size x size matmuls in dtype on device: the most a training step's
    matmuls can reach here, measured rather than read off a datasheet. Size 0: 2048 on a CPU, 8192 on a GPU,
    where a 2048 product is over in tens of microseconds and reads far under the chip's rate."""
    size = size or (8192 if device.startswith("cuda") else 2048)
    a = torch.randn(size, size, device=device).to(getattr(torch, dtype))
    return 2 * size ** 3 / fastest_seconds(lambda: a @ a, repeats, device)


def pick_dtype(name, device):
    """The training precision: as asked, or for 'auto' bf16 on a GPU that has it, else fp32 (on a CPU with bf16
    instructions, training then times its own step in each: pick_training_dtype)."""
    if name != "auto":
        if name == "float16" and device == "cpu":
            raise UserError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def autocast_for(dtype, device_type="cpu"):
    """Mixed precision: weights stay fp32, matmuls run in dtype."""
    return contextlib.nullcontext() if dtype == "float32" else torch.autocast(device_type, getattr(torch, dtype))


def decode_seconds(model, batch_size, tokens, repeats=3):
    """The fastest of a few timings of decoding `tokens` tokens."""
    prompt = torch.zeros((batch_size, 1), dtype=torch.long, device=next(model.parameters()).device)
    return fastest_seconds(lambda: collections.deque(generate_stream(model, prompt, tokens), maxlen=0), repeats)


def pick_decode_dtype(name, model, device, batch_size=1, tokens=16):
    """The weights' precision for decoding: as asked, or for 'auto' the faster of float32 and bfloat16 on
    this machine (bfloat16 reads half the bytes per token, but some CPUs compute it slowly), timed on a
    few tokens of this model; and a line saying why. bfloat16 must win clearly, so the choice does not flip
    with a machine's noise and one seed keeps giving one text."""
    if name != "auto":
        return pick_dtype(name, device), f"decoding in {name}"
    if device.startswith("cuda"):
        return ("bfloat16" if torch.cuda.is_bf16_supported() else "float16"), "decoding in half precision on CUDA"
    if device != "cpu" or not cpu_has_bf16():
        return "float32", "decoding in float32"
    seconds = {dtype: decode_seconds(copy.deepcopy(model).to(getattr(torch, dtype)), batch_size, tokens)
               for dtype in ("float32", "bfloat16")}
    best = "bfloat16" if seconds["bfloat16"] * 1.25 < seconds["float32"] else "float32"
    return best, (f"decoding in {best} (bfloat16 was {seconds['float32'] / seconds['bfloat16']:.2f}x as fast as "
                  "float32 on this model)")


def pick_decode_threads(threads, model, device, batch_size=1, tokens=16):
    """CPU threads for decoding, set here: as asked, or for 0 the faster of 1 and torch's default on this
    model, now; and a line saying why. Decoding runs many small operations, each of which waits for all its
    threads: when another process holds a core, every step stalls. So more than one thread must win clearly."""
    if threads:
        torch.set_num_threads(threads)
        return threads, f"decoding on {threads} thread{'s' if threads > 1 else ''}, as asked"
    most = torch.get_num_threads()
    if device != "cpu" or most == 1:
        return most, ""
    seconds = {}
    for n in (1, most):
        torch.set_num_threads(n)
        seconds[n] = decode_seconds(model, batch_size, tokens)
    best = most if seconds[most] * 1.3 < seconds[1] else 1
    torch.set_num_threads(best)
    return best, (f"decoding on {best} thread{'s' if best > 1 else ''} ({most} threads were "
                  f"{seconds[1] / seconds[most]:.2f}x as fast as 1 on this model)")


class ThreadTuner:
    """CPU threads for training, measured as the run goes: each small op waits for all its threads, so when
    another process holds a core, two threads stall each other at every step while one runs on. `first` seconds
    in, a few steps run on the other thread count, and it is kept when its steps are faster by more than
    `margin`. Trials cost steps, so while they keep the count the wait for the next one doubles from `every` (up
    to `longest` on the most threads, to twice `every` on one, where a core freed again would go unseen); and a
    trial comes at once when the current count's steps slow down or speed up by more than `drift` from what the
    last trial measured: another process came or went. after_step() returns a line saying so when it changes
    the count, else None. It starts on `start` threads, the count start-up chose (gptkit.machine.choices)."""

    def __init__(self, most, start=None, every=15.0, first=15.0, trial_steps=4, margin=1.1, longest=120.0,
                 drift=1.25, clock=time.perf_counter):
        self.most, self.current = most, start or most
        self.other = 1 if self.current == most else most
        self.every, self.longest, self.wait = every, longest, every
        self.trial_steps, self.margin, self.drift, self.clock = trial_steps, margin, drift, clock
        self.recent = []  # the latest steps' seconds on the current count
        self.trial = None  # steps' seconds on the other count, while a trial runs
        self.measured = None  # the current count's median step at the last trial
        self.last_trial = clock() - every + first
        torch.set_num_threads(self.current)

    def after_step(self, seconds, iteration):
        if self.trial is None:
            self.recent = (self.recent + [seconds])[-self.trial_steps:]
            if len(self.recent) == self.trial_steps and (self.drifted() or self.clock() - self.last_trial >= self.wait):
                self.trial = []
                torch.set_num_threads(self.other)
            return None
        self.trial.append(seconds)
        if len(self.trial) <= self.trial_steps:  # the first step after a switch pays for it: not counted
            return None
        mine, theirs = statistics.median(self.recent), statistics.median(self.trial[1:])
        self.trial, self.recent, self.last_trial = None, [], self.clock()
        if mine <= theirs * self.margin:
            self.measured = mine
            self.wait = min(2 * self.wait, self.longest if self.current == self.most else 2 * self.every)
            torch.set_num_threads(self.current)
            return None
        old, (self.current, self.other) = self.current, (self.other, self.current)
        self.measured, self.wait = theirs, self.every
        torch.set_num_threads(self.current)
        return (f"threads: {self.current} from iteration {iteration} (its steps took {theirs * 1e3:.0f} ms, on "
                f"{old} thread{'s' if old > 1 else ''} {mine * 1e3:.0f} ms)")

    def drifted(self):
        """Every one of the latest steps on the current count is slower or faster by more than `drift` than the
        last trial measured (one slow step is noise): try again now, and soon after."""
        if self.measured is None:
            return False
        slower, faster = min(self.recent) > self.measured * self.drift, max(self.recent) < self.measured / self.drift
        if not (slower or faster):
            return False
        self.wait = self.every
        return True
