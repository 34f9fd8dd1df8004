"""A run's numbers (gptkit/run/metrics.py): a full disk keeps whole records, the log is never written through a link,
damage is one line naming the line, and the clock runs on across resumes."""

import errno
import io
import json
import os

import pytest

import train
from gptkit.base.errors import UserError
from gptkit.run import metrics
from gptkit.run.metrics import RunLog, loss_series, read_metrics, wall_clock
from test_checkpoints import digest
from test_resume import resume
from test_settings import DEEP

RECORDS = [{"kind": "train", "iter": i, "loss": 3.0 - i / 10, "elapsed_s": float(i)} for i in range(0, 20, 5)] + \
          [{"kind": "eval", "iter": 10, "train_loss": 2.5, "val_loss": 2.6, "elapsed_s": 11.0}]


def write_metrics(folder, lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines if lines is not None else map(json.dumps, RECORDS)) + "\n"
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return folder


def full_after(n_ok):
    """An unbuffered file whose writes fail after n_ok of them, the failing one having written half its bytes."""
    class Full(io.FileIO):
        writes = 0

        def write(self, data):
            Full.writes += 1
            if Full.writes > n_ok:
                super().write(bytes(data)[:len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)
    return Full


def test_full_disk_while_writing_metrics(run, data_dir, monkeypatch):
    """One line; metrics.jsonl keeps whole records only (the half-written one is cut off); the saved states
    are untouched."""
    before = {p.name: digest(p) for p in run.glob("*.pt")}
    lines = len(read_metrics(run))
    full = full_after(3)
    monkeypatch.setattr(metrics, "open", lambda path, mode, **kw: full(path, mode), raising=False)
    with pytest.raises(UserError) as info:
        train.main(resume(data_dir, run, "--max_iters=100", "--log_interval=1", "--eval_interval=1000"))
    assert str(info.value) == f"disk full while writing {run / 'metrics.jsonl'}; the records before it are intact"
    monkeypatch.undo()
    assert len(read_metrics(run)) == lines + 3 and (run / "metrics.jsonl").read_bytes().endswith(b"\n")
    assert {p.name: digest(p) for p in run.glob("*.pt")} == before


def test_the_log_is_never_written_through_a_link(tmp_path, outside):
    """Below the run's check at its start: a link at metrics.jsonl's name, made while the run runs, is refused and
    never written through."""
    (tmp_path / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(UserError, match="metrics.jsonl is a link"):
        RunLog(tmp_path / "metrics.jsonl").write({"kind": "train", "iter": 1, "loss": 2.0})
    assert outside.read_text() == "precious\n"


def test_json_nested_too_deeply_is_one_error_line(tmp_path):
    """Deep nesting in the run's JSON lines is damage to report, as any other (the dataset's meta.json: see
    test_dataset.py)."""
    deep = "[" * DEEP + "]" * DEEP
    write_metrics(tmp_path, [json.dumps(RECORDS[0]), deep])
    with pytest.raises(UserError, match=r"metrics.jsonl has a line nested too deeply to read \(line 2\)"):
        read_metrics(tmp_path)


def test_wall_clock_continues_across_resumes():

    records = [{"kind": "train", "iter": 10, "loss": 3.0, "elapsed_s": 5.0},
               {"kind": "eval", "iter": 20, "train_loss": 2.5, "val_loss": 2.7, "elapsed_s": 9.0},
               {"kind": "train", "iter": 30, "loss": 2.2, "elapsed_s": 2.0},  # resumed: a new process
               {"kind": "eval", "iter": 40, "train_loss": 2.0, "val_loss": 2.4, "elapsed_s": 6.0}]
    assert wall_clock(records) == [5.0, 9.0, 11.0, 15.0]
    series = loss_series(records)
    assert series["val"] == ([20, 40], [9.0, 15.0], [2.7, 2.4])
    assert series["train (batch)"] == ([10, 30], [5.0, 11.0], [3.0, 2.2])


def test_a_record_without_a_time_keeps_the_time_before_it():
    """A kind of record whose fields are not checked (a run or final record edited by hand) may hold text, NaN or
    nothing for elapsed_s: the clock neither fails nor jumps there."""
    records = [{"kind": "train", "iter": 10, "loss": 3.0, "elapsed_s": 5.0}, {"kind": "run", "elapsed_s": "soon"},
               {"kind": "final", "iter": 10, "val_loss": 2.9, "elapsed_s": float("nan")}, {"kind": "health"},
               {"kind": "train", "iter": 20, "loss": 2.5, "elapsed_s": 7.0}]
    assert wall_clock(records) == [5.0, 5.0, 5.0, 5.0, 7.0]
