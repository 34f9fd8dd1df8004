"""Timing on this machine: candidates timed in turns, so that a passing spike is passed over; the matmul peak
that utilisation figures are measured against; decoding's speed. A run's start-up choices, timed once per
machine, are made in gptkit/machine/choices.py."""

import collections
import functools
import math
import time

import torch

from gptkit.sampling.decoding import generate_stream


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


@functools.cache
def matmul_peak(dtype, device="cpu", size=0, repeats=5):
    """FLOP/s of the fastest of a few size x size matmuls in dtype on device: the most a training step's
    matmuls can reach here, measured rather than read off a datasheet. Size 0: 2048 on a CPU, 8192 on a GPU,
    where a 2048 product is over in tens of microseconds and reads far under the chip's rate."""
    size = size or (8192 if device.startswith("cuda") else 2048)
    a = torch.randn(size, size, device=device).to(getattr(torch, dtype))
    return 2 * size ** 3 / fastest_seconds(lambda: a @ a, repeats, device)


def decode_seconds(model, batch_size, tokens, repeats=3, to_beat=math.inf):
    """The fastest of a few timings of decoding `tokens` tokens, after an untimed one; none more once one took
    `to_beat` seconds or longer, where it has lost already (beside busy programs, a timing on too many threads
    stalls for many times the work it times)."""
    device = next(model.parameters()).device
    prompt = torch.zeros((batch_size, 1), dtype=torch.long, device=device)

    def run():
        collections.deque(generate_stream(model, prompt, tokens), maxlen=0)

    run()
    best = math.inf
    for _ in range(repeats):
        best = min(best, seconds_of(run, device.type))
        if best >= to_beat:
            break
    return best


