"""A run's folder (gptkit/run/run_folder.py): one run at a time holds it, and a run refuses at its start, before any
work, a folder (or a file in it) it could not write, and a bookkeeping file that is a link out of the folder."""

import os
import re
import signal
from pathlib import Path

import pytest
import torch

import train
from conftest import (Run, assert_one_error_line, check_ok, logged, run_here, run_script, train_args, train_cmd,
                      wait_for_iteration)
from gptkit.base.errors import UserError
from gptkit.run.run_folder import RunDir
from test_analyze import saved_run
from test_checkpoints import files, rewrite
from test_resume import train_again

# ---------------------------------------------------------------------------------------------- the lock

def test_a_second_run_on_the_same_out_dir_is_refused(tmp_path, data_dir):
    """While one run trains, another on its out_dir stops at once with one line and writes nothing; the first
    goes on undisturbed (its log is its own), and once it has stopped, the folder is free again."""
    out = tmp_path / "out"
    args = ["--max_iters=100000", "--eval_interval=5", "--eval_iters=1", "--log_interval=1", "--init_from=auto"]
    first = Run(train_cmd(data_dir, out, *args), tmp_path / "first")
    try:
        wait_for_iteration(first, out, 3)
        with pytest.raises(UserError) as info:
            train.main(train_args(data_dir, out, *args))
        assert str(info.value) == (f"{out} is in use by another run (process {first.proc.pid}); wait for it to end "
                                   "or pick another --out_dir")
        seen = max(logged(out))
        wait_for_iteration(first, out, seen + 3)
    finally:
        first.proc.send_signal(signal.SIGTERM)
    assert first.wait() == 143
    assert sorted(logged(out)) == list(range(1, max(logged(out)) + 1))  # one run's records, each once
    train.main(train_args(data_dir, out, *args[1:], "--max_iters=1"))  # free: resumes, has nothing left to do


def test_the_lock_is_never_taken_through_a_link(tmp_path, outside):
    """A link at run.lock's name, made after the run's check at its start, is refused and never written through;
    without it, the lock is a file of its own."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.check_folder = lambda: None  # the link appears after the check
    (run.path / "run.lock").symlink_to(outside)
    with pytest.raises(UserError, match="run.lock is a link"):
        with run.locked():
            pass
    assert outside.read_text() == "precious\n"
    (run.path / "run.lock").unlink()
    del run.check_folder
    with run.locked():  # without the link, the lock is a file of its own
        assert (run.path / "run.lock").read_text().strip().isdigit()


def test_a_run_that_fails_before_writing_leaves_no_folder_it_made(tmp_path):
    """train.py with a dataset that is not there, into an out_dir it would make (two levels deep): one line, and
    no folder left behind. A folder that was there stays, and so does one the run wrote in."""
    missing = [f"--data_dir={tmp_path / 'data'}", "--dataset=mine"]
    with pytest.raises(UserError, match="dataset folder .*mine not found"):
        train.main([*missing, f"--out_dir={tmp_path / 'runs' / 'out-mine'}"])
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "there").mkdir()
    with pytest.raises(UserError):
        train.main([*missing, f"--out_dir={tmp_path / 'there' / 'out'}"])
    assert [p.name for p in tmp_path.iterdir()] == ["there"] and not any((tmp_path / "there").iterdir())
    run = RunDir(tmp_path / "written")
    with pytest.raises(KeyboardInterrupt), run.locked():
        (run.path / "metrics.jsonl").write_text("")
        raise KeyboardInterrupt
    assert sorted(p.name for p in run.path.iterdir()) == ["metrics.jsonl", "run.lock"]


def test_an_empty_out_dir_is_refused_not_taken_as_the_folder_you_are_in(tmp_path, data_dir):
    """--out_dir= (a shell variable left unset) would put a run's files among yours: one line, nothing written."""
    line = "error: out_dir is empty: name the run's folder (--out_dir=. for the folder you are in)"
    proc = run_script("train.py", *train_args(data_dir, "", "--max_iters=1"), cwd=tmp_path)
    assert proc.returncode == 1 and assert_one_error_line(proc.stderr, line)
    assert list(tmp_path.iterdir()) == []
    for script in ("sample.py", "rl.py", "chat.py"):
        proc = run_here(script, "--out_dir=")
        assert proc.returncode == 1 and assert_one_error_line(proc.stderr, line)


# ---------------------------------------------------------------------------------------------- links

@pytest.mark.parametrize("name", ["run.lock", "metrics.jsonl", "latest.pt.tmp", "best.pt.tmp", "latest.pt",
                                  "best.pt"])
def test_a_run_refuses_a_bookkeeping_file_that_is_a_link(tmp_path, data_dir, outside, name):
    """run.lock as a user runs it, the others in this process."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(outside)
    train_py = run_script if name == "run.lock" else run_here
    proc = train_py("train.py", *train_args(data_dir, out, "--max_iters=2", "--eval_interval=1"))
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {out / name} is a link, and the tool writes this file itself*")
    assert outside.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == [name]  # refused before anything was written


def test_a_run_refuses_a_snapshots_folder_that_is_a_link(tmp_path, data_dir, outside):
    """A run writes its snapshots there, and a resume removes those past its step: through a link, another run's."""
    out, theirs = tmp_path / "out", outside.parent / "snapshots"
    theirs.mkdir()
    (theirs / "iter_40.pt").write_bytes(b"another run's snapshot")
    out.mkdir()
    (out / "snapshots").symlink_to(theirs)
    proc = run_here("train.py", *train_args(data_dir, out, "--max_iters=2", "--eval_interval=1"))
    assert_one_error_line(proc.stderr, f"error: {out / 'snapshots'} is a link; a run keeps its snapshots in a folder "
                                       "of its own, never written or removed through a link: remove it")
    assert [p.name for p in theirs.iterdir()] == ["iter_40.pt"]
    assert sorted(p.name for p in out.iterdir()) == ["snapshots"]


@pytest.mark.parametrize("where", ["the snapshot", "the snapshots folder", "/dev/zero"])
def test_a_snapshot_is_never_opened_through_a_link(tmp_path, outside, where):
    """A link in a snapshot's place (to another run's file, or to /dev/zero), or a snapshots folder that is a link,
    is one line naming it, and nothing is read through it."""
    out = tmp_path / "out"
    (out / "snapshots").mkdir(parents=True)
    link = out / "snapshots" if where == "the snapshots folder" else out / "snapshots" / "iter_5.pt"
    if where == "the snapshots folder":
        (out / "snapshots").rmdir()
        (outside.parent / "iter_5.pt").write_bytes(b"another run's snapshot")
        link.symlink_to(outside.parent)
    else:
        link.symlink_to("/dev/zero" if where == "/dev/zero" else outside)
    proc = run_here("sample.py", f"--out_dir={out}", "--checkpoint=iter:5", "--device=cpu")
    assert_one_error_line(proc.stderr, f"error: {link} is a link; a run's snapshots are opened only as its own "
                                       "files, never through a link*")
    assert outside.read_text() == "precious\n"


@pytest.mark.parametrize("case", ["its own", "another step's", "another run's", "another run's, no best.pt"])
def test_a_snapshot_of_another_step_or_run_is_refused_in_one_line(tmp_path, case):
    """A snapshot copied in from another step, or from another run (a model of another shape than the run's own
    best.pt, else latest.pt), opened as this run's weights at the step its name says: one line names what it holds,
    and that it is not this run's."""
    out = saved_run(tmp_path / "out")
    if case.endswith("no best.pt"):
        (out / "best.pt").rename(out / "latest.pt")
    other = saved_run(tmp_path / "other", **({"n_layer": 1} if "run's" in case else {}))
    rewrite(other / "best.pt", ("iter_num",), 7 if case == "another step's" else 5)
    RunDir(out).snapshots.mkdir()
    (other / "best.pt").rename(RunDir(out).snapshot(5))
    proc = run_here("sample.py", f"--out_dir={out}", "--checkpoint=iter:5", "--device=cpu", "--num_samples=1",
                    "--max_new_tokens=2")
    if case == "its own":
        check_ok(proc)
        return
    held = "7 of a 2 x 32" if case == "another step's" else "5 of a 1 x 32"
    assert_one_error_line(proc.stderr, f"error: {out / 'snapshots' / 'iter_5.pt'} holds iteration {held} model, "
                                       "not this run's step 5 (2 x 32); remove it")


# ---------------------------------------------------------------------------------------------- a folder to save in

@pytest.mark.parametrize("what", ["the folder", "metrics.jsonl", "best.pt", "run.lock"])
def test_a_run_folder_that_cannot_be_written_is_refused_before_any_work(run, data_dir, immutable, what):
    """A run resumed into a folder (or onto a file) it cannot write stops at start-up with one line, rather
    than train to its first save and fail there; nothing in the folder changes. The folder as a user runs it, the
    files in this process."""
    target = run if what == "the folder" else run / what
    before = files(run)
    immutable(target)
    proc = train_again(run, data_dir, "auto", 40, "--eval_interval=5",
                       runner=run_script if what == "the folder" else run_here)
    assert proc.returncode == 1 and "iter " not in proc.stdout, proc.stdout
    expected = (f"error: cannot write to out_dir {run} (a run saves its state there); make it writable or pick "
                "another --out_dir" if what == "the folder" else
                f"error: cannot write {target}, which a run writes; make it writable or pick another --out_dir")
    assert_one_error_line(proc.stderr, expected)
    assert files(run) == before


def test_a_folder_this_user_may_not_write_is_refused_before_any_work(run, data_dir, monkeypatch):
    """What a user who is not root sees of a folder they made read-only (chmod a-w), with os.access answering
    as it would for them: root's os.access says yes to any mode, so here it is made to say no. Tested through
    train.main, so no work starts and the file system is untouched."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != run and real_access(path, mode, **kw))
    before = files(run)
    with pytest.raises(UserError) as info:
        train.main(train_args(data_dir, run, "--init_from=auto", "--max_iters=40"))
    assert str(info.value) == f"cannot write to out_dir {run} (a run saves its state there); make it writable " \
                              "or pick another --out_dir"
    assert files(run) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: chmod cannot test this")
def test_a_read_only_folder_is_refused_before_any_work(run, data_dir):
    run.chmod(0o555)
    try:
        proc = run_script("train.py", *train_args(data_dir, run, "--init_from=auto", "--max_iters=40"))
    finally:
        run.chmod(0o755)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: cannot write to out_dir {run}*")


def test_a_model_loaded_after_model_py_changed_says_what_changed(run, capsys):
    """A checkpoint keeps the fingerprint of every piece of model.py it trained with; loaded after one changed (as
    a learner's later edit would), one note on stderr names it, and nothing is said while they agree."""
    from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
    from gptkit.run.run_folder import model_at

    path = run / "best.pt"
    model_at(path)
    assert capsys.readouterr().err == ""
    ckpt = load_checkpoint(path)
    assert set(ckpt["model_code"]) >= {"relu_squared", "SelfAttention.pattern", "GPT.forward"}
    ckpt["model_code"]["relu_squared"] = "0" * 16  # what an edit since the run made of it
    save_checkpoint(ckpt, path)
    model_at(path)
    assert capsys.readouterr().err == (f"note: model.py has changed since {path} was trained (relu_squared): the model "
                                       "runs the code as it is now, which may not be what it learned with\n")
    # an option taken out of model.py since: its one line alone, not after a note that the model runs as it is now
    ckpt["model_args"]["mlp_width"] = "8x"
    save_checkpoint(ckpt, path)
    with pytest.raises(UserError, match=r"GPTConfig does not define \(mlp_width\): an option taken out of model"):
        model_at(path)
    assert capsys.readouterr().err == ""


def test_a_tool_that_watches_hooks_notes_an_edit_its_passes_cannot_run(run, capsys, monkeypatch):
    """analyze.py, the explorer and plot.py attention load with watched=True: an edited sdpa runs in the model but
    not in a pass that watches the pattern, which they are told; sample.py's load says nothing of it."""
    import model as model_py
    from gptkit.machine.stand_ins import unwatched_edits
    from gptkit.run.run_folder import model_at

    monkeypatch.setattr(model_py.SelfAttention, "sdpa", lambda self, q, k, v: 2 * torch.nn.functional.
                        scaled_dot_product_attention(q, k, v, is_causal=True))
    model_at(run / "best.pt")
    assert "a pass that watches" not in capsys.readouterr().err
    model_at(run / "best.pt", watched=True)
    assert capsys.readouterr().err.endswith(unwatched_edits() + "\n")


def test_a_tool_that_watches_hooks_notes_a_scale_set_in_init_its_passes_cannot_run(tmp_path, capsys, monkeypatch):
    """The √d dropped where model.py's __init__ sets SDPA's scale (self.scale = 1.0): the model trains and samples
    on SDPA with it, and a pass that watches the pattern writes out the score function's scale instead: plot.py
    attention drew a scaled model's weights without a word. Now the tools that watch hooks say so."""
    import model as model_py
    from gptkit.run.run_folder import model_at
    from test_analyze import saved_run

    run = saved_run(tmp_path / "run")
    init = model_py.SelfAttention.__init__

    def unscaled(self, config):
        init(self, config)
        self.scale = 1.0
    monkeypatch.setattr(model_py.SelfAttention, "__init__", unscaled)
    model_at(run / "best.pt")
    assert "a pass that watches" not in capsys.readouterr().err
    model_at(run / "best.pt", watched=True)
    assert capsys.readouterr().err.startswith("note: model.py's SelfAttention.__init__ is edited, but a pass that "
                                              "watches the attention pattern")


def test_two_start_overs_within_a_second_each_keep_their_runs_files(tmp_path, monkeypatch):
    """The folder each old run moves to is named by the second it moved; a second start over in that second
    gets a folder of its own (mkdir failed there with FileExistsError)."""
    monkeypatch.setattr("time.strftime", lambda fmt: "20261130-010203")
    run, notes = RunDir(tmp_path / "out"), []
    run.path.mkdir()
    for content in (b"first", b"second"):
        run.metrics.write_bytes(content)
        run.clear_for_a_new_run(True, "", notes.append)
    assert (run.path / "replaced-20261130-010203" / "metrics.jsonl").read_bytes() == b"first"
    assert (run.path / "replaced-20261130-010203-2" / "metrics.jsonl").read_bytes() == b"second"
    assert notes[1].endswith(f"metrics.jsonl moved to {run.path / 'replaced-20261130-010203-2'}")


def stopped_at_start(path, *records):
    """A folder as a run stopped during its first evaluation leaves it: records of iteration 0, the snapshot of
    iteration 0, no state."""
    run = RunDir(path)
    run.snapshots.mkdir(parents=True)
    run.snapshot(0).write_bytes(b"the weights it started from")
    run.metrics.write_text("".join(f'{{"kind": "{kind}", "iter": {it}}}\n' for kind, it in records))
    return run


def test_a_run_stopped_before_its_first_step_is_no_other_run_to_the_same_command(tmp_path):
    """Its line says no step was trained, and the same command, started again, was refused as over another run
    (continue it with --init_from=auto, which refused too: no saved state). It trained nothing: a new run starts in
    its place, and a note says what was there."""
    run, notes = stopped_at_start(tmp_path / "out", ("run", 0), ("eval", 0), ("timeline", 0)), []
    run.clear_for_a_new_run(False, "; continue it with --init_from=auto,", notes.append)
    assert notes == [f"note: {run.path} holds a run stopped before its first step (metrics.jsonl, snapshots: its "
                     "records and snapshot of iteration 0); it trained nothing, and a new run starts in its place"]
    assert sorted(p.name for p in run.path.iterdir()) == []


def test_init_from_auto_starts_anew_over_a_run_killed_before_it_saved_a_state_and_keeps_its_records(tmp_path):
    """kill -9 before the first save leaves records and no state: the same --init_from=auto command, run again (a
    job requeued), was refused every time. It starts anew, the old records moved aside."""
    run, notes = stopped_at_start(tmp_path / "out", ("run", 0), ("eval", 0), ("train", 10)), []
    run.clear_for_a_new_run(False, " but no saved state to continue it from (latest.pt);", notes.append, auto=True)
    assert notes[0] == (f"note: {run.path} holds a run stopped before it saved a state to continue from "
                        "(metrics.jsonl, snapshots): --init_from=auto starts it anew")
    assert notes[1].startswith(f"note: starting over in {run.path}: the previous run's metrics.jsonl, snapshots "
                               "moved to ")
    aside = next(run.path.glob("replaced-*"))
    assert (aside / "metrics.jsonl").exists() and (aside / "snapshots" / "iter_0.pt").exists()
    assert not run.metrics.exists()


def test_a_run_that_took_a_step_or_files_not_a_runs_are_still_refused(tmp_path):
    """Records past iteration 0 (two Ctrl-Cs stopped it before it saved), a line of the user's, a later snapshot:
    kept, and the line says the run saved no state to continue from, and how to start anew."""
    said = "holds a run stopped before it saved a state to continue from (metrics.jsonl, snapshots): start it anew " \
           "with --start_over=True"
    for name, records in (("stepped", [("run", 0), ("eval", 0), ("train", 1)]), ("odd", [("run", 0)])):
        run = stopped_at_start(tmp_path / name, *records)
        if name == "odd":
            run.metrics.write_text('{"kind": "run", "iter": 0}\nmy notes\n')
        with pytest.raises(UserError, match=re.escape(said)):
            run.clear_for_a_new_run(False, ";", print)
        assert run.metrics.exists() and run.snapshot(0).exists()
    run = stopped_at_start(tmp_path / "more", ("run", 0))
    (run.snapshots / "iter_0.pt").rename(run.snapshots / "iter_4.pt")
    with pytest.raises(UserError, match=re.escape(said)):
        run.clear_for_a_new_run(False, ";", print)
    (run.path / "best.pt").write_text("x")  # a model of its own: another run
    with pytest.raises(UserError, match="holds another run"):
        run.clear_for_a_new_run(False, ";", print)


# ---------------------------------------------------------------------------------------------- its model

def test_a_best_pt_that_cannot_load_beside_a_latest_pt_names_the_setting_that_loads_that(tmp_path):
    """sample.py, chat.py, analyze.py, plot.py, export.py and rl.py read a run's best.pt by default: damaged, with
    the run's latest.pt beside it, the line says how to load that instead, with the tool's own setting."""
    from gptkit.run.run_folder import model_of

    folder = saved_run(tmp_path / "out")
    best = folder / "best.pt"
    best.write_bytes(best.read_bytes()[:1000])
    with pytest.raises(UserError) as caught:
        model_of(folder)
    assert str(caught.value).startswith(f"{best} is damaged") and "may still load" not in str(caught.value)
    (folder / "latest.pt").write_bytes(saved_run(tmp_path / "other").joinpath("best.pt").read_bytes())
    for option in ("checkpoint", "init_checkpoint"):
        with pytest.raises(UserError) as caught:
            model_of(folder, option=option)
        assert str(caught.value).endswith(f"(truncated or appended to); the run's latest state may still load: "
                                          f"--{option}=latest")
    assert model_of(folder, "latest")[2]["model_args"]  # as the line says


def test_a_best_pt_that_is_a_link_to_nowhere_is_named_not_taken_for_one_never_written(tmp_path):
    """A dangling best.pt was said as 'no best.pt yet (the run has not finished an evaluation)'."""
    from gptkit.run.run_folder import RunDir

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "best.pt").symlink_to(tmp_path / "gone.pt")
    with pytest.raises(UserError) as caught:
        RunDir(folder).model_file("best")
    assert str(caught.value) == f"{folder / 'best.pt'} is a link to nowhere ({tmp_path / 'gone.pt'}): put its file " \
                                "back, or remove it"
    (folder / "latest.pt").write_bytes(b"x")
    with pytest.raises(UserError, match="; the run's latest state may still load: --checkpoint=latest$"):
        RunDir(folder).model_file("best")


@pytest.mark.parametrize("name", ["metrics.jsonl", "latest.pt", "run.lock"])
def test_a_fifo_where_the_run_writes_a_file_is_one_line_not_a_wait_forever(tmp_path, name):
    """A FIFO at metrics.jsonl hung a new run: reading it to see whether a run stopped before its first step
    waited for a writer that never came."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / name)
    with pytest.raises(UserError, match=rf"^{re.escape(str(out / name))} is a FIFO \(a named pipe\) where the run "
                                        "writes a file; move it out of the way$"):
        RunDir(out).check_folder()


def test_an_out_dir_that_is_a_link_to_nothing_is_one_line_saying_so(tmp_path):
    """It was `cannot write to out_dir ... (File exists)`: the link is there, what it leads to is not."""
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(UserError, match=rf"^out_dir {re.escape(str(link))} is a link to .*gone, which is not there"):
        RunDir(link).check_folder()
