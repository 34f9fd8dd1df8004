"""Continuing a run (gptkit/training/resume.py, through train.py --init_from=resume and auto): after SIGKILL, a kill in
the middle of a checkpoint write, or a stop signal, on one process or two, a resumed run logs the uninterrupted run's
losses exactly; a damaged latest state falls back to the one before it, and damage it cannot pass is one line that
names the file and the field; a resumed run keeps its saved settings but those given again; a finished run says so; a
fresh run never takes over a folder that holds another."""

import json
import re
import shutil
import signal
import sys

import pytest
import torch
import torch.distributed as dist

import train
from conftest import (REPO, TRAINED_RUN, Run, assert_one_error_line, check_ok, faulty_train, logged, run_here,
                      run_script, torchrun, train_args, train_cmd, wait_for_iteration)
from gptkit.base.errors import UserError
from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
from gptkit.run.metrics import read_metrics
from test_checkpoints import DELETE, damage, digest, files, rewrite

ITERS = 120  # long enough that a kill lands mid-run; a CPU step here takes a few milliseconds
COMMON = [f"--max_iters={ITERS}", "--log_interval=1", "--eval_interval=5", "--eval_iters=2",
          "--always_save_checkpoint=True", "--dropout=0.1", "--warmup_iters=5"]
CONFIGS = {  # dropout makes the torch RNG matter, accumulation the sampler's state between micro-batches
    "adamw": ["--optimizer=adamw"],
    "muon-accum2": [  # the weight average must come back too: a rate decayed early makes it lag the weights
        "--optimizer=muon", "--gradient_accumulation_steps=2", "--batch_order=epochs", "--ema_decay=0.9",
        "--lr_decay_iters=20"],
    "ddp": ["--optimizer=adamw", "--gradient_accumulation_steps=2"],  # 2 processes under torchrun, 1 micro-batch each
}
LOSS_TOL = 1e-6


# ---------------------------------------------------------------------------------------------- helpers

def assert_same_losses(resumed_dir, reference):
    """Every iteration's loss (and learning rate, and every evaluation) equals the uninterrupted run's."""
    for kind, field, tol in [("train", "loss", LOSS_TOL), ("train", "adamw_lr", 0.0), ("eval", "val_loss", LOSS_TOL)]:
        resumed, straight = logged(resumed_dir, kind, field), reference[kind, field]
        assert sorted(resumed) == sorted(straight) and len(straight) >= ITERS // 5, (kind, sorted(resumed))
        for i in straight:
            assert abs(resumed[i] - straight[i]) <= tol, (
                f"iteration {i}: resumed {field} {resumed[i]!r} != uninterrupted {straight[i]!r}")


def command(name, data_dir, out, *extra, script=REPO / "train.py"):
    """The command line of a run of config `name` (under torchrun for 'ddp')."""
    cmd = train_cmd(data_dir, out, *COMMON, *CONFIGS[name], *extra, script=script)
    return torchrun(*cmd[1:]) if name == "ddp" else cmd


@pytest.fixture(scope="module")
def reference(workdir, data_dir):
    """Uninterrupted runs of every config, started together in the background; get(name) waits for one."""
    runs = {name: Run(command(name, data_dir, workdir / f"ref-{name}"), workdir / f"ref-{name}-log")
            for name in CONFIGS}
    cache = {}

    def get(name):
        if name not in cache:
            runs[name].check_ok()
            cache[name] = {(kind, field): logged(workdir / f"ref-{name}", kind, field)
                           for kind, field in [("train", "loss"), ("train", "adamw_lr"), ("eval", "val_loss")]}
            assert sorted(cache[name]["train", "loss"]) == list(range(1, ITERS + 1))
        return cache[name]

    yield get
    for run in runs.values():
        run.kill_group()


def stopped_line(signame, out):
    return re.compile(rf"error: stopped by {signame} at iteration (\d+); latest state saved to "
                      rf"{re.escape(str(out / 'latest.pt'))}, continue with --init_from=auto")


def resume(data_dir, out, *extra):
    """A command line that says only where the data and the run are: everything else comes from the run."""
    return [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out}", "--init_from=auto", *extra]


def train_again(run, data_dir, init_from, max_iters, *extra, runner=run_script):
    """train.py on the tiny dataset into the copied run folder, continuing it as init_from says (in a process of
    its own, or with runner=run_here in this one)."""
    return runner("train.py", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={run}",
                  f"--init_from={init_from}", f"--max_iters={max_iters}", *extra)


# ---------------------------------------------------------------------------------------------- exact resume

def test_sigkill_then_resume_gives_the_uninterrupted_losses(tmp_path, data_dir, reference):
    """SIGKILL mid-interval (past a checkpoint), resume: every later loss equals the uninterrupted run's.
    The run logs to wandb (offline): the resumed run continues the same wandb run id. (Muon and gradient
    accumulation resume exactly too: see the SIGUSR1 case below.)"""
    out = tmp_path / "out"
    args = [*COMMON, *CONFIGS["adamw"], "--wandb_log=True"]
    run = Run(train_cmd(data_dir, out, *args), tmp_path / "killed")
    seen = wait_for_iteration(run, out, 12)
    run.proc.send_signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    killed_at = max(logged(out))
    assert seen <= killed_at < ITERS, "the run finished before the kill landed"
    ckpt = load_checkpoint(out / "latest.pt")
    assert 5 <= ckpt["iter_num"] <= killed_at and ckpt["iter_num"] % 5 == 0
    json.dumps(ckpt["tokenizer"])  # the tokenizer travels as plain JSON-able data

    Run(train_cmd(data_dir, out, *args, "--init_from=resume"), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference("adamw"))
    assert load_checkpoint(out / "latest.pt")["iter_num"] == ITERS
    runs = sorted((out / "wandb").glob("offline-run-*"))  # one per process, each with its log, one run id
    assert len(runs) == 2 and ckpt["wandb_id"], runs
    assert all(r.name.endswith("-" + ckpt["wandb_id"]) and list(r.glob("*.wandb")) for r in runs), runs


def test_kill_during_checkpoint_write_keeps_the_previous_one(tmp_path, data_dir, reference):
    """SIGKILL while latest.pt.tmp is half written (its second save, at iteration 10): latest.pt is still the one
    from iteration 5, the .tmp is never loaded, and resuming from 5 reproduces the uninterrupted losses."""
    out = tmp_path / "out"
    extra = [*COMMON, *CONFIGS["adamw"]]
    script = faulty_train(tmp_path, kill=("latest.pt", 2))
    run = Run(train_cmd(data_dir, out, *extra, script=script), tmp_path / "killed")
    assert run.wait() == -signal.SIGKILL
    tmp = out / "latest.pt.tmp"
    assert 0 < tmp.stat().st_size <= 4096
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 5 and not (out / "latest.prev.pt").exists()
    assert max(logged(out)) == 10
    with pytest.raises(Exception):
        torch.load(tmp, weights_only=True)  # what the .tmp holds is not a checkpoint

    Run(train_cmd(data_dir, out, *extra, "--init_from=auto"), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference("adamw"))
    assert not tmp.exists()  # a later save replaced it


@pytest.mark.parametrize("signame,name,at", [("SIGTERM", "adamw", 12), ("SIGUSR1", "muon-accum2", 10)])
def test_stop_signal_saves_and_auto_resumes_exactly(signame, name, at, tmp_path, data_dir, reference):
    """A scheduler's SIGTERM or SLURM's SIGUSR1 arriving during step N (mid-interval, or at an evaluation that has
    just saved): the step finishes, latest.pt holds it, the exit status is 128 + the signal, and the same
    command with --init_from=auto, which started from scratch the first time, continues exactly. (Ctrl-C takes
    the same path: see test_checkpoints.py.)"""
    out = tmp_path / "out"
    args = [*COMMON, *CONFIGS[name], "--init_from=auto"]
    script = faulty_train(tmp_path, signal=(signame, at, [0]))
    run = Run(train_cmd(data_dir, out, *args, script=script), tmp_path / "stop")
    rc = run.wait()
    assert rc == 128 + getattr(signal, signame), f"exit {rc}\nstderr:\n{run.stderr}"
    m = stopped_line(signame, out).fullmatch(assert_one_error_line(run.stderr))
    assert m and int(m.group(1)) == at == max(logged(out)), run.stderr
    assert load_checkpoint(out / "latest.pt")["iter_num"] == at

    Run(train_cmd(data_dir, out, *args), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference(name))


needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")


def stops_of_both_ranks(run, signame, out):
    """The iteration each rank said it stopped at; they must agree, and each says it in its one line."""
    stops = [int(m.group(1)) for m in stopped_line(signame, out).finditer(run.stderr)]
    assert len(stops) == 2 and stops[0] == stops[1], run.stderr
    assert "Traceback" not in run.stderr.split("error: stopped by")[1]  # (torchrun itself may print one later)
    ckpt = load_checkpoint(out / "latest.pt")
    assert ckpt["iter_num"] == stops[0] == max(logged(out)) and len(ckpt["rng"]) == 2
    return stops[0]


@needs_gloo
def test_ddp_stop_signals_stop_every_rank_at_one_step_and_auto_resumes_exactly(tmp_path, data_dir, reference):
    """Two processes under torchrun, one command run three times: SIGUSR1 reaches rank 1 alone during step 9 and
    both ranks stop after it; then a scheduler's SIGTERM reaches torchrun mid-run, which passes it on to its
    processes (each in a session of its own), and both stop at one step; then the run finishes. Every loss
    equals an uninterrupted run's."""
    out = tmp_path / "out"
    script = faulty_train(tmp_path, signal=("SIGUSR1", 9, [1]))
    first = Run(command("ddp", data_dir, out, "--init_from=auto", script=script), tmp_path / "usr1")
    assert first.wait(timeout=90) != 0
    assert stops_of_both_ranks(first, "SIGUSR1", out) == 9

    second = Run(command("ddp", data_dir, out, "--init_from=auto"), tmp_path / "term")
    wait_for_iteration(second, out, 17)
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(timeout=90) != 0
    assert 17 <= stops_of_both_ranks(second, "SIGTERM", out) < ITERS

    Run(command("ddp", data_dir, out, "--init_from=auto"), tmp_path / "rest").check_ok()
    assert_same_losses(out, reference("ddp"))


# ---------------------------------------------------------------------------------------------- damage

def flip(path, offset=-100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def nan_optimizer_state(path):
    """Rewrite path with a NaN in its optimizer state and a valid checksum: damage done before it was saved."""
    ckpt = load_checkpoint(path)
    state = next(iter(ckpt["optimizer"][0]["state"].values()))
    state["exp_avg"].view(-1)[0] = float("nan")
    save_checkpoint({k: v for k, v in ckpt.items() if k != "format_version"}, path)


@pytest.mark.parametrize("how", ["flipped byte", "missing", "nan in the optimizer state", "a field of the wrong kind",
                                 "a saved setting of the wrong type"])
def test_a_damaged_latest_state_falls_back_to_the_one_before(run, data_dir, capsys, how):
    """The note, the first line the run prints, names latest.pt, what is wrong with it and the state resumed from
    (iteration 20); the steps after it are trained again and log the very losses the first run logged. The last
    two are damage a checksum cannot see: a file whose checksum is right but whose fields are not what this tool
    writes."""
    first = logged(run)
    latest, extra = run / "latest.pt", []
    if how == "flipped byte":
        flip(latest)
    elif how == "missing":  # a crash between the two renames of a save
        latest.unlink()
    elif how == "nan in the optimizer state":
        nan_optimizer_state(latest)
    elif how == "a field of the wrong kind":
        damage(latest, "best_val_loss a string")
        extra = ["--init_from=resume"]
    else:
        rewrite(latest, ("config", "learning_rate"), "x")
    train.main(resume(data_dir, run, *extra))
    note = capsys.readouterr().out.splitlines()[0]
    expected = {"flipped byte": "is damaged: its contents do not match the checksum written with them",
                "missing": "is missing (its save was interrupted)",
                "nan in the optimizer state": "is damaged: non-finite values in exp_avg of its optimizer state",
                "a field of the wrong kind": "is damaged: best_val_loss is 'x', not a loss (a number of at least 0)",
                "a saved setting of the wrong type": "is damaged: its saved config: learning_rate must be float, "
                                                     "got 'x'"}
    resumed_from = f"; resuming from {run / 'latest.prev.pt'} (iteration 20)"
    if how in ("a field of the wrong kind", "a saved setting of the wrong type"):
        assert note == f"note: {latest} {expected[how]}{resumed_from}"
    assert note.startswith(f"note: {latest} {expected[how]}")
    assert note.endswith(resumed_from)
    again = logged(run)
    assert sorted(again) == sorted(first) and all(abs(again[i] - first[i]) <= 1e-6 for i in first)
    assert load_checkpoint(latest)["iter_num"] == 30


def test_every_saved_state_damaged_is_one_error_naming_each(run, data_dir):
    flip(run / "latest.pt")
    nan_optimizer_state(run / "latest.prev.pt")
    before = {p.name: digest(p) for p in run.glob("*.pt")}
    with pytest.raises(UserError) as info:
        train.main(resume(data_dir, run))
    message = str(info.value)
    assert message.startswith(f"{run / 'latest.pt'} is damaged: its contents do not match") and "\n" not in message
    assert f"; {run / 'latest.prev.pt'} is damaged: non-finite values in exp_avg" in message
    assert {p.name: digest(p) for p in run.glob("*.pt")} == before


@pytest.mark.parametrize("case", ["best_val_loss a string", "vocabulary not a string", "a weight not a tensor",
                                  "python random state", "optimizer state not a dict"])
def test_resume_refuses_a_damaged_field_in_one_line(run, data_dir, case):
    """train.py --init_from=resume, with the state before the latest gone: one line names the field, and no
    file changes. The first case as a user runs it, the others in this process."""
    (run / "latest.prev.pt").unlink()
    path = run / "latest.pt"
    problem = damage(path, case)
    before = files(run)
    proc = train_again(run, data_dir, "resume", 40,
                       runner=run_script if case == "best_val_loss a string" else run_here)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {path} is damaged: {problem}")
    assert files(run) == before


def test_resume_without_iter_num_is_one_line(run, data_dir):
    (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("iter_num",), DELETE)
    proc = train_again(run, data_dir, "resume", 40)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {run / 'latest.pt'} is incomplete: it lacks iter_num")


@pytest.mark.parametrize("before_it", [False, True])
def test_resuming_an_rl_runs_state_says_rl_py_continues_it(run, data_dir, before_it):
    """Refused in one line, and no file changes, with a state of train.py's before it too (latest.prev.pt):
    resuming that one, as a damaged latest.pt's fallback, saved over the RL state."""
    if not before_it:
        (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("best_val_loss",), DELETE)  # as rl.py's state lacks what train.py's loop keeps
    rewrite(run / "latest.pt", ("rl",), {"state": {}})
    before = files(run)
    proc = train_again(run, data_dir, "auto", 40)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {run / 'latest.pt'} is the state of an rl.py run, which train.py "
                          "cannot continue; continue it with rl.py, or pick another --out_dir")
    assert files(run) == before


@pytest.mark.parametrize("which", ["latest.pt", "latest.prev.pt"])
def test_another_runs_state_copied_in_is_refused_before_any_file_changes(run, data_dir, tmp_path, which):
    """Another run's latest.pt copied into a run folder (or into the latest.prev.pt a resume falls back to) holds a
    model of another shape than the folder's best.pt: resumed, it dropped the run's later records and snapshots and
    put the other model in its best.pt. One line names both files and shapes, and no file changes."""
    other = tmp_path / "other"
    check_ok(run_here("train.py", *train_args(data_dir, other, "--max_iters=2", "--eval_interval=2",
                                              "--eval_iters=1")))
    if which == "latest.prev.pt":
        (run / "latest.pt").unlink()  # as a crash between the two renames of a save leaves it
    shutil.copy(other / "latest.pt", run / which)
    before = files(run)
    proc = train_again(run, data_dir, "auto", 25, runner=run_here)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {run / which} holds a 1 x 32 model, {run / 'best.pt'} a 2 x 32 "
                          "one: they are not one run's; move one away, or start over with --init_from=scratch "
                          "--start_over=True")
    assert files(run) == before


def test_a_damaged_best_pt_leaves_the_resume_to_go_on(run, data_dir):
    """best.pt tells a copied-in state from the run's own; damaged, it tells nothing, and the run resumes (its next
    best replaces it) rather than stop at a file it does not continue from."""
    (run / "best.pt").write_bytes((run / "best.pt").read_bytes()[:1000])
    proc = train_again(run, data_dir, "auto", 41, runner=run_here)
    check_ok(proc)
    assert "resuming from iteration 30 of 41" in proc.stdout


# a setting in a checkpoint's saved config that no run saves: (its key, the value written, what the line says)
SAVED_SETTINGS = {
    "a float a string": ("learning_rate", "x", "learning_rate must be float, got 'x'"),
    "an int a string": ("eval_iters", "4", "eval_iters must be int, got '4'"),
    "a flag a number": ("decay_lr", 2, "decay_lr must be bool, got 2"),
    "a choice no run makes": ("optimizer", "sgd", "optimizer must be one of adamw, muon (got 'sgd')"),
}


def test_resume_of_a_model_setting_model_py_no_longer_offers_says_so_not_damage(run, data_dir):
    """mlp_act='silu' added to model.py, trained with, then the edit undone: the state is whole, and the line says
    this version cannot build its model, as sample.py's does, rather than that it is damaged."""
    for name in ("latest.pt", "latest.prev.pt"):  # both saved while model.py had it
        rewrite(run / name, ("model_args", "mlp_act"), "silu")
    proc = train_again(run, data_dir, "auto", 40, runner=run_here)
    assert_one_error_line(proc.stderr, f"error: {run / 'latest.pt'} was written with model settings this version "
                                       "cannot build (mlp_act must be one of *")


@pytest.mark.parametrize("case", SAVED_SETTINGS)
def test_resume_refuses_a_saved_setting_of_the_wrong_type_in_one_line(run, data_dir, case):
    """A checksummed file whose saved config holds a value of another type: one line naming the file and the
    setting (it was a TypeError traceback from the config's range checks), and no file changes. The first case as
    a user runs it, the others in this process."""
    key, value, problem = SAVED_SETTINGS[case]
    (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("config", key), value)
    before = files(run)
    proc = train_again(run, data_dir, "auto", 40, runner=run_script if case == "a float a string" else run_here)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {run / 'latest.pt'} is damaged: its saved config: {problem}")
    assert files(run) == before


def test_a_saved_setting_out_of_range_is_named_and_can_be_given_again(run, data_dir):
    """A saved value of the right type but out of range: one line says it comes from the checkpoint; the same
    setting given again replaces it and the run goes on."""
    (run / "latest.prev.pt").unlink()
    rewrite(run / "latest.pt", ("config", "learning_rate"), -1.0)
    args = [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={run}", "--init_from=auto", "--max_iters=32"]
    proc = run_script("train.py", *args)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: learning_rate must be at least 0 (got -1.0), with the settings saved "
                                       f"in {run / 'latest.pt'} (give one again to replace its saved value)")
    proc = run_script("train.py", *args, "--learning_rate=1e-3")
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(run / "latest.pt")["config"]["learning_rate"] == 1e-3


# ---------------------------------------------------------------------------------------------- settings

def resume_args():
    """The trained run's own settings, to continue it with --init_from=resume."""
    return [*(a for a in TRAINED_RUN if not a.startswith("--max_iters")), "--init_from=resume"]


def test_resume_continues(trained_run, tmp_path, data_dir):
    out = tmp_path / "resumed"
    shutil.copytree(trained_run[0], out)
    check_ok(run_script("train.py", *train_args(data_dir, out, *resume_args(), "--max_iters=40")))
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 40
    assert sorted(logged(out)) == [5, 10, 15, 20, 25, 30, 35, 40]  # appended, no re-run of 1..30
    evals = [r["iter"] for r in read_metrics(out) if r["kind"] == "eval"]
    assert evals == [0, 10, 20, 30, 40]  # no extra evaluation at the resume point


def test_a_resume_continues_with_the_saved_settings_and_those_given_again(run, data_dir):
    """Given only where the data is, a resumed run is the saved one (its model shape, batch size, learning rate);
    a key given again, here learning_rate and max_iters, is honoured, by the optimizer too."""
    train.main(resume(data_dir, run, "--learning_rate=1e-3", "--max_iters=32"))
    ckpt = load_checkpoint(run / "latest.pt")
    cfg = ckpt["config"]
    assert (ckpt["iter_num"], cfg["max_iters"], cfg["learning_rate"], cfg["batch_size"]) == (32, 32, 1e-3, 8)
    assert (cfg["model"]["n_layer"], cfg["model"]["pos_emb"], cfg["model"]["block_size"]) == (2, "rope", 32)
    assert {g["base_lr"] for g in ckpt["optimizer"][0]["param_groups"]} == {1e-3}


def test_a_chat_run_continued_with_another_train_on_says_so_and_chooses_best_pt_anew(chat_run, tmp_path, capsys):
    """train_on chooses the tokens val loss counts: a note says old → new and what best.pt was chosen by, and the
    next evaluation writes best.pt, which the old count's best (the answers alone, an easier loss) kept before.
    Continued again with the new train_on, the run says nothing of it."""
    out = tmp_path / "out-chat"
    shutil.copytree(chat_run, out)
    was = load_checkpoint(out / "latest.pt")
    train.main([f"--out_dir={out}", "--init_from=auto", "--max_iters=7", "--train_on=all"])
    assert (f"note: train_on 'answers' → 'all': from here val loss counts every token, the questions' too, where it "
            f"counted the answers and the text mixed in; best.pt (iteration {was['best_iter']}, val loss "
            f"{was['best_val_loss']:.4f}) was chosen by the old measure, and the next evaluation replaces it\n") \
        in capsys.readouterr().out
    ckpt = load_checkpoint(out / "latest.pt")
    best = load_checkpoint(out / "best.pt")
    assert (ckpt["config"]["train_on"], ckpt["best_iter"], best["iter_num"]) == ("all", 7, 7)
    train.main([f"--out_dir={out}", "--init_from=auto", "--max_iters=8"])
    assert "train_on" not in capsys.readouterr().out


def test_a_run_continued_on_another_dataset_says_so_and_chooses_best_pt_anew(run, data_dir, tmp_path, capsys):
    """Val loss on another dataset's val split measures something else: a note says old → new, and the next
    evaluation writes best.pt though its loss (on the same lines written backwards) is above the old best. The
    same folder named by its path is the same dataset, and nothing is said."""
    from conftest import EXTRA_TEXT, make_text
    from gptkit.data.preparing import PrepareConfig, prepare

    text = "\n".join(line[::-1] for line in (make_text() + EXTRA_TEXT).split("\n"))  # the same characters
    (tmp_path / "backwards.txt").write_text(text, encoding="utf-8")
    prepare(PrepareConfig(input=str(tmp_path / "backwards.txt"), name="backwards", data_dir=str(tmp_path),
                          workers=1))
    capsys.readouterr()
    train.main(resume(data_dir, run, f"--dataset={data_dir / 'tiny'}", "--max_iters=40"))
    assert "note: dataset" not in capsys.readouterr().out
    kept = load_checkpoint(run / "latest.pt")
    train.main(resume(data_dir, run, f"--dataset={tmp_path / 'backwards'}", "--max_iters=50"))
    assert (f"note: dataset '{data_dir / 'tiny'}' → '{tmp_path / 'backwards'}': from here val loss is measured on "
            f"another val split; best.pt (iteration {kept['best_iter']}, val loss {kept['best_val_loss']:.4f}) was "
            "chosen by the old measure, and the next evaluation replaces it\n") in capsys.readouterr().out
    best = load_checkpoint(run / "best.pt")
    assert best["iter_num"] == 50 and best["val_loss"] > kept["best_val_loss"]


def test_a_run_continued_on_its_dataset_prepared_again_says_so_and_chooses_best_pt_anew(run, data_dir, capsys):
    """The same dataset name, other tokens (data/prepare.py run again there with --start_over=True): the state
    records the tokens it trained on, and the continued run says they changed, then writes best.pt anew."""
    from gptkit.data.dataset import load_meta, tokens_checksum

    ckpt = load_checkpoint(run / "latest.pt")
    assert ckpt["tokens"] == tokens_checksum(load_meta(str(data_dir), "tiny")[1])
    ckpt["tokens"] = "0" * 64  # the checksum of the tokens as they were then
    save_checkpoint(ckpt, run / "latest.pt")
    capsys.readouterr()
    train.main(resume(data_dir, run, "--max_iters=40"))
    assert (f"note: dataset 'tiny' was prepared again since the state was saved, other tokens under the same name: "
            f"the run goes on on them, and from here val loss is measured on its val split as it is now; best.pt "
            f"(iteration {ckpt['best_iter']}, val loss {ckpt['best_val_loss']:.4f}) was chosen by the old measure, and "
            "the next evaluation replaces it\n") in capsys.readouterr().out
    assert load_checkpoint(run / "best.pt")["iter_num"] == 40
    train.main(resume(data_dir, run, "--max_iters=50"))
    assert "prepared again" not in capsys.readouterr().out


def test_a_resume_after_an_edit_to_model_py_says_what_changed(run, data_dir, capsys, monkeypatch):
    """As sample.py does for a checkpoint: model.py changed since the state was saved is said in one note naming
    the pieces, since the run no longer continues exactly; unchanged, nothing is said."""
    import model as model_py

    def rms_norm(x, norm):  # an edit
        return x

    rms_norm.__module__ = "model"
    train.main(resume(data_dir, run, "--max_iters=31"))
    assert "model.py has changed" not in capsys.readouterr().out
    monkeypatch.setattr(model_py, "rms_norm", rms_norm)
    train.main(resume(data_dir, run, "--max_iters=32"))
    assert f"note: model.py has changed since {run / 'latest.pt'} was saved (rms_norm): the run continues with " \
        "the code as it is now, not the code it trained with so far\n" in capsys.readouterr().out


def test_a_run_its_budget_made_smaller_resumes_with_the_command_that_started_it(tmp_path, data_dir, capsys):
    """The config file still says the bigger shape and its decay: given again on resume they are what the run was
    fitted from, not other settings; the run keeps the smaller model and its decay. A shape that differs from
    both is refused."""
    out, preset = tmp_path / "fitted", tmp_path / "preset.py"
    preset.write_text("n_layer = 2\nn_embd = 32\nfit_shapes = '2x32, 1x32'\nmin_tokens_per_param = 1e12\n"
                      "max_time = 600\noptimizer = 'muon'\nmuon_weight_decay = 0.6\nsmaller_muon_weight_decay = 0.3\n")
    start = [str(preset), *(a for a in train_args(data_dir, out) if not a.startswith(("--n_layer", "--n_embd"))),
             "--max_iters=4",
             "--eval_interval=2", "--eval_iters=1"]
    fitted_from = {"n_layer": 2, "n_embd": 32, "muon_weight_decay": 0.6}
    train.main(start)
    said = capsys.readouterr().out
    assert "model: 1 layer × 32, " in said and \
        ", muon_weight_decay=0.3: none of this preset's fit_shapes sees enough here, so the smallest of them " \
        "(2x32, 1x32)" in said
    ckpt = load_checkpoint(out / "latest.pt")
    assert ckpt["model_args"]["n_layer"] == 1 and ckpt["measured"]["fitted_from"] == fitted_from
    train.main([*start, "--max_iters=6", "--init_from=auto"])
    assert "fit_shapes" not in capsys.readouterr().out  # a resumed run is not fitted again
    ckpt = load_checkpoint(out / "latest.pt")
    assert (ckpt["iter_num"], ckpt["model_args"]["n_layer"], ckpt["config"]["model"]["n_layer"]) == (6, 1, 1)
    assert ckpt["config"]["muon_weight_decay"] == 0.3 and ckpt["measured"]["fitted_from"] == fitted_from
    assert 0.3 in {g["weight_decay"] for opt in ckpt["optimizer"] for g in opt["param_groups"]}  # Muon's matrices
    with pytest.raises(UserError, match="n_layer=3 differs from .*'s 1; a resumed run keeps its model's shape"):
        train.main([*start, "--max_iters=8", "--init_from=auto", "--n_layer=3"])


def test_a_config_file_given_again_leaves_the_batch_a_resumed_run_was_saved_with():
    """The config file's batch settings may be those a command line replaced when the run started: a resumed run
    keeps its own (and so its global batch), saying so where the file's differ; the command line's are taken, and
    so are the file's other settings. (Through train.py, on another number of processes: test_ddp.py.)"""
    from gptkit.training.resume import own_batch

    saved = {"batch_size": 4, "gradient_accumulation_steps": 2, "learning_rate": 1e-3}
    given = {"batch_size": 16, "gradient_accumulation_steps": 2, "learning_rate": 3e-3}
    notes = []
    assert own_batch(given, set(), saved, notes.append) == {"learning_rate": 3e-3}
    # gradient_accumulation_steps: the file repeats the run's
    assert notes == [("note: the config file's batch_size=16 is not the 4 this run was saved with: it keeps 4, and its "
                      "global batch (--batch_size=16 would change them)")]
    notes.clear()
    assert own_batch(given, {"batch_size"}, saved, notes.append) == {"batch_size": 16, "learning_rate": 3e-3}
    assert notes == []


def test_a_resume_says_the_batch_it_was_saved_with_and_a_change_of_it_as_old_to_new(capsys):
    """Saved by 2 processes with 8 sequences a step (batch_size 4, gradient_accumulation_steps 1)."""
    from types import SimpleNamespace

    from gptkit.training.state import TrainState

    def said(world, global_batch, batch_size=4, accumulation=1):
        cfg = SimpleNamespace(batch_size=batch_size, gradient_accumulation_steps=accumulation)
        state = SimpleNamespace(cfg=cfg, sampler=SimpleNamespace(batch_size=batch_size), global_batch=global_batch,
                                micro_batches=global_batch // (batch_size * world))
        ckpt = {"rng": [{}, {}], "global_batch": 8, "config": {"batch_size": 4, "gradient_accumulation_steps": 1}}
        TrainState.say_how_it_continues(state, ckpt, world)
        return capsys.readouterr().out

    assert said(2, 8) == ""  # continued as it was saved: nothing to say
    assert said(1, 8).startswith("note: this run was saved by 2 processes and continues on 1: each takes 2 "
                                 "micro-batches of 4 sequences a step, the 8 a step it was saved with, in the same "
                                 "data order; dropout's random draws")
    assert said(1, 32, accumulation=8) == (
        "note: the global batch changes, 8 → 32 sequences a step, as the command line sets "
        "gradient_accumulation_steps=8; this run was saved by 2 processes and continues on 1: each takes 8 "
        "micro-batches of 4 sequences a step; from here on the losses are another run's, not those of the run it "
        "would have been\n")
    assert said(2, 16, batch_size=8).startswith("note: the global batch changes, 8 → 16 sequences a step, as the "
                                                "command line sets batch_size=8; it continues on its 2 processes: "
                                                "each takes 1 micro-batch of 8 sequences a step; ")


def test_a_checkpoint_from_before_a_model_setting_resumes_with_its_default(run, data_dir):
    """A run saved before token_shift existed was built without it: resumed, it continues so, and a config that
    asks for the shift is refused naming the checkpoint's value, not a missing one."""
    ckpt = load_checkpoint(run / "latest.pt")
    del ckpt["model_args"]["token_shift"], ckpt["config"]["model"]["token_shift"]
    save_checkpoint(ckpt, run / "latest.pt")
    with pytest.raises(UserError, match=r"token_shift=True differs from .*latest.pt's False; a resumed run keeps"):
        train.main(resume(data_dir, run, "--token_shift=True", "--max_iters=32"))
    train.main(resume(data_dir, run, "--max_iters=32"))
    assert load_checkpoint(run / "latest.pt")["model_args"]["token_shift"] is False


# ---------------------------------------------------------------------------------------------- finished, or another's

def test_resuming_a_finished_run_says_so_and_writes_nothing(tmp_path, data_dir, trained_run):
    """--init_from=auto (or resume) on a run with nothing left: one line saying why, exit 0, no file touched;
    a run that continues says where from."""
    out = tmp_path / "out"
    shutil.copytree(trained_run[0], out)
    before = files(out)  # run.lock is taken by every train.py that looks at the folder: the rest must not change
    for start in ("--init_from=auto", "--init_from=resume"):
        proc = check_ok(run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN, start)))
        lines = proc.stdout.strip().splitlines()
        assert lines == [f"resuming from iteration 30 of 30 ({out / 'latest.pt'})",
                         f"the run in {out} is finished (all 30 iterations are done); nothing to do: raise "
                         "--max_iters or --max_time to train it further, or start another run in a new --out_dir"]
        assert files(out) == before
    more = check_ok(run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN, "--init_from=auto",
                                                        "--max_iters=32")))
    assert more.stdout.startswith(f"resuming from iteration 30 of 32 ({out / 'latest.pt'}); max_iters 30 → 32\n")
    assert max(logged(out, "eval", "val_loss")) == 32


def test_a_new_run_never_takes_over_a_used_out_dir(tmp_path, data_dir, trained_run):
    """A fresh run into a folder holding another run's state refuses in one line naming the ways on; with
    --start_over the old files move into a folder beside them, deleting nothing."""
    out = tmp_path / "out"
    shutil.copytree(trained_run[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"}
    refused = run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN))
    assert refused.returncode == 1 and assert_one_error_line(refused.stderr) == (
        f"error: {out} holds another run (latest.pt, latest.prev.pt, best.pt, metrics.jsonl); continue it with "
        "--init_from=auto, train elsewhere with another --out_dir, or start over with --start_over=True (its "
        "files are moved aside, not deleted)")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"} == before
    fresh = check_ok(run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN, "--start_over=True")))
    (aside,) = out.glob("replaced-*")
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == before and f"moved to {aside}" in fresh.stdout
    assert [r["iter"] for r in read_metrics(out) if r["kind"] == "run"] == [0]  # a log of its own


def test_auto_over_a_best_model_with_no_state_to_continue_refuses_and_keeps_it(tmp_path, data_dir, trained_run):
    """A folder holding a best.pt but no latest.pt (deleted, or copied without it): 'auto' finds nothing to
    continue, and training afresh would replace that best.pt with a worse one. It refuses, every file kept."""
    out = tmp_path / "out"
    shutil.copytree(trained_run[0], out)
    for name in ("latest.pt", "latest.prev.pt"):
        (out / name).unlink()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"}
    refused = run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN, "--init_from=auto"))
    assert refused.returncode == 1 and assert_one_error_line(refused.stderr) == (
        f"error: {out} holds another run (best.pt, metrics.jsonl) but no saved state to continue it from "
        "(latest.pt); train elsewhere with another --out_dir, or start over with --start_over=True (its files are "
        "moved aside, not deleted)")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"} == before


SHORT_RUN = ["--max_iters=6", "--eval_interval=2", "--eval_iters=2", "--log_interval=1", "--warmup_iters=1"]


@pytest.mark.slow
def test_after_a_failed_save_and_a_resume_each_record_is_logged_once(tmp_path, data_dir):
    """The second save of latest.pt meets a full disk: the records logged after the first (iteration 2) are
    logged again by the resume, and were kept twice."""
    out = tmp_path / "out"
    failed = Run(train_cmd(data_dir, out, *SHORT_RUN, script=faulty_train(tmp_path, enospc=("latest.pt", 2))),
                 tmp_path / "failed")
    assert failed.wait() == 1 and "disk full" in failed.stderr
    resumed = check_ok(run_script("train.py", *train_args(data_dir, out, *SHORT_RUN, "--init_from=auto")))
    assert "logged after iteration 2, the state this run continues from; they are dropped" in resumed.stdout
    records = [(r["kind"], r["iter"]) for r in read_metrics(out) if r["kind"] in ("train", "eval", "final")]
    assert len(records) == len(set(records)) and ("final", 6) in records
    assert sorted(i for kind, i in records if kind == "train") == list(range(1, 7))


@pytest.mark.slow
def test_a_run_stopped_while_scoring_the_whole_val_split_is_finished_by_a_resume(tmp_path, data_dir):
    out = tmp_path / "out"
    stopped = Run(train_cmd(data_dir, out, *SHORT_RUN, script=faulty_train(tmp_path, eval_signal=("SIGTERM", "final"))),
                  tmp_path / "stopped")
    assert stopped.wait() == 143 and "while scoring the whole val split" in stopped.stderr
    resumed = check_ok(run_script("train.py", *train_args(data_dir, out, *SHORT_RUN, "--init_from=auto")))
    assert "its final score on the whole val split was never recorded: scoring it now" in resumed.stdout
    assert [r["iter"] for r in read_metrics(out) if r["kind"] == "final"] == [6]
    again = check_ok(run_script("train.py", *train_args(data_dir, out, *SHORT_RUN, "--init_from=auto")))
    assert "is finished (all 6 iterations are done); nothing to do" in again.stdout


@pytest.mark.slow
def test_a_run_killed_after_its_last_save_gets_its_end_record_and_snapshot_on_resume(tmp_path, data_dir):
    """kill -9 between the last save of latest.pt and the end's record: the resume went straight to the final score,
    and the run's end was never in its timeline or its snapshots."""
    out = tmp_path / "out"
    args = train_args(data_dir, out, *SHORT_RUN, "--snapshots=3", "--threads=1")
    train.main(args)
    whole = [(r["kind"], r["iter"]) for r in read_metrics(out) if r["kind"] in ("timeline", "final")]
    assert ("timeline", 6) in whole and (out / "snapshots" / "iter_6.pt").exists()
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["kind"] not in ("final", "timeline")
            or json.loads(line)["iter"] != 6]  # as the kill left it: no end record, no final score
    (out / "metrics.jsonl").write_text("".join(kept), encoding="utf-8")
    (out / "snapshots" / "iter_6.pt").unlink()
    train.main([*args, "--init_from=auto"])
    assert [(r["kind"], r["iter"]) for r in read_metrics(out) if r["kind"] in ("timeline", "final")] == whole
    assert (out / "snapshots" / "iter_6.pt").exists()


def test_a_fine_tune_into_the_folder_it_starts_from_is_refused_before_anything_moves(tmp_path, chat_run, chat_data):
    """out_dir = init_from with --start_over=True: moving the run aside would leave nothing to start from. One line,
    before the run's files move."""
    from conftest import CHAT_SFT

    base = tmp_path / "base"
    shutil.copytree(chat_run, base)
    kept = sorted(p.name for p in base.iterdir())
    with pytest.raises(UserError) as caught:
        train.main([f"--init_from={base}", f"--out_dir={base}", f"--data_dir={chat_data}", *CHAT_SFT,
                    "--start_over=True"])
    assert str(caught.value) == (f"out_dir and init_from are the same folder, {base}: a fine-tune starts from the "
                                 "run there and trains a new one in a folder of its own; give it another --out_dir")
    assert sorted(p.name for p in base.iterdir()) == kept


@pytest.mark.parametrize("refused", ["a folder to start from that does not exist", "wandb missing",
                                     "a resume with wandb missing"])
def test_a_start_refused_at_its_start_leaves_the_folder_as_it_was(tmp_path, data_dir, trained_run, monkeypatch,
                                                                  refused):
    """The old run's files move aside (--start_over), and a resumed run's records past its state go, only once the
    run has started: one refused at its start, wandb's the last refusal, leaves them in place."""
    out = tmp_path / "out"
    shutil.copytree(trained_run[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"}
    if refused == "a folder to start from that does not exist":
        extra, match = [f"--init_from={tmp_path / 'nowhere'}", "--start_over=True"], "no such folder"
    else:
        monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as where it is not installed
        extra = ["--wandb_log=True", "--start_over=True" if refused == "wandb missing" else "--init_from=auto"]
        match = "wandb_log=True needs the wandb package"
        if refused == "a resume with wandb missing":  # records past the state it continues from
            with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": "train", "iter": 10 ** 6, "loss": 1.0}) + "\n")
            before["metrics.jsonl"] = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(UserError, match=match):
        train.main(train_args(data_dir, out, *TRAINED_RUN, "--max_iters=40", *extra))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"} == before


def test_a_resume_refused_at_its_start_keeps_the_records_and_snapshots_past_its_state(run, data_dir, monkeypatch):
    """A run killed between saves logged steps past its state, which a resume drops to log again: only once it has
    started. One refused at its start keeps them: here model.py's configure_optimizers edited to SGD, which the
    saved AdamW state does not fit, and the line says that edit is why, not that the state is damaged."""
    import model as model_py

    later = json.dumps({"kind": "train", "iter": 35, "loss": 2.0}) + "\n"
    with open(run / "metrics.jsonl", "a") as f:
        f.write(later)
    (run / "snapshots").mkdir(exist_ok=True)
    (run / "snapshots" / "iter_35.pt").write_bytes((run / "latest.pt").read_bytes())  # its file, as drop_after sees it
    monkeypatch.setattr(model_py.GPT, "configure_optimizers", lambda self, cfg, dtype="float32":
                        torch.optim.SGD(self.parameters(), lr=0.1))
    with pytest.raises(UserError) as caught:
        train.main(resume(data_dir, run, "--max_iters=40"))
    assert str(caught.value) == (
        f"{run / 'latest.pt'}'s optimizer state does not fit the optimizers model.py's GPT.configure_optimizers builds "
        "now, edited since it was saved: continue the run with the code it trained with, or start a new one from its "
        f"weights in another folder (--init_from={run} --out_dir=ANOTHER)")
    assert (run / "metrics.jsonl").read_text().endswith(later) and (run / "snapshots" / "iter_35.pt").exists()
