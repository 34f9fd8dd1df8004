"""The induction lesson's measurements, on a run trained on random strings each written twice (data/prepare.py
--synthetic=repeats): the loss on the first and on the second copy of fresh pairs, what switching heads off does
to each, and the lesson's targets read from the run's timeline."""

import math

import torch

from gptkit.interp.experiments import open_run, token_losses
from gptkit.interp.timeline import phase_change, timeline_of

INDUCTION_AT_LEAST = 0.3  # the layer-1 heads ablated as induction heads: their score at least this
PROBE_SEED = 12345  # the fresh pairs the copy losses read: not the training data's (seed 0)


def copy_windows(tok, block_size, windows=256, seed=PROBE_SEED):
    """Fresh pairs of the repeats corpus's kind (gptkit/data/synthetic.py: random strings, each written twice, one
    pair after another), in windows: (idx, targets, first, second), (B, T) each; first and second mark the
    targets inside each copy of a pair that starts inside the window, the copy's first letter left out (nothing
    before it says what it is)."""
    from gptkit.data.synthetic import repeats_strings

    text, role, start = [], [], []
    for s in repeats_strings(count=2 ** 62, seed=seed):
        if len(text) > windows * block_size:
            break
        n = len(s)
        start += [len(text)] * (2 * n)
        text += [*s, *s]
        role += [0] + [1] * (n - 1) + [0] + [2] * (n - 1)
    ids, role, start = torch.tensor(tok.encode("".join(text))), torch.tensor(role), torch.tensor(start)
    span = windows * block_size
    idx, targets = ids[:span].view(windows, -1), ids[1:span + 1].view(windows, -1)
    role, start = role[1:span + 1].view(windows, -1), start[1:span + 1].view(windows, -1)
    inside = start >= (torch.arange(windows) * block_size)[:, None]
    return idx, targets, (role == 1) & inside, (role == 2) & inside


@torch.no_grad()
def copy_losses(model, windows):
    """(mean loss on the first copies, on the second copies) over the windows of copy_windows."""
    device = next(model.parameters()).device
    idx, targets, first, second = (t.to(device) for t in windows)
    losses = token_losses(model(idx, targets)[0], targets)
    return losses[first].mean().item(), losses[second].mean().item()


def induction_report(out_dir):
    """The lesson's targets on the run in out_dir, each a line: measured, target, met or not."""
    from gptkit.run.metrics import read_metrics

    run = open_run(out_dir)
    windows = copy_windows(run.tok, run.config.block_size)
    timeline = [t for t in timeline_of(read_metrics(out_dir)) if t.get("heads")]
    phase = phase_change(timeline)
    first, last = timeline[0]["heads"]["induction"], timeline[-1]["heads"]["induction"]
    steps = timeline[-1]["iter"]
    clean = copy_losses(run.model, windows)
    heads = [(1, h) for h, s in enumerate(last[1]) if s >= INDUCTION_AT_LEAST]
    with run.ablated(heads=heads or None):
        off = copy_losses(run.model, windows)
    located = phase["induction_iter"] is not None  # phase_change's rule: where no induction head formed, none is
    apart = abs(phase["induction_iter"] - phase["icl_iter"]) if located else steps
    rows = [("best layer-1 induction score at the end", max(last[1]), ">= 0.5", max(last[1]) >= 0.5),
            ("best layer-1 induction score at the first record", max(first[1]), "<= 0.1", max(first[1]) <= 0.1),
            ("highest layer-0 induction score at the end", max(last[0]), "<= 0.15", max(last[0]) <= 0.15),
            ("loss on the second copies (nats)", clean[1], "<= 0.5", clean[1] <= 0.5),
            (f"loss on the first copies (ln 26 = {math.log(26):.2f})", clean[0], "near ln 26", True),
            (f"ablating {', '.join(f'L{l}H{h}' for l, h in heads) or 'no head'}: second copies' loss",
             off[1] - clean[1], ">= +1", off[1] - clean[1] >= 1),
            ("... and the first copies'", off[0] - clean[0], "<= a quarter of the above",
             abs(off[0] - clean[0]) * 4 <= off[1] - clean[1]),
            (f"phase change: induction at step {phase['induction_iter']}, in-context score at {phase['icl_iter']}"
             if located else "phase change: none located, no induction head formed", apart / max(1, steps),
             "<= 0.10 of the steps", located and apart <= 0.1 * steps)]
    return [f"{name:<72} {value:>+8.3f}  {target:<26} {'met' if met else 'NOT met'}" for name, value, target, met
            in rows]
