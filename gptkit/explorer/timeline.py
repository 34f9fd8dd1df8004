"""The explorer's "Over training" panel (gptkit/explorer/app.py serves it): a run's timeline as train.py records it
in metrics.jsonl (gptkit/interp/timeline.py: every head's scores, the in-context learning score and the val loss
at steps 0, 1, 2, 4, ... and at every evaluation) with its phase change, the steps whose weights the run keeps as
snapshots (train.py --snapshots=N), and which checkpoint a request reads: each request of the panels that follow
the slider may name one ("checkpoint": "iter:1200"), left out the run's own (best.pt, else latest.pt)."""

from pydantic import BaseModel, field_validator

from gptkit.base.errors import UserError, first_line
from gptkit.data.dataset import file_identity
from gptkit.explorer.runs import ApiError, inside, number, run_records, without_paths
from gptkit.interp.experiments import KINDS, shown_value
from gptkit.interp.timeline import phase_change, steepest, timeline_of
from gptkit.run.run_folder import RunDir, check_checkpoint

NO_TIMELINE = ("this run has no timeline: it was trained before runs recorded one (or with --timeline=False); "
               "train it again to watch its heads form")
NO_SNAPSHOTS = ("python train.py ... --snapshots=5 keeps the weights of 5 steps, so that the other panels can "
                "follow the slider; this run keeps none, so only the curves do")


class AtRequest(BaseModel):
    """The weights a request reads: 'iter:N' (the snapshot of step N), 'best' or 'latest'; left out (or null), the
    run's own checkpoint, as the runs list shows it."""

    checkpoint: str | None = None

    @field_validator("checkpoint")
    @classmethod
    def a_checkpoint(cls, v):
        if v is not None:
            check_checkpoint(v)  # one line, quoting at most 40 characters of what it got
        return v


def checked_checkpoint(value):
    """A checkpoint a query string names (GET requests), as AtRequest checks one: a 400 line otherwise."""
    try:
        check_checkpoint(value)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return value


# ----------------------------------------------------------------------------- which file a checkpoint is


def checkpoint_file(summary, which):
    """(path, identity) of the file checkpoint `which` names in a run: a 404 line where the run does not keep it
    (for a snapshot, naming the ones it keeps), a 409 where it cannot be read or is a link leading out of the run's
    folder; never a path of this machine."""
    run, name = RunDir(summary.folder), shown_value(summary.name)
    try:
        path = run.snapshot(snapshot_kept(run, name, int(which[5:]))) if which.startswith("iter:") else \
            run.model_file(which)
    except UserError as e:
        raise ApiError(404, f"run {name}: {without_paths(first_line(e), summary.folder)}") from None
    except OSError as e:
        raise unreadable(summary, e, "snapshots") from None
    try:
        inside(path, summary.folder)
        return path, file_identity(path.stat())
    except UserError as e:
        raise ApiError(409, f"run {name}: {without_paths(first_line(e), summary.folder)}") from None
    except OSError as e:
        raise unreadable(summary, e, path.name) from None


def unreadable(summary, e, what):
    return ApiError(409, without_paths(f"run {shown_value(summary.name)}: cannot read {e.filename or what} "
                                       f"({e.strerror or e})", summary.folder))


def snapshot_kept(run, name, step):
    kept = run.kept_snapshots()
    if step in kept:
        return step
    if not kept:
        raise ApiError(404, f"run {name} keeps no snapshots (python train.py ... --snapshots=5 keeps the weights of "
                            "5 steps); leave out checkpoint for its own weights")
    raise ApiError(404, f"run {name} keeps no snapshot of step {step}; it keeps "
                        f"{', '.join(f'iter:{i}' for i in kept)}")


# ----------------------------------------------------------------------------- the timeline


def timeline_report(summary):
    """{records, phase, snapshots, kinds, own, note}: each timeline record (iter, val_loss, icl, loss_by_position,
    heads: {kind: [[score]] a layer, a head}, or None without attention) as gptkit.interp.timeline.timeline_of reads
    them, its phase_change, the steps the run keeps snapshots of, the run's own checkpoint (its file's name and
    step), and a line saying what the run lacks (a timeline, or snapshots), if it does. A value that is not a finite
    number (a hand-edited file) is None, and a head grid not of the model's shape is left out: the page draws a
    gap."""
    try:
        records = run_records(summary.folder)
        snapshots = RunDir(summary.folder).kept_snapshots()
    except UserError as e:
        raise ApiError(409, without_paths(first_line(e), summary.folder)) from None
    except OSError as e:
        raise unreadable(summary, e, "snapshots") from None
    wanted = [r for r in records if r.get("kind") in ("timeline", "eval") and type(r.get("iter")) is int]
    shown = [shown_record(t, summary.config) for t in timeline_of(wanted)]
    note = None if shown and snapshots else NO_TIMELINE if not shown else NO_SNAPSHOTS
    return {"records": shown, "phase": phase_of(shown), "snapshots": snapshots, "kinds": list(KINDS),
            "own": {"file": summary.checkpoint.name, "iter": summary.iter_num}, "note": note}


def finite(value):
    return None if type(value) is bool else number(value)


def shown_record(t, config):
    positions = t.get("loss_by_position")
    return {"iter": t["iter"], "val_loss": finite(t.get("val_loss")), "icl": finite(t.get("icl")),
            "loss_by_position": [finite(v) for v in positions] if isinstance(positions, list) else [],
            "heads": head_grids(t.get("heads"), config)}


def head_grids(heads, config):
    """{kind: [[score]]} of the model's n_layer x n_head, each score a finite number or None; None otherwise."""
    if not isinstance(heads, dict) or config.n_layer == 0:
        return None
    grids = {}
    for kind in KINDS:
        rows = heads.get(kind)
        if not isinstance(rows, list) or len(rows) != config.n_layer or \
                any(not isinstance(row, list) or len(row) != config.n_head for row in rows):
            return None
        grids[kind] = [[finite(v) for v in row] for row in rows]
    return grids


def phase_of(shown):
    """phase_change's {induction_iter, icl_iter, layer, head} of the records whose numbers are all there; without
    head scores (no attention), the in-context learning score's steepest fall alone."""
    whole = [t for t in shown if t["icl"] is not None and all_there(t["heads"])]
    if not whole:
        return None
    if any(t["heads"] for t in whole):
        return phase_change(whole)
    return {"induction_iter": None, "icl_iter": steepest([t["iter"] for t in whole], [t["icl"] for t in whole],
                                                         rise=False), "layer": None, "head": None}


def all_there(heads):
    return heads is None or all(v is not None for rows in heads.values() for row in rows for v in row)
