"""A run's snapshots: its weights at a few steps spread evenly on a log scale (dense early, where a model changes
most, as Pythia's checkpoints), so that every tool can open the run as it was then (--checkpoint=iter:N). A step
the timeline records is a candidate; past `keep` of them, the one whose going leaves the most even spacing goes,
so the set stays log-spaced however long the run turns out to be (a time budget does not say its steps)."""

import math
from dataclasses import asdict

from gptkit.machine.stand_ins import model_code
from gptkit.run.checkpoint import save_checkpoint


def crowded(kept):
    """Of the kept iterations, the one (never the first or the last) whose neighbours are nearest on a log scale."""
    if len(kept) < 3:
        return 0
    logs = [math.log1p(i) for i in kept]
    return min(range(1, len(kept) - 1), key=lambda j: (logs[j + 1] - logs[j - 1], kept[j]))


def take(state, run, keep):
    """Save the weights the evaluations score at state.iter_num as a snapshot, then thin the kept ones to
    `keep`. Rank 0 only."""
    save_checkpoint({"model": state.scored_weights(), "model_args": asdict(state.model.config),
                     "model_code": model_code(), "config": asdict(state.cfg),
                     "tokenizer": state.tokenizer.to_meta(), "iter_num": state.iter_num}, run.snapshot(state.iter_num))
    kept = run.kept_snapshots()
    while len(kept) > keep:
        run.snapshot(kept.pop(crowded(kept))).unlink()


def drop_after(run, iteration):
    """Snapshots of steps past the state a run resumes from came from a run stopped after it: that run's later
    steps are trained again, and may be kept otherwise."""
    for i in run.kept_snapshots():
        if i > iteration:
            run.snapshot(i).unlink()
