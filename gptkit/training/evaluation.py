"""Evaluation: the loss on fixed windows of each split at every evaluation, and on the whole val split at the end."""

import sys
import time
from contextlib import nullcontext

import torch

from gptkit.base.progress import progress as progress_bar
from gptkit.interp.hooks import first_nan


def eagerly():
    """Compiled blocks run eagerly inside: a second, inference-only graph would cost more compile time than it
    saves. Where torch's compiler was never imported nothing is compiled, and importing it would cost start-up time."""
    return torch.compiler.set_stance("force_eager") if "torch._dynamo" in sys.modules else nullcontext()


def progress(total, what):
    """A progress bar with elapsed and remaining time for `total` batches of an evaluation, shown where the work
    lasts over a second (an evaluation of a few batches shows none); in a log file, plain lines."""
    return progress_bar(total=total, desc=what, unit="batch", leave=False, delay=1.0, file=sys.stdout,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")


def evaluate(model, data, autocast):
    """Mean loss per split over the fixed evaluation windows, and the fastest batch's seconds per token (what
    the final score will cost a token, as the budget plans it: the first batch is slowed by warming up)."""
    model.eval()
    device = str(next(model.parameters()).device)
    out, seconds_per_token = {}, []
    batches = sum(len(offsets) for offsets in data.eval_offsets.values())
    with torch.no_grad(), eagerly(), progress(batches, "evaluating") as bar:
        for name, split in data.splits.items():
            losses = []
            for offsets in data.eval_offsets[name]:
                x, y = split.batch(offsets, device)
                start = time.perf_counter()
                with autocast:
                    losses.append(model(x, y)[1].item())
                seconds_per_token.append((time.perf_counter() - start) / x.numel())
                bar.update(1)
            out[name] = sum(losses) / len(losses)
    model.train()
    return out, min(seconds_per_token)


def nan_from_the_start(model, split, value):
    """The line for a val loss of nan before any training step: the model computes it from its initial weights,
    which no learning rate or warmup changes; where a hook point first sees it, and a mask that hides every key a
    query may see (the notes' masked_fill(tril, -inf), where tril == 0 is meant) where that is what did it."""
    x, _ = split.batch(torch.zeros(1, dtype=torch.long), str(next(model.parameters()).device))
    found = first_nan(model, x)
    where = ""
    if found and found[1]:
        where = (f" (first at {found[0]}: a query whose every score is -inf, whose softmax is nan: does the mask hide "
                 "the keys each query may see, masked_fill(tril, ...) where masked_fill(tril == 0, ...) is meant?)")
    elif found:
        where = f" (first at {found[0]})"
    return (f"val loss is {value} at iteration 0, before any training step: model.py computes it from the initial "
            f"weights, which no learning rate changes{where}")


def evaluate_split(model, split, autocast, batch_size, max_tokens=0):
    """Mean loss over a split's first max_tokens targets (all of them when 0), read in consecutive
    block_size windows so that every target is scored exactly once: (loss, targets scored)."""
    T, n = split.block_size, split.length - 1
    n = min(n, max_tokens) if max_tokens > 0 else n
    offsets = list(range(0, n - T + 1, T))
    scored_before, tail = len(offsets) * T, n - len(offsets) * T
    if tail:  # one last window ending at target n (the first window, where n < T)
        offsets.append(max(0, n - T))
    device = str(next(model.parameters()).device)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad(), eagerly(), progress(-(-len(offsets) // batch_size), "scoring the val split") as bar:
        for i in range(0, len(offsets), batch_size):
            x, y = split.batch(torch.tensor(offsets[i:i + batch_size]), device)
            if tail and i + batch_size >= len(offsets):
                y, start = y.clone(), offsets[-1]
                # ignored by the loss: the targets another window scored, and those past n
                y[-1, :scored_before - start] = -1
                y[-1, n - start:] = -1
            with autocast:
                loss = model(x, y)[1].item()
            scored = int((y != -1).sum())
            total, count = total + loss * scored, count + scored
            bar.update(1)
    model.train()
    return total / count, count
