"""The explorer's "Over training" panel (gptkit/explorer/app.py serves it): a run's timeline as train.py records it
in metrics.jsonl (gptkit/interp/timeline.py: every head's scores, the in-context learning score and the val loss
at steps 0, 1, 2, 4, ... and at every evaluation) with its phase change, the steps whose weights the run keeps as
snapshots (train.py --snapshots=N), and which checkpoint a request reads: each request of the panels that follow
the slider may name one ("checkpoint": "iter:1200"), left out the run's own (best.pt, else latest.pt)."""

from pydantic import BaseModel, field_validator

from gptkit.base.errors import UserError, first_line
from gptkit.data.dataset import file_identity
from gptkit.explorer.runs import NO_METRICS, ApiError, inside, number, run_records, without_paths
from gptkit.interp.experiments import KINDS, shown_value
from gptkit.interp.timeline import RECORD_AGAIN, phase_change, timeline_of, why_no_timeline
from gptkit.run.metrics import Records
from gptkit.run.run_folder import RunDir, check_checkpoint

NO_TIMELINE = "this run has no timeline: {why}"
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
    them, its phase_change (analyze.py timeline's, from the same records), the steps the run keeps snapshots of, the
    run's own checkpoint (its file's name and step), and a line saying what the run lacks (a timeline, or
    snapshots) and which records were left out (read_metrics leaves out one that is not whole), if any. A val loss
    that is not a finite number (a run that diverged) is None, and head grids not of the model's shape are left out:
    the page draws a gap."""
    try:
        records = run_records(summary.folder)
        snapshots = RunDir(summary.folder).kept_snapshots()
    except UserError as e:
        raise ApiError(409, without_paths(first_line(e), summary.folder)) from None
    except OSError as e:
        raise unreadable(summary, e, "snapshots") from None
    timeline = timeline_of(records)
    left_out = records.note("timeline") if isinstance(records, Records) else None  # None: no metrics.jsonl
    left_out = left_out and without_paths(left_out.removeprefix("note: "), summary.folder)
    why = (f"no whole record; {RECORD_AGAIN}" if left_out else why_no_timeline(records)
           if isinstance(records, Records) else NO_METRICS) if not timeline else None
    lacks = None if timeline and snapshots else NO_SNAPSHOTS if timeline else NO_TIMELINE.format(why=why)
    return {"records": [shown_record(t, summary.config) for t in timeline], "phase": phase_change(timeline),
            "snapshots": snapshots, "kinds": list(KINDS), "own": {"file": summary.checkpoint.name,
                                                                   "iter": summary.iter_num},
            "note": "; ".join(filter(None, [lacks, left_out])) or None}


def shown_record(t, config):
    heads = t.get("heads")
    whole = heads is not None and config.n_layer > 0 and \
        (len(heads["induction"]), len(heads["induction"][0])) == (config.n_layer, config.n_head)
    return {"iter": t["iter"], "val_loss": number(t.get("val_loss")), "icl": t["icl"],
            "loss_by_position": t["loss_by_position"], "heads": {k: heads[k] for k in KINDS} if whole else None}
