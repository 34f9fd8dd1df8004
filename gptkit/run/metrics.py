"""A run's numbers: one JSON object per line in metrics.jsonl, mirrored to wandb when asked."""

import errno
import json
import math
import os
import time
from pathlib import Path

from gptkit.base.errors import UserError, first_line
from gptkit.base.files import no_links, refuse_link


def process_start_time():
    """When this process started, on the wall clock: from the kernel where it tells (Linux), so that the
    interpreter's and torch's start-up count in a run's elapsed_s; else when this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_START = process_start_time()


class RunLog:
    """Appends to a run's metrics.jsonl (path), and to wandb when wandb_args are given."""

    def __init__(self, path, wandb_args=None):
        self.path = Path(path)
        self.wandb = None
        if wandb_args is not None:
            try:
                import wandb
            except ImportError:
                raise UserError("wandb_log=True needs the wandb package: pip install wandb") from None
            try:
                self.wandb = wandb.init(resume="allow", dir=str(self.path.parent), **wandb_args)
            except Exception as e:  # no login, no network, a bad project name: wandb has many ways to say so
                raise UserError(f"wandb could not start ({first_line(e)}); log in with `wandb login`, or run "
                                "with WANDB_MODE=offline") from None

    def write(self, record):
        record = dict(record, elapsed_s=round(time.time() - PROCESS_START, 3))
        append_line(self.path, json.dumps(record) + "\n")
        if self.wandb is not None:
            kind = record["kind"]
            # numbers only: a timeline's scores by head and its loss by position stay in metrics.jsonl
            values = {f"{kind}/{k}": v for k, v in record.items()
                      if k not in ("kind", "iter") and isinstance(v, (int, float))}
            self.wandb.log(values, step=record["iter"])

    def close(self):
        if self.wandb is not None:
            self.wandb.finish()


def append_line(path, line):
    """Append one whole line or nothing: a write that fails part-way (a full disk) is cut back off, so the
    file keeps only whole records."""
    data = line.encode("utf-8")
    try:
        with open(path, "ab", buffering=0, opener=no_links) as f:  # unbuffered: nothing left to flush after a failure
            size = f.tell()
            try:
                while data:
                    data = data[f.write(data):]
            except OSError:
                f.truncate(size)
                raise
    except OSError as e:
        what = "disk full" if e.errno == errno.ENOSPC else f"could not write ({e.strerror or e})"
        raise UserError(f"{what} while writing {path}; the records before it are intact") from None


def records_through(path, iteration, rewrite=True):
    """Keep in metrics.jsonl only the records of iterations up to `iteration`: a run resumed from its state there
    logs the later ones again (they were logged past its last saved state: it was killed, or its save failed).
    With rewrite, the file is rewritten whole, a new file renamed over it. Returns how many records are past
    the iteration, and whether its final score is among those kept."""
    try:
        with open(path, "rb", opener=no_links) as f:
            lines = f.read().splitlines(keepends=True)
    except FileNotFoundError:
        return 0, False
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    kept, final = [], False
    for line in lines:
        record = parsed(line)
        if isinstance(record.get("iter"), int) and record["iter"] > iteration:
            continue
        kept.append(line)
        final = final or record.get("kind") == "final" and record.get("iter") == iteration
    if rewrite and len(kept) < len(lines):
        replace_file(Path(path), b"".join(kept))
    return len(lines) - len(kept), final


def parsed(line):
    """A line's record, or {} for a line that is not one (left as it is)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def replace_file(path, data):
    refuse_link(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb", opener=no_links) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        what = "disk full" if e.errno == errno.ENOSPC else f"could not write ({e.strerror or e})"
        raise UserError(f"{what} while rewriting {path}; it is as it was") from None


# the fields each kind of record must have, all numbers; other kinds are passed over
RECORD_FIELDS = {"train": ("iter", "loss"), "eval": ("iter", "val_loss")}
NUMBER_FIELDS = ("loss", "adamw_lr", "muon_lr", "lr", "tokens", "train_loss", "val_loss", "elapsed_s")


def read_metrics(out_dir):
    """Every record of out_dir/metrics.jsonl, in the order written, each checked to have the shape train.py
    writes: an object whose train and eval records carry an integer iter and numbers where numbers go."""
    path = Path(out_dir) / "metrics.jsonl"
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(enumerate(f, 1))
    except FileNotFoundError:
        raise UserError(f"no metrics.jsonl in {out_dir}; train a model there first with `python train.py ...`") \
            from None
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); was it written by train.py?") \
            from None
    records = []
    for lineno, line in lines:
        if line.strip():
            try:
                records.append(check_record(json.loads(line)))
            except (json.JSONDecodeError, ValueError) as e:
                reason = f"{e.msg} at line {lineno}" if isinstance(e, json.JSONDecodeError) else f"line {lineno}: {e}"
                kind = "is not JSON" if isinstance(e, json.JSONDecodeError) else "has a record of the wrong shape"
                raise UserError(f"{path} has a line that {kind} ({reason}); was it written by train.py?") from None
            except RecursionError:  # JSON nested thousands deep
                raise UserError(f"{path} has a line nested too deeply to read (line {lineno}); was it written by "
                                "train.py?") from None
    return records


def check_record(record):
    if not isinstance(record, dict):
        raise ValueError(f"a {type(record).__name__}, not an object")
    kind = record.get("kind")
    missing = [k for k in RECORD_FIELDS.get(kind, ()) if k not in record]
    if missing:
        raise ValueError(f"a record of kind {kind!r} without {', '.join(missing)}")
    if kind in RECORD_FIELDS and (type(record["iter"]) is not int or record["iter"] < 0):
        raise ValueError(f"iter is {record['iter']!r}, not an iteration number")
    for key in NUMBER_FIELDS:
        if kind in RECORD_FIELDS and key in record and type(record[key]) not in (int, float):
            raise ValueError(f"{key} is {record[key]!r}, not a number")
    return record


def wall_clock(records):
    """Each record's elapsed_s on one clock: a resumed run's process clock restarts at 0, so it continues
    from where the previous process left off. A record without a finite number there (a kind whose fields are
    not checked) keeps the time of the record before it."""
    out, offset, last = [], 0.0, 0.0
    for r in records:
        t = r.get("elapsed_s")
        if type(t) not in (int, float) or not math.isfinite(t):
            out.append(last)
            continue
        if t + offset < last:  # the clock went back: a new process appended to the file
            offset = last
        last = t + offset
        out.append(last)
    return out


def loss_points(records):
    """(record, seconds on one wall clock) of each train, eval and final record: what every loss curve is drawn
    from, in pictures and on the explorer's page alike."""
    return [(r, t) for r, t in zip(records, wall_clock(records)) if r.get("kind") in ("train", "eval", "final")]


def loss_series(records):
    """{label: (iters, seconds, losses)} for the logged train loss and the evaluated train/val losses."""
    series = {"train (batch)": ([], [], []), "train (eval)": ([], [], []), "val": ([], [], [])}
    for r, t in loss_points(records):
        if r.get("kind") == "train" and "loss" in r:
            points = [("train (batch)", r["loss"])]
        elif r.get("kind") == "eval":
            points = [("train (eval)", r.get("train_loss")), ("val", r.get("val_loss"))]
        else:
            continue
        for label, value in points:
            if value is not None:
                series[label][0].append(r["iter"])
                series[label][1].append(t)
                series[label][2].append(value)
    return {k: v for k, v in series.items() if v[0]}
