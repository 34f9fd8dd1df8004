"""A run's folder under damage and misuse: a flipped byte anywhere in a checkpoint is named and refused, a damaged
latest state falls back to the one before it, stopping a run never touches the best weights, a full disk
keeps whole records, two runs cannot share a folder, and a resume continues with the saved settings."""

import errno
import hashlib
import io
import os
import random
import shutil
import signal
import struct
import zipfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import sample
import train
from conftest import Run, logged, train_args, train_cmd, wait_for_iteration
from gptkit import checkpoint, metrics
from gptkit.checkpoint import HEADER_SIZE, load_checkpoint, save_checkpoint
from gptkit.config import make
from gptkit.errors import UserError
from gptkit.metrics import read_metrics
from gptkit.resume import resume_state
from gptkit.rundir import RunDir
from gptkit.train_config import TrainConfig


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resume(data_dir, out, *extra):
    """A command line that says only where the data and the run are: everything else comes from the run."""
    return [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out}", "--init_from=auto", *extra]


# ---------------------------------------------------------------------------------------------- integrity

def parts(data):
    """{part: (start, end)} byte ranges of a checkpoint file: its header line, and in the zip torch.save wrote,
    the first and last entries' local headers (with their alignment padding) and data, the central
    directory and the end records."""
    payload = data[HEADER_SIZE:]
    entries = zipfile.ZipFile(io.BytesIO(payload)).infolist()
    out = {"header line": (0, HEADER_SIZE)}
    for label, entry in [("first", entries[0]), ("last", entries[-1])]:
        start = HEADER_SIZE + entry.header_offset
        name_len, extra_len = struct.unpack("<HH", payload[entry.header_offset + 26:entry.header_offset + 30])
        data_start = start + 30 + name_len + extra_len
        out[f"{label} local header and padding"] = (start, data_start)
        out[f"{label} entry's data"] = (data_start, data_start + entry.compress_size)
    end_records = HEADER_SIZE + max(payload.rfind(b"PK\x06\x06"), payload.rfind(b"PK\x05\x06"))
    central = HEADER_SIZE + struct.unpack("<I", payload[payload.rfind(b"PK\x05\x06") + 16:][:4])[0]
    if central == HEADER_SIZE + 0xFFFFFFFF:  # zip64: the offset lives in the zip64 end record
        central = HEADER_SIZE + struct.unpack("<Q", payload[payload.rfind(b"PK\x06\x06") + 48:][:8])[0]
    out["central directory"] = (central, end_records)
    out["end records"] = (end_records, len(data))
    return out


def test_a_checkpoint_written_before_hook_points_and_kernels_samples_the_same_text(tmp_path, capsys):
    """tests/data/written_before_hooks/best.pt was trained by the model file as it stood before hook points and
    gptkit/kernels.py (2 layers, rotary, QK-norm, ReLU^2, token shift); its sample is the text that code wrote."""
    shutil.copytree(Path(__file__).parent / "data" / "written_before_hooks", tmp_path / "run")
    sample.main([f"--out_dir={tmp_path / 'run'}", "--device=cpu", "--dtype=float32", "--num_samples=1",
                 "--max_new_tokens=80", "--seed=7", "--start=ROMEO:"])
    assert capsys.readouterr().out == ("ROMEO:\nThe ver ca2 the foul srod. 1t an e. 52 thom!. kner crs.\n\nROMEO:\n"
                                       "The mergy watse\n---------------\n")


@pytest.mark.parametrize("name", ["latest.pt", "best.pt"])
def test_a_flipped_byte_anywhere_is_caught_on_load(trained_run, tmp_path, name):
    """Every byte of the header line, and 40 random offsets in each part of the zip, each flipped to a random
    other value; then truncations and appended bytes: every one is refused with one line naming the file."""
    data = (trained_run[0] / name).read_bytes()
    rng = random.Random(12)
    cases = []
    for part, (start, end) in parts(data).items():
        assert start < end, part
        offsets = range(start, end) if part == "header line" else [rng.randrange(start, end) for _ in range(40)]
        for offset in offsets:
            damaged = bytearray(data)
            damaged[offset] ^= rng.randrange(1, 256)
            cases.append((f"{part}, byte {offset}", bytes(damaged)))
    cuts = [0, 1, HEADER_SIZE - 1, HEADER_SIZE, *rng.sample(range(len(data)), 20)]
    cases += [(f"cut at {n}", data[:n]) for n in cuts]
    cases += [("appended", data + b"\0"), ("appended a line", data + b"more\n")]
    path = tmp_path / name
    for label, damaged in cases:
        path.write_bytes(damaged)
        with pytest.raises(UserError) as info:
            load_checkpoint(path)
        message = str(info.value)
        assert message.startswith(str(path)) and "\n" not in message, (label, message)
        assert "damaged" in message, (label, message)
    path.write_bytes(data)
    assert load_checkpoint(path)["iter_num"] > 0  # the undamaged bytes load


def test_a_checkpoint_without_a_checksum_still_loads(run, data_dir, capsys):
    """An earlier version's single ckpt.pt (torch.save's zip alone): sampled and resumed as before."""
    payload = (run / "latest.pt").read_bytes()[HEADER_SIZE:]
    old = run.parent / "old"
    old.mkdir()
    (old / "ckpt.pt").write_bytes(payload)
    sample.main([f"--out_dir={old}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5"])
    train.main(resume(data_dir, old, "--max_iters=35"))
    assert load_checkpoint(old / "latest.pt")["iter_num"] == 35 and digest(old / "ckpt.pt") == hashlib.sha256(
        payload).hexdigest()


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


@pytest.mark.parametrize("damage", ["flipped byte", "missing", "nan in the optimizer state"])
def test_a_damaged_latest_state_falls_back_to_the_one_before(run, data_dir, capsys, damage):
    """The note names latest.pt and the state resumed from (iteration 20); the steps after it are trained again
    and log the very losses the first run logged."""
    first = logged(run)
    if damage == "flipped byte":
        flip(run / "latest.pt")
    elif damage == "missing":  # a crash between the two renames of a save
        (run / "latest.pt").unlink()
    else:
        nan_optimizer_state(run / "latest.pt")
    train.main(resume(data_dir, run))
    note = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("note:"))
    expected = {"flipped byte": "is damaged: its contents do not match the checksum written with them",
                "missing": "is missing (its save was interrupted)",
                "nan in the optimizer state": "is damaged: non-finite values in exp_avg of its optimizer state"}
    assert note.startswith(f"note: {run / 'latest.pt'} {expected[damage]}")
    assert note.endswith(f"; resuming from {run / 'latest.prev.pt'} (iteration 20)")
    again = logged(run)
    assert sorted(again) == sorted(first) and all(abs(again[i] - first[i]) <= 1e-6 for i in first)
    assert load_checkpoint(run / "latest.pt")["iter_num"] == 30


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


def test_a_failed_rename_keeps_the_previous_state_and_resume_finds_it(tmp_path, monkeypatch, capsys):
    """The second rename of a save (latest.pt.tmp over latest.pt) fails after the first (latest.pt to
    latest.prev.pt) went through: the message says where the previous state is, and a resume finds it there."""
    rundir = RunDir(tmp_path)
    save_checkpoint({"iter_num": 1}, rundir.latest, previous=rundir.previous)
    real_replace = os.replace

    def replace(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(UserError) as info:
        save_checkpoint({"iter_num": 2}, rundir.latest, previous=rundir.previous)
    assert str(info.value) == (f"could not write checkpoint {rundir.latest} (Input/output error); the previous "
                               f"checkpoint is intact as {rundir.previous}")
    notes = []
    with pytest.raises(UserError, match="incomplete"):  # found (a bare dict, not a training state) and read
        resume_state(rundir, "auto", notes.append)
    assert notes == [] and not rundir.latest.exists() and load_checkpoint(rundir.previous)["iter_num"] == 1


# ---------------------------------------------------------------------------------------------- best and latest

def test_ctrl_c_after_val_got_worse_keeps_the_best_weights(tmp_path, data_dir, capsys, monkeypatch):
    """Issue #12: with always_save_checkpoint=False (the shipped default's), Ctrl-C saved the current model over the
    best one. Val loss improves at iteration 5 and only gets worse after it; Ctrl-C arrives during step 17.
    best.pt stays the weights of iteration 5, and sample.py samples them; latest.pt holds step 17. Running on
    to the end (as a max_time stop would, still worse) does not touch best.pt either."""
    out = tmp_path / "out"
    args = train_args(data_dir, out, "--max_iters=20", "--eval_interval=5", "--eval_iters=2", "--log_interval=1",
                      "--always_save_checkpoint=False", "--init_from=auto",
                      "--learning_rate=1e-2", "--warmup_iters=0")  # 5 and 17 sample differently
    real_evaluate, real_step = train.evaluate_on_rank0, train.step_optimizers

    def worse_after_5(rt, data, state, budget=None):
        losses = real_evaluate(rt, data, state, budget)
        return dict(losses, val=losses["val"] + 100) if state.iter_num > 5 else losses

    steps = []

    def ctrl_c_during_17(*args):
        real_step(*args)
        steps.append(1)
        if len(steps) == 17:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(train, "evaluate_on_rank0", worse_after_5)
    monkeypatch.setattr(train, "step_optimizers", ctrl_c_during_17)
    with pytest.raises(UserError) as info:
        train.main(args)
    assert str(info.value).startswith("stopped by SIGINT at iteration 17;") and info.value.exit_code == 130
    best = digest(out / "best.pt")
    assert load_checkpoint(out / "best.pt")["iter_num"] == 5 and load_checkpoint(out / "latest.pt")["iter_num"] == 17

    alone = tmp_path / "best_alone"
    alone.mkdir()
    shutil.copy(out / "best.pt", alone / "best.pt")
    texts = {}
    for name, folder, extra in [("default", out, []), ("best", alone, []), ("latest", out, ["--checkpoint=latest"])]:
        capsys.readouterr()
        sample.main([f"--out_dir={folder}", "--device=cpu", "--num_samples=1", "--max_new_tokens=40", *extra])
        texts[name] = capsys.readouterr().out
    assert texts["default"] == texts["best"] != texts["latest"]

    monkeypatch.setattr(train, "step_optimizers", real_step)
    train.main(args)
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 20 and digest(out / "best.pt") == best


# ---------------------------------------------------------------------------------------------- full disk, two runs

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


# ---------------------------------------------------------------------------------------------- resume rules

def test_a_run_its_budget_made_smaller_resumes_with_the_command_that_started_it(tmp_path, data_dir, capsys):
    """The config file still says the bigger shape and its decay: given again on resume they are what the run was
    fitted from, not other settings; the run keeps the smaller model and its decay. A shape that differs from
    both is refused."""
    out = tmp_path / "fitted"
    start = train_args(data_dir, out, "--n_layer=2", "--max_time=600", "--min_tokens_per_param=1e12",
                       "--smaller_n_layer=1", "--optimizer=muon", "--muon_weight_decay=0.6",
                       "--smaller_muon_weight_decay=0.3", "--max_iters=4", "--eval_interval=2", "--eval_iters=1")
    fitted_from = {"n_layer": 2, "n_embd": 32, "muon_weight_decay": 0.6}
    train.main(start)
    assert ("shape: n_layer=1, n_embd=32, muon_weight_decay=0.3 instead of n_layer=2, n_embd=32, "
            "muon_weight_decay=0.6: ") in capsys.readouterr().out
    ckpt = load_checkpoint(out / "latest.pt")
    assert ckpt["model_args"]["n_layer"] == 1 and ckpt["measured"]["fitted_from"] == fitted_from
    train.main([*start, "--max_iters=6", "--init_from=auto"])
    assert "shape:" not in capsys.readouterr().out  # a resumed run is not fitted again
    ckpt = load_checkpoint(out / "latest.pt")
    assert (ckpt["iter_num"], ckpt["model_args"]["n_layer"], ckpt["config"]["model"]["n_layer"]) == (6, 1, 1)
    assert ckpt["config"]["muon_weight_decay"] == 0.3 and ckpt["measured"]["fitted_from"] == fitted_from
    assert 0.3 in {g["weight_decay"] for opt in ckpt["optimizer"] for g in opt["param_groups"]}  # Muon's matrices
    with pytest.raises(UserError, match="n_layer=3 differs from .*'s 1; a resumed run keeps its model's shape"):
        train.main([*start, "--max_iters=8", "--init_from=auto", "--n_layer=3"])


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


def test_wandb_records_the_settings_the_run_trains_with():
    """A run fitted to its budget trains other settings than it was given: wandb's config is the trained ones."""
    given = make(TrainConfig, {"wandb_log": True, "n_layer": 4, "muon_weight_decay": 0.6})
    fitted = replace(given, model=replace(given.model, n_layer=3), muon_weight_decay=0.3)
    args = train.wandb_args(SimpleNamespace(wandb_id="run-id", cfg=fitted))
    assert (args["id"], args["config"]["model"]["n_layer"], args["config"]["muon_weight_decay"]) == ("run-id", 3, 0.3)


def test_a_resume_continues_with_the_saved_settings_and_those_given_again(run, data_dir):
    """Given only where the data is, a resumed run is the saved one (its model shape, batch size, learning rate);
    a key given again, here learning_rate and max_iters, is honoured, by the optimizer too."""
    train.main(resume(data_dir, run, "--learning_rate=1e-3", "--max_iters=32"))
    ckpt = load_checkpoint(run / "latest.pt")
    cfg = ckpt["config"]
    assert (ckpt["iter_num"], cfg["max_iters"], cfg["learning_rate"], cfg["batch_size"]) == (32, 32, 1e-3, 8)
    assert (cfg["model"]["n_layer"], cfg["model"]["pos_emb"], cfg["model"]["block_size"]) == (2, "rope", 32)
    assert {g["base_lr"] for g in ckpt["optimizer"][0]["param_groups"]} == {1e-3}
