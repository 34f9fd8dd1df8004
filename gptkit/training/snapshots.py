"""A run's snapshots: its weights at a few of the steps it records, so that every tool can open the run as it
was then (--checkpoint=iter:N). Each record is a candidate; past `keep` of them, the one whose going leaves the
others most evenly spread goes: evenly on a log scale of steps (dense early, where a model changes most, as
Pythia's checkpoints) and evenly along the timeline's own movement (dense where its heads and losses change
fastest, as in a phase change), so the set stays spread however long the run turns out to be (a time budget
does not say its steps) and passes through the steps where the model changed."""

import math
from dataclasses import asdict

from gptkit.base.errors import UserError
from gptkit.machine.stand_ins import model_code
from gptkit.run.checkpoint import save_checkpoint


def crowded(kept, along=None):
    """Of the kept iterations, the one (never the first or the last) whose neighbours are nearest: the gap
    its going leaves, as a share of the whole on a log scale of steps, plus, where along ({iteration: how far
    the timeline has moved by then}, gptkit.interp.timeline.travelled) holds every kept one, as a share of the
    timeline's movement."""
    if len(kept) < 3:
        return 0
    scales = [[math.log1p(i) for i in kept]]
    if along is not None and all(i in along for i in kept) and along[kept[-1]] > along[kept[0]]:
        scales.append([along[i] for i in kept])

    def gap(j):
        return sum((s[j + 1] - s[j - 1]) / (s[-1] - s[0]) for s in scales)
    return min(range(1, len(kept) - 1), key=lambda j: (gap(j), kept[j]))


def take(state, run, keep, along=None):
    """Save the weights the evaluations score at state.iter_num as a snapshot, then thin the kept ones to
    `keep` (crowded, along the timeline where given). Rank 0 only."""
    save_checkpoint({"model": state.scored_weights(), "model_args": asdict(state.model.config),
                     "model_code": model_code(), "tokens": state.tokens, "config": asdict(state.cfg),
                     "tokenizer": state.tokenizer.to_meta(), "iter_num": state.iter_num}, run.snapshot(state.iter_num))
    kept = run.kept_snapshots()
    while len(kept) > keep:
        run.snapshot(kept.pop(crowded(kept, along))).unlink()


def drop_after(run, iteration):
    """Snapshots of steps past the state a run resumes from came from a run stopped after it: that run's later
    steps are trained again, and may be kept otherwise. Returns the names of those dropped."""
    dropped = [run.snapshot(i) for i in run.kept_snapshots() if i > iteration]
    for path in dropped:
        path.unlink()
    return [path.name for path in dropped]


def check_room(run, iteration, keep):
    """A run resumed at `iteration` with fewer snapshots to keep than it holds up to there would delete some at its
    next record: refused in one line, before any file changes (snapshots=0 takes none, and deletes none)."""
    kept = [i for i in run.kept_snapshots() if i <= iteration]
    if 0 < keep < len(kept):
        raise UserError(f"--snapshots={keep} is fewer than the {len(kept)} snapshots {run.path} keeps "
                        f"({', '.join(run.snapshot(i).name for i in kept)}): its next record would delete "
                        f"{len(kept) - keep} of them; give --snapshots={len(kept)} or more, or move those you can "
                        "spare out of its snapshots folder")
