"""A run's timeline: what its heads do, and how well it learns in context, as it trains. At each evaluation, and at
log-spaced steps before the first (1, 2, 4, ...: dense at the start, as Pythia's checkpoints), one record goes to
metrics.jsonl (kind 'timeline') where the run can afford it: gptkit/training/records.py's Pacing keeps
the records within a share of the run's time, and always takes its first and its last:

    heads: {kind: [[score]] a layer, a head}: analyze.py heads' scores (gptkit/interp/experiments.py), read as it
           reads them: the first SCORE_WINDOWS val windows and the repeated random sequences
    icl: the in-context learning score of Olsson et al. (2022): the loss at a late position minus the loss at an
         early one, their 500th and 50th tokens of 512 scaled to block_size, on fixed val windows
    loss_by_position: the mean loss in each of POSITION_BUCKETS equal spans of the window, on the same windows

and, read back (read_metrics leaves out a record that is not whole), whether a phase change happened and where: the
steps of the steepest rise of the strongest induction score, where that head formed, and of the steepest fall of the
in-context learning score (phase_change)."""

import math
from dataclasses import dataclass

import torch

from gptkit.base.modes import evaluating
from gptkit.interp.experiments import KINDS, induction_tokens, patterns, scores_of, token_losses
from gptkit.run.metrics import rl_run

SCORE_WINDOWS = 16  # val windows the previous-token, first-token and local scores read (as analyze.py heads)
# val windows the in-context learning score and the loss by position read, the first SCORE_WINDOWS of them in the
# same pass: 32 rather than 64 halves a record's cost, which a short run on a busy machine pays at its start and end
ICL_WINDOWS = 32
ICL_EARLY, ICL_LATE = 50 / 512, 500 / 512  # Olsson et al.'s 50th and 500th tokens, as shares of the context
POSITION_BUCKETS = 8
RECORD_AGAIN = "train it again to record one"  # what gives a run without a timeline one
FORMED_AT = 0.3  # a head has formed once its score of a kind reaches this (the lab's "step N", the phase change's)


def icl_positions(block_size):
    """The early and late positions (counted from 0) the in-context learning score compares."""
    early = max(0, round(block_size * ICL_EARLY) - 1)
    return early, max(early + 1, round(block_size * ICL_LATE) - 1)


def due(iter_num, eval_interval):
    """Whether a step is one of the log-spaced ones recorded before the first regular evaluation: a power of 2."""
    return 0 < iter_num < eval_interval and iter_num & (iter_num - 1) == 0


@dataclass
class Probe:
    """The fixed tokens every record of a run reads: val windows for the in-context learning score and the loss by
    position, the first SCORE_WINDOWS of them for the text scores; the repeated random sequences for the induction
    and duplicate-token scores."""

    windows: torch.Tensor
    targets: torch.Tensor
    repeated: torch.Tensor

    @classmethod
    def of(cls, model, val_split, vocab):
        """The probe for a model (its has_attention decides whether heads are scored) on a val split in windows of
        the model's block_size, and the tokenizer's vocabulary size."""
        T = val_split.block_size
        windows = max(1, min(ICL_WINDOWS, (val_split.length - 1) // T))
        device = str(next(model.parameters()).device)
        # every next token, a chat dataset's prompts too: what the model predicts along a window
        idx, targets = val_split.batch(torch.arange(windows) * T, device, masked=False)
        repeated = induction_tokens(model, vocab) if has_attention(model) else None
        return cls(idx, targets, repeated)


def has_attention(model):
    return model.config.n_layer > 0


@torch.no_grad()
def record(model, probe):
    """One timeline record's numbers for the model as it is now (in float32, in eval mode; left in the mode it
    was in): {icl, loss_by_position, heads (None without attention)}."""
    with evaluating(model):
        heads = None
        if probe.repeated is None:
            logits, _ = model(probe.windows, probe.targets)
        else:  # the text's attention read in the same pass as the losses
            text, logits = patterns(model, probe.windows, rows=SCORE_WINDOWS)
            scores = scores_of(text, patterns(model, probe.repeated)[0], probe.repeated)
            heads = {kind: [[round(v, 4) for v in row] for row in scores[kind].tolist()] for kind in KINDS}
        losses = token_losses(logits, probe.targets).view(probe.targets.shape).float().mean(0)  # (T,)
        early, late = icl_positions(losses.numel())
        buckets = losses.tensor_split(POSITION_BUCKETS) if losses.numel() >= POSITION_BUCKETS else [losses]
    return {"icl": round((losses[late] - losses[early]).item(), 5),
            "loss_by_position": [round(b.mean().item(), 5) for b in buckets], "heads": heads}


# ----------------------------------------------------------------------------- reading it back


def timeline_of(records):
    """The timeline records of a run's metrics (one per step, the last written kept), in step order, each with
    the val loss of an evaluation at the same step where there was one."""
    by_iter, val = {}, {}
    for r in records:
        if r.get("kind") == "timeline":
            by_iter[r["iter"]] = r
        elif r.get("kind") == "eval":
            val[r["iter"]] = r.get("val_loss")
    return [dict(by_iter[i], val_loss=val.get(i)) for i in sorted(by_iter)]


def point(record):
    """A record as one point: every head's scores, its in-context learning score and its mean loss by
    position; None where one is not finite (a run diverging)."""
    heads, losses = record.get("heads") or {}, record["loss_by_position"]
    numbers = [*(v for kind in KINDS for row in heads.get(kind, []) for v in row), record["icl"],
               sum(losses) / len(losses)]
    return numbers if all(math.isfinite(v) for v in numbers) else None


def travelled(timeline):
    """{step: how far the timeline has moved by its record of that step}: the distances between consecutive
    records' points, summed, so that equal spans of it hold equal change however few steps it took."""
    out, total, last = {}, 0.0, None
    for record in timeline:
        here = point(record)
        if here is not None and last is not None and len(here) == len(last):
            total += math.dist(here, last)
        out[record["iter"]], last = total, here if here is not None else last
    return out


def why_no_timeline(records):
    """Why a run's metrics hold no timeline record, and what would give it one, as its records tell: an rl.py run
    (which records none), or as its run records (kind 'run') tell, trained with --timeline=False, stopped before
    its first record, or trained before runs recorded one."""
    if rl_run(records):
        return "it is an rl.py run, which records none; the run it started from (its init_from) may hold one"
    said = [r["timeline"] for r in records if r.get("kind") == "run" and isinstance(r.get("timeline"), bool)]
    why = "it stopped before its first record" if True in said else "it was trained with --timeline=False" if said \
        else "it was trained before runs recorded one (or with --timeline=False)"
    return f"{why}; {RECORD_AGAIN}"


def steepest(steps, values, rise=True):
    """The step where values change fastest (a rise, or a fall) between consecutive records, per step of training
    over at least the records' median gap: the early records, a step or two apart, differ by their noise, which
    per single step would outrun a change spread over many; the midpoint of the two records' steps, or None with
    fewer than two."""
    if len(steps) < 2:
        return None
    gaps = sorted(t1 - t0 for t0, t1 in zip(steps, steps[1:]))
    least = max(1, gaps[len(gaps) // 2])
    slopes = [(b - a) / max(least, t1 - t0) * (1 if rise else -1)
              for (t0, a), (t1, b) in zip(zip(steps, values), zip(steps[1:], values[1:]))]
    i = max(range(len(slopes)), key=slopes.__getitem__)
    return (steps[i] + steps[i + 1]) // 2


def strongest_head(timeline, kind="induction"):
    """(layer, head) of the head whose score of kind is highest at the last record that scored heads."""
    last = [t for t in timeline if t.get("heads")][-1]["heads"][kind]
    return max(((layer, head) for layer, row in enumerate(last) for head in range(len(row))),
               key=lambda lh: last[lh[0]][lh[1]])


def phase_change(timeline):
    """Whether a phase change happened, and where: the one rule of every reader of a timeline (analyze.py timeline,
    the explorer's Over training panel, the induction lesson). {formed, layer, head, score, induction_iter,
    icl_iter, note}: the strongest induction head (at the last record that scored heads) and its score there;
    where that reaches FORMED_AT, the steepest rise of its score and the steepest fall of the in-context learning
    score. Otherwise (the steepest moves of scores that stayed near chance are noise, not a phase change), and
    with a single record, both steps are None and note says why. None for a timeline without records."""
    if not timeline:
        return None
    scored = [t for t in timeline if t.get("heads")]
    out = {"formed": False, "layer": None, "head": None, "score": None, "induction_iter": None, "icl_iter": None,
           "note": "no head scores in this timeline (a model without attention, or attention that passes no hook "
                   "point the records read): no induction head to follow, no phase change to locate"}
    if not scored:
        return out
    layer, head = strongest_head(scored)
    score = scored[-1]["heads"]["induction"][layer][head]
    out.update(formed=score >= FORMED_AT, layer=layer, head=head, score=score, note=None)
    if not out["formed"]:
        out["note"] = (f"no induction head formed (the strongest, L{layer}H{head}, ends at {score:.2f}, below "
                       f"{FORMED_AT}): no phase change to locate")
    elif len(scored) < 2:
        out["note"] = f"L{layer}H{head} ends at {score:.2f}, but a single record cannot tell when it rose"
    else:
        steps = [t["iter"] for t in scored]
        out.update(induction_iter=steepest(steps, [t["heads"]["induction"][layer][head] for t in scored]),
                   icl_iter=steepest(steps, [t["icl"] for t in scored], rise=False))
    return out
