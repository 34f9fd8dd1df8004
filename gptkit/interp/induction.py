"""The induction lesson's measurements, on a run trained on lines each written twice (data/prepare.py
--synthetic=repeats): the loss on the first and on the second copy of each line, what switching heads off does to
each, and the lesson's targets read from the run's timeline."""

import math

import torch

from gptkit.interp.experiments import open_run, token_losses
from gptkit.interp.timeline import phase_change, timeline_of

INDUCTION_AT_LEAST = 0.3  # the layer-1 heads ablated as induction heads: their score at least this


def doubled_lines(tokens, newline, block_size, max_windows=256):
    """Windows of whole lines from a token stream of lines each written twice (s s, then a newline): (idx, targets,
    first, second), (B, T) each; first and second mark the targets inside each copy, the copy's first letter left
    out (nothing before it says what it is)."""
    rows, firsts, seconds, free_from = [], [], [], 0
    for begin in ((tokens == newline).nonzero().flatten() + 1).tolist():  # each line's start, windows apart
        window = tokens[begin:begin + block_size + 1]
        if len(window) < block_size + 1 or len(rows) == max_windows:
            break
        if begin < free_from:
            continue
        first, second = torch.zeros(block_size, dtype=torch.bool), torch.zeros(block_size, dtype=torch.bool)
        line_start = 0
        for line_end in (window == newline).nonzero().flatten().tolist():
            half = (line_end - line_start) // 2
            if half > 1 and torch.equal(window[line_start:line_start + half], window[line_start + half:line_end]):
                first[line_start:line_start + half - 1] = True  # target i is the window's token i + 1
                second[line_start + half:line_start + 2 * half - 1] = True
            line_start = line_end + 1
        rows.append(window)
        firsts.append(first)
        seconds.append(second)
        free_from = begin + block_size
    xy = torch.stack(rows)
    return xy[:, :-1], xy[:, 1:], torch.stack(firsts), torch.stack(seconds)


@torch.no_grad()
def copy_losses(model, windows):
    """(mean loss on the first copies, on the second copies) over the windows of doubled_lines."""
    idx, targets, first, second = windows
    losses = token_losses(model(idx, targets)[0], targets)
    return losses[first].mean().item(), losses[second].mean().item()


def val_tokens(run):
    from gptkit.data.dataset import Split, load_meta

    folder, meta = load_meta(run.trained_on.get("data_dir", ""), run.trained_on.get("dataset", "repeats"))
    split = Split(folder, "val", meta, run.config.block_size)
    return torch.from_numpy(split.shards[0].tokens()[:split.length].astype("int64"))


def induction_report(out_dir):
    """The lesson's targets on the run in out_dir, each a line: measured, target, met or not."""
    from gptkit.run.metrics import read_metrics

    run = open_run(out_dir)
    windows = doubled_lines(val_tokens(run), run.tok.encode("\n")[0], run.config.block_size)
    timeline = [t for t in timeline_of(read_metrics(out_dir)) if t.get("heads")]
    first, last = timeline[0]["heads"]["induction"], timeline[-1]["heads"]["induction"]
    steps = timeline[-1]["iter"]
    clean = copy_losses(run.model, windows)
    heads = [(1, h) for h, s in enumerate(last[1]) if s >= INDUCTION_AT_LEAST]
    with run.ablated(heads=heads or None):
        off = copy_losses(run.model, windows)
    phase = phase_change(timeline_of(read_metrics(out_dir)))
    apart = abs(phase["induction_iter"] - phase["icl_iter"])
    rows = [("best layer-1 induction score at the end", max(last[1]), ">= 0.5", max(last[1]) >= 0.5),
            ("best layer-1 induction score at the first record", max(first[1]), "<= 0.1", max(first[1]) <= 0.1),
            ("highest layer-0 induction score at the end", max(last[0]), "<= 0.15", max(last[0]) <= 0.15),
            ("loss on the second copies (nats)", clean[1], "<= 0.5", clean[1] <= 0.5),
            (f"loss on the first copies (ln 26 = {math.log(26):.2f})", clean[0], "near ln 26", True),
            (f"ablating {', '.join(f'L{l}H{h}' for l, h in heads) or 'no head'}: second copies' loss",
             off[1] - clean[1], ">= +1", off[1] - clean[1] >= 1),
            ("... and the first copies'", off[0] - clean[0], "<= a quarter of the above",
             abs(off[0] - clean[0]) * 4 <= off[1] - clean[1]),
            (f"phase change: induction at step {phase['induction_iter']}, in-context score at {phase['icl_iter']}",
             apart / max(1, steps), "<= 0.10 of the steps", apart <= 0.1 * steps)]
    return [f"{name:<72} {value:>+8.3f}  {target:<26} {'met' if met else 'NOT met'}" for name, value, target, met
            in rows]
