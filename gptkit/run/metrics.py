"""A run's numbers: one JSON object per line in metrics.jsonl, mirrored to wandb when asked."""

import errno
import json
import math
import os
import sys
import time
from pathlib import Path

from gptkit.base import files
from gptkit.base.errors import UserError, first_line
from gptkit.base.files import no_links
from gptkit.base.settings import shown


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
    the iteration (a last line cut short among them), and whether its final score is among those kept."""
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
        if not line.endswith(b"\n"):
            if not record:  # cut short by a crash while it was written: the next record would join it
                continue
            line += b"\n"  # a whole record (an editor saved the file without its last newline): kept
        kept.append(line)
        final = final or record.get("kind") == "final" and record.get("iter") == iteration
    if rewrite and kept != lines:
        files.write_whole(path, b"".join(kept), failed=not_rewritten)
    return len(lines) - len(kept), final


def later_records_note(path, dropped, where):
    """The note for records_through's drop: `where` is the state the run continues from ('iteration 200')."""
    return (f"note: {path} held {dropped} record{'s' * (dropped > 1)} logged after {where}, the state this run "
            f"continues from; {'they are' if dropped > 1 else 'it is'} dropped, and logged again as it goes on")


def damaged_note(path):
    """A note for a run that continues over a metrics.jsonl with whole lines that are not records as train.py and
    rl.py write them (damage, or a hand edit), which plot.py and analyze.py refuse; None where every line is one. A
    last line cut short is not counted: a resume drops it."""
    try:
        with open(path, "rb", opener=no_links) as f:
            lines = f.read().splitlines(keepends=True)
    except OSError:  # missing, or unreadable: what writes it next says so
        return None
    damaged = []
    for number, line in enumerate(lines, 1):
        if line.strip() and line.endswith(b"\n"):
            try:
                check_record(json.loads(line))
            except (ValueError, RecursionError):
                damaged.append(number)
    if not damaged:
        return None
    which = f"line {damaged[0]}" + (f" and {len(damaged) - 1} more" if len(damaged) > 1 else "")
    return (f"note: {path} {which} {'is' if len(damaged) == 1 else 'are'} not a record this project writes (damaged, "
            "or edited); the run logs on after it, but plot.py and analyze.py refuse the file until that line is "
            "mended or removed")


def is_json(line):
    """Whether a line is JSON at all; a last line that is not, with no newline, is one a run is still writing."""
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def parsed(line):
    """A line's record, or {} for a line that is not one (left as it is)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def not_rewritten(path, e):
    what = "disk full" if e.errno == errno.ENOSPC else f"could not write ({e.strerror or e})"
    return UserError(f"{what} while rewriting {path}; it is as it was")


# the fields each kind of record must have, all numbers (rl.py's: a step's reward, the held-out scores; a fine-tune's
# stop_task score); other kinds are passed over
RECORD_FIELDS = {"train": ("iter", "loss"), "eval": ("iter", "val_loss"), "rl": ("iter", "reward"),
                 "rl_eval": ("iter", "pass_at_1"), "task_eval": ("iter", "pass_at_1")}
# and each optimizer's rate, named for it ('adamw_lr', 'muon_lr', 'sgd_lr': gptkit/training/updates.py rates)
NUMBER_FIELDS = ("loss", "lr", "tokens", "train_loss", "val_loss", "elapsed_s", "reward", "answer_tokens",
                 "pass_at_1", "accuracy")
# every number train.py logs comes from a float32 tensor or a step count: a larger one is a hand edit, which would
# overflow the pictures' axes
LARGEST = 3.4028234663852886e38
LAST_STEP = 2 ** 63 - 1


class Records(list):
    """A run's records, in the order written; left_out: (line, kind, why) of each final or timeline record that is
    not what train.py writes (a hand edit, or NaN from a run that diverged), which the list leaves out."""

    def __init__(self, records, path, left_out):
        super().__init__(records)
        self.path, self.left_out = path, left_out

    def note(self, kind):
        """One line saying which records of a kind were left out and why, or None where none was."""
        left = [(line, why) for line, k, why in self.left_out if k == kind]
        if not left:
            return None
        listed = "; ".join(f"line {line}: {why}" for line, why in left[:3]) + ("; ..." if len(left) > 3 else "")
        return (f"note: left out {len(left)} {kind} record{'s' * (len(left) > 1)} of {self.path} that train.py "
                f"would not write ({listed})")


def read_metrics(out_dir, writing=False):
    """Every record of out_dir/metrics.jsonl (Records), in the order written, each checked to have the shape
    train.py writes: an object whose train and eval records carry an integer iter and numbers where numbers go
    (one error line naming the line otherwise); a final or timeline record that is not whole is left out, and said
    so in Records.left_out. A last line with no newline that is not JSON is left out, as a resume drops it: a run
    stopped as it wrote it (a note says so), or, with writing, one still writing it (the explorer reads runs as they
    train)."""
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
    if lines and not lines[-1][1].endswith("\n") and not is_json(lines[-1][1]):
        number, _ = lines.pop()
        if not writing:
            print(f"note: left out line {number} of {path}, cut short as it was written (the run stopped there); "
                  "a resume drops it", file=sys.stderr, flush=True)
    records, numbers = [], []
    for lineno, line in lines:
        if line.strip():
            try:
                records.append(check_record(json.loads(line)))
                numbers.append(lineno)
            except (json.JSONDecodeError, ValueError) as e:
                # json's messages for a string cut short end in 'at', before the position it would have given
                reason = f"{e.msg.removesuffix(' at')} at line {lineno}" if isinstance(e, json.JSONDecodeError) \
                    else f"line {lineno}: {e}"
                kind = "is not JSON" if isinstance(e, json.JSONDecodeError) else "has a record of the wrong shape"
                raise UserError(f"{path} has a line that {kind} ({reason}); was it written by train.py?") from None
            except RecursionError:  # JSON nested thousands deep
                raise UserError(f"{path} has a line nested too deeply to read (line {lineno}); was it written by "
                                "train.py?") from None
    left = not_whole(records)
    return Records([r for i, r in enumerate(records) if i not in left], path,
                   [(numbers[i], records[i]["kind"], why) for i, why in sorted(left.items())])


def rl_run(records):
    """Whether a run's records are rl.py's (a reward a step), not train.py's."""
    return any(r.get("kind") == "rl" for r in records)


def check_record(record):
    if not isinstance(record, dict):
        raise ValueError(f"a {type(record).__name__}, not an object")
    kind = record.get("kind")
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"kind is {shown(kind, 40)}, not a name")
    if kind == "eval" and "pass_at_1" in record and "val_loss" not in record:  # an earlier rl.py's held-out scores
        record, kind = {**record, "kind": "rl_eval"}, "rl_eval"
    missing = [k for k in RECORD_FIELDS.get(kind, ()) if k not in record]
    if missing:
        raise ValueError(f"a record of kind {kind!r} without {', '.join(missing)}")
    if kind in RECORD_FIELDS:
        if not is_step(record["iter"]):
            raise ValueError(f"iter is {shown(record['iter'], 40)}, not an iteration number")
        for key in [k for k in record if k in NUMBER_FIELDS or k.endswith("_lr")]:
            if type(record[key]) not in (int, float):
                raise ValueError(f"{key} is {shown(record[key], 40)}, not a number")
            value = record[key]  # NaN and Infinity are kept: a run that diverged logs them
            if (type(value) is int or math.isfinite(value)) and abs(value) > LARGEST:
                raise ValueError(f"{key} is {as_number(value)}, beyond any number train.py logs")
    return record


def is_step(value):
    return type(value) is int and 0 <= value <= LAST_STEP


def finite_problem(key, value, low=-LARGEST, high=LARGEST):
    """Why value (a record's field key) is not a finite number from low to high, or None where it is one."""
    if type(value) not in (int, float):
        return f"{key} is {'null' if value is None else shown(value, 40)}, not a number"
    if type(value) is float and not math.isfinite(value):  # an int is finite however large
        return f"{key} is {value}, not a finite number"
    if not low <= value <= high:
        beyond = "beyond any number train.py logs" if (low, high) == (-LARGEST, LARGEST) else \
            f"outside {low:g} to {high:g}"
        return f"{key} is {as_number(value)}, {beyond}"
    return None


def as_number(value):
    return f"{value:.4g}" if type(value) is float else shown(value, 40)  # an int of thousands of digits, cut


def not_whole(records):
    """{index: why} of the final and timeline records among records that are not whole: a final record's step
    and val loss, and a timeline record's fields (timeline_problems)."""
    left = {}
    for i, r in enumerate(records):
        if r.get("kind") == "final":
            why = "iter is not an iteration number" if not is_step(r.get("iter")) else \
                "it has no val_loss" if "val_loss" not in r else finite_problem("val_loss", r["val_loss"])
            if why:
                left[i] = why
    return {**left, **timeline_problems(records)}


def wall_clock(records):
    """Each record's elapsed_s on one clock: a resumed run's process clock restarts at 0, so it continues
    from where the previous process left off. A record without a finite number there (a kind whose fields are
    not checked) keeps the time of the record before it."""
    out, offset, last = [], 0.0, 0.0
    for r in records:
        t = r.get("elapsed_s")
        if type(t) not in (int, float) or not -LARGEST <= t <= LARGEST:  # NaN, Infinity, an int of 400 digits
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


# the kinds of head scores a timeline record holds, each a grid of shares (gptkit/interp/experiments.py scores them)
KINDS = ("previous_token", "first_token", "duplicate_token", "induction", "local")


def timeline_problems(records):
    """{index: why} of the timeline records among a run's records (gptkit/run/metrics.py's read_metrics leaves them
    out) that are not what train.py writes: a step, a finite in-context learning score, finite losses by position
    and, where the model has attention, each kind's scores (shares, 0 to 1) in grids of one shape, that of the run's
    last whole record."""
    why, shapes = {}, {}
    for i, r in enumerate(records):
        if r.get("kind") == "timeline":
            try:
                shapes[i] = record_shape(r)
            except ValueError as e:
                why[i] = str(e)
    last = shapes[max(shapes)] if shapes else None
    for i, shape in shapes.items():
        if shape != last:
            why[i] = f"it holds {grid_words(shape)}, where the run's last record holds {grid_words(last)}"
    return why


def record_shape(r):
    """(layers, heads) of a timeline record's head scores (None without attention), or ValueError saying what in
    it is not what train.py writes."""
    positions = r.get("loss_by_position")
    if not is_step(r.get("iter")):
        raise ValueError("iter is not an iteration number")
    if "icl" not in r:
        raise ValueError("it has no icl")
    if not isinstance(positions, list) or not positions:
        raise ValueError("loss_by_position is not a list of numbers")
    first_problem([finite_problem("icl", r["icl"]), *(finite_problem("loss_by_position", v) for v in positions)])
    heads = r.get("heads")
    if heads is None:
        return None
    if not isinstance(heads, dict):
        raise ValueError(f"heads is {shown(heads, 40)}, not each kind's scores")
    for kind in KINDS:
        if kind not in heads:
            raise ValueError(f"heads has no {kind} scores")
        if grid_shape(heads[kind]) is None:
            raise ValueError(f"heads' {kind} is {shown(heads[kind], 40)}, not a grid of scores")
    if len({grid_shape(heads[kind]) for kind in KINDS}) > 1:
        raise ValueError("heads holds grids of scores of different shapes")
    first_problem(finite_problem(kind, v, 0, 1) for kind in KINDS for row in heads[kind] for v in row)
    return grid_shape(heads["induction"])


def first_problem(problems):
    why = next(filter(None, problems), None)
    if why:
        raise ValueError(why)


def grid_shape(rows):
    """(rows, columns) of a list of equally long, non-empty lists (a row of heads for each layer), else None."""
    if not isinstance(rows, list) or not rows or \
            any(not isinstance(row, list) or not row or len(row) != len(rows[0]) for row in rows):
        return None
    return len(rows), len(rows[0])


def grid_words(shape):
    return "no head scores" if shape is None else f"the scores of {shape[0]} x {shape[1]} heads"
