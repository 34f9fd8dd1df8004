"""A run's numbers (gptkit/run/metrics.py): a full disk keeps whole records, the log is never written through a link,
damage is one line naming the line (and a resume over it says so), and the clock runs on across resumes."""

import errno
import io
import json
import math
import os
import shutil

import pytest

import train
from conftest import TRAINED_RUN, train_args
from gptkit.base.errors import UserError
from gptkit.run import metrics
from gptkit.run.metrics import RunLog, damaged_note, loss_series, read_metrics, wall_clock
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


@pytest.mark.parametrize("text,reason", [
    ('{"kind": "train", "iter": 3, "lo\n{}\n', "Invalid control character at line 2"),  # the newline, in the string
    ('{"kind": "train", "iter": \n', "Expecting value at line 2"),
])
def test_a_line_that_is_not_json_is_named_in_words_that_read(tmp_path, text, reason):
    """json's messages for a string cut short end in 'at' (a position would follow): the line says where once."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps(RECORDS[0]) + "\n" + text, encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_metrics(tmp_path)
    assert f"has a line that is not JSON ({reason}); was it written by train.py?" in str(e.value)


@pytest.mark.parametrize("writing", [False, True])
def test_a_last_line_cut_short_is_left_out_of_what_is_read(tmp_path, writing, capsys):
    """A run stopped as it wrote a record leaves half a line, which a resume drops: the pictures draw the records
    before it, and say so, where the explorer, reading a run as it trains, passes it over in silence."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + '{"kind": "train", "iter": 3, "lo', encoding="utf-8")
    assert read_metrics(tmp_path, writing=writing) == [RECORDS[0]]
    note = f"note: left out line 2 of {path}, cut short as it was written (the run stopped there); a resume drops it"
    assert capsys.readouterr().err == ("" if writing else note + "\n")


def test_a_last_line_cut_short_goes_with_the_records_past_the_resumed_state(tmp_path):
    """A crash while a record was being written leaves half a line: a resume drops it, counted among the records
    it drops (which the resume says), so that the next record it logs does not join it."""
    from gptkit.run.metrics import records_through

    path = tmp_path / "metrics.jsonl"
    whole = "".join(json.dumps({"kind": "train", "iter": i, "loss": 1.0}) + "\n" for i in range(3))
    path.write_text(whole + '{"kind": "train", "it')
    assert records_through(path, 5) == (1, False)
    assert path.read_text() == whole


def test_a_resume_over_lines_the_pictures_would_refuse_says_which(tmp_path, trained_run, data_dir, capsys):
    """A whole line that is not a record (a hand edit, damage) stays, as the run's own records around it do, but the
    resume says that plot.py and analyze.py will refuse the file for it; a last line cut short is not counted."""
    out = tmp_path / "out"
    shutil.copytree(trained_run[0], out)
    path = out / "metrics.jsonl"
    assert damaged_note(path) is None
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2], lines[4] = '{"kind": "train", "iter": \n', '{"kind": "eval", "iter": "x", "val_loss": 1}\n'
    path.write_text("".join(lines) + '{"kind": "train", "it', encoding="utf-8")
    expected = (f"note: {path} line 3 and 1 more are not a record this project writes (damaged, or edited); the run "
                "logs on after it, but plot.py and analyze.py refuse the file until that line is mended or removed")
    assert damaged_note(path) == expected
    train.main(train_args(data_dir, out, *TRAINED_RUN, "--init_from=auto", "--max_iters=31"))
    assert expected in capsys.readouterr().out.splitlines()


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
    """A kind of record whose fields are not checked (a run or final record edited by hand) may hold text, NaN, an
    integer of 400 digits or nothing for elapsed_s: the clock neither fails nor jumps there."""
    records = [{"kind": "train", "iter": 10, "loss": 3.0, "elapsed_s": 5.0}, {"kind": "run", "elapsed_s": "soon"},
               {"kind": "final", "iter": 10, "val_loss": 2.9, "elapsed_s": float("nan")}, {"kind": "health"},
               {"kind": "timeline", "elapsed_s": 10 ** 400}, {"kind": "train", "iter": 20, "loss": 2.5, "elapsed_s": 7.0}]
    assert wall_clock(records) == [5.0, 5.0, 5.0, 5.0, 5.0, 7.0]


WHOLE = {"kind": "timeline", "iter": 4, "icl": -0.1, "loss_by_position": [3.1, 2.9],
         "heads": {k: [[0.1, 0.2], [0.3, 0.4]] for k in ("previous_token", "first_token", "duplicate_token",
                                                          "induction", "local")}}


REMOVE = object()


def edited(path, value):
    """WHOLE with the field at path (keys and indices) set to value, or removed where value is REMOVE."""
    record = json.loads(json.dumps(WHOLE))
    *inner, last = path
    where = record
    for key in inner:
        where = where[key]
    if value is REMOVE:
        del where[last]
    else:
        where[last] = value
    return record


@pytest.mark.parametrize("path, value, why", [
    (["icl"], REMOVE, "it has no icl"),
    (["icl"], "0.5", "icl is '0.5', not a number"),
    (["icl"], float("nan"), "icl is nan, not a finite number"),
    (["icl"], float("-inf"), "icl is -inf, not a finite number"),
    (["icl"], 1e300, "icl is 1e+300, beyond any number train.py logs"),
    (["iter"], "4", "iter is not an iteration number"),
    (["loss_by_position"], {"a": 1.0}, "loss_by_position is not a list of numbers"),
    (["heads"], [[0.1]], "heads is [[0.1]], not each kind's scores"),
    (["heads", "induction"], REMOVE, "heads has no induction scores"),
    (["heads", "local"], [[0.1], [0.2, 0.3]], "heads' local is [[0.1], [0.2, 0.3]], not a grid of scores"),
    (["heads", "induction", 1, 0], None, "induction is null, not a number"),
    (["heads", "induction", 1, 0], 1.5, "induction is 1.5, outside 0 to 1"),
    (["heads", "first_token"], [[0.1, 0.2]], "heads holds grids of scores of different shapes"),
])
def test_a_timeline_record_not_as_train_py_writes_it_is_left_out_and_said_so(tmp_path, path, value, why):
    """Issue 65: a hand-edited timeline record (a field missing, text or a list where a number or a dict goes, NaN,
    a score outside 0 to 1, a grid of another shape) is left out of what read_metrics gives every reader, with its
    line and why: never a traceback further on, never used."""
    write_metrics(tmp_path, [json.dumps(RECORDS[0]), json.dumps(edited(path, value)), json.dumps(WHOLE)])
    records = read_metrics(tmp_path)
    assert [r["kind"] for r in records] == ["train", "timeline"] and records.left_out == [(2, "timeline", why)]
    assert records.note("timeline") == (f"note: left out 1 timeline record of {tmp_path / 'metrics.jsonl'} that "
                                        f"train.py would not write (line 2: {why})")
    assert records.note("final") is None


def test_a_timeline_record_of_another_shape_than_the_runs_last_is_left_out(tmp_path):
    small = edited(["heads"], {k: [[0.5]] for k in WHOLE["heads"]})
    write_metrics(tmp_path, [json.dumps(small), json.dumps(WHOLE), json.dumps(dict(WHOLE, heads=None))])
    assert read_metrics(tmp_path).left_out == [
        (1, "timeline", "it holds the scores of 1 x 1 heads, where the run's last record holds no head scores"),
        (2, "timeline", "it holds the scores of 2 x 2 heads, where the run's last record holds no head scores")]


def test_a_final_record_without_a_finite_score_is_left_out(tmp_path):
    write_metrics(tmp_path, [json.dumps({"kind": "final", "iter": 3, "val_loss": "x"}),
                             '{"kind": "final", "iter": 3, "val_loss": NaN}', json.dumps({"kind": "final", "iter": 3})])
    records = read_metrics(tmp_path)
    assert records == [] and [why for _, _, why in records.left_out] == [
        "val_loss is 'x', not a number", "val_loss is nan, not a finite number", "it has no val_loss"]


@pytest.mark.parametrize("record, why", [
    ({"kind": ["train"], "iter": 1}, "kind is ['train'], not a name"),
    ({"kind": "train", "iter": 1, "loss": 1e300}, "loss is 1e+300, beyond any number train.py logs"),
    ({"kind": "eval", "iter": 10 ** 30, "val_loss": 2.0}, f"iter is {10 ** 30}, not an iteration number"),
    ({"kind": "rl", "iter": 1, "reward": "x"}, "reward is 'x', not a number"),
])
def test_a_curve_record_of_the_wrong_kind_or_size_is_one_line_naming_it(tmp_path, record, why):
    """A train or eval record (what every loss curve is drawn from) of a kind that is no name, or holding a number
    no run logs (one that overflowed the pictures' axes), is one line naming the line, as any other damage."""
    write_metrics(tmp_path, [json.dumps(RECORDS[0]), json.dumps(record)])
    with pytest.raises(UserError) as info:
        read_metrics(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'metrics.jsonl'} has a line that has a record of the wrong shape (line 2: "
                               f"{why}); was it written by train.py?")


RL_LINES = ['{"kind": "eval", "iter": 0, "pass_at_1": 0.4, "accuracy": 0.6, "elapsed_s": 1.0}',  # an earlier rl.py's
            '{"kind": "rl", "iter": 1, "reward": 0.5, "answer_tokens": 4.5, "elapsed_s": 2.0}',
            '{"kind": "rl_eval", "iter": 1, "pass_at_1": 0.5, "accuracy": 0.7, "elapsed_s": 3.0}']


def test_rl_py_s_records_are_read_and_an_earlier_rl_py_s_eval_record_is_its_held_out_scores(tmp_path):
    """rl.py's held-out scores were once written as kind 'eval', train.py's val loss: read, they are rl_eval."""
    write_metrics(tmp_path, RL_LINES)
    records = read_metrics(tmp_path)
    assert [r["kind"] for r in records] == ["rl_eval", "rl", "rl_eval"] and records[0]["pass_at_1"] == 0.4


def test_a_diverged_runs_nan_loss_is_read_as_it_was_logged(tmp_path):
    """train.py logs the NaN loss that stops a run that diverged: the curves keep it (a gap), nothing is refused."""
    write_metrics(tmp_path, [json.dumps(RECORDS[0]), '{"kind": "eval", "iter": 5, "train_loss": NaN, '
                                                     '"val_loss": NaN, "elapsed_s": 2.0}'])
    records = read_metrics(tmp_path)
    assert len(records) == 2 and math.isnan(records[1]["val_loss"]) and records.left_out == []
