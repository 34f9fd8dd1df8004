"""Fault injection: SIGKILL at any moment, a crash in the middle of a checkpoint write, a full disk, Ctrl-C,
non-finite losses, hostile checkpoints and a failing DDP rank. Each test builds its own tiny corpus and runs
the real command lines on the CPU; a resumed run must give the uninterrupted run's losses exactly."""

import errno
import hashlib
import io
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conftest import REPO, Run, assert_one_error_line, logged, run_script, train_args, train_cmd, wait_for_iteration
from gptkit import checkpoint
from gptkit.checkpoint import load_checkpoint, save_checkpoint
from gptkit.errors import UserError

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


WRAPPER = '''
import io, os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
sys.argv[0] = os.path.join({repo!r}, "train.py")
import train
from gptkit import checkpoint
from gptkit.errors import run_main

FAULTS = {faults!r}
saves = 0


class Faulty(io.FileIO):
    """A checkpoint file that dies (SIGKILL) or fills the disk after its first 4 KiB."""
    written = 0

    def write(self, data):
        if self.written + len(data) > 4096:
            if "kill" in FAULTS:
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(28, os.strerror(28))  # ENOSPC
        self.written += len(data)
        return super().write(data)


def faulty_open(path, mode="r", *args, **kwargs):
    global saves
    name, nth = FAULTS.get("kill") or FAULTS["enospc"]  # the file whose nth write fails
    if Path(path).name == name + ".tmp":
        saves += 1
        if saves == nth:
            return Faulty(path, "wb")
    return open(path, mode, *args, **kwargs)


if "kill" in FAULTS or "enospc" in FAULTS:
    checkpoint.open = faulty_open
if "nan" in FAULTS:  # the training loss of forward pass NTH becomes NaN
    import model
    real_forward = model.GPT.forward
    calls = 0

    def forward(self, *args, **kwargs):
        global calls
        logits, loss = real_forward(self, *args, **kwargs)
        if self.training and loss is not None:
            calls += 1
            if calls == FAULTS["nan"]:
                loss = loss * float("nan")
        return logits, loss

    model.GPT.forward = forward
if "signal" in FAULTS or "rank1" in FAULTS:
    import torch.distributed as dist
    from gptkit.errors import UserError
    real_step = train.step_optimizers
    steps = 0  # optimizer steps taken: the runs these faults go into start from scratch

    def step_optimizers(*args):
        global steps
        rank = dist.get_rank() if dist.is_initialized() else 0
        if "rank1" in FAULTS and rank == 1 and steps == FAULTS["rank1"]:
            raise UserError("rank 1 failed on purpose")  # on its own, after DDP is up
        real_step(*args)
        steps += 1
        if "signal" in FAULTS:  # arrives during step N: the run must stop right after it
            name, iteration, ranks = FAULTS["signal"]
            if steps == iteration and rank in ranks:
                os.kill(os.getpid(), getattr(signal, name))

    train.step_optimizers = step_optimizers
if "eval_signal" in FAULTS:  # arrives while the first evaluation or the final score runs
    name, when = FAULTS["eval_signal"]
    target = {{"first": "evaluate", "final": "evaluate_split"}}[when]
    real_eval = getattr(train, target)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, name))
        return real_eval(*args, **kwargs)

    setattr(train, target, interrupted)
run_main(train.main)
'''


def wrapper(tmp_path, **faults):
    """A test-only script that runs train.py with faults injected; the product code has no hooks.
    kill/enospc=(file name, which write of it), nan=which forward pass, signal=(name, iteration, ranks),
    rank1=iteration, eval_signal=(name, 'first' evaluation or 'final' score)."""
    path = tmp_path / f"train_{'_'.join(faults)}.py"
    path.write_text(WRAPPER.format(repo=str(REPO), faults=faults), encoding="utf-8")
    return path


def torchrun(script, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *args]


def stopped_line(signame, out):
    return re.compile(rf"error: stopped by {signame} at iteration (\d+); latest state saved to "
                      rf"{re.escape(str(out / 'latest.pt'))}, continue with --init_from=auto")


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
    run = Run(train_cmd(data_dir, out, *extra, script=wrapper(tmp_path, kill=("latest.pt", 2))), tmp_path / "killed")
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
    run = Run(train_cmd(data_dir, out, *args, script=wrapper(tmp_path, signal=(signame, at, [0]))), tmp_path / "stop")
    rc = run.wait()
    assert rc == 128 + getattr(signal, signame), f"exit {rc}\nstderr:\n{run.stderr}"
    m = stopped_line(signame, out).fullmatch(assert_one_error_line(run.stderr))
    assert m and int(m.group(1)) == at == max(logged(out)), run.stderr
    assert load_checkpoint(out / "latest.pt")["iter_num"] == at

    Run(train_cmd(data_dir, out, *args), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference(name))


@pytest.mark.parametrize("order", ["random", "epochs"])
def test_every_rng_round_trips_through_a_checkpoint(tmp_path, order):
    """torch, numpy, python and the sampler (which redraws the batch it had fetched ahead) come back exactly; in
    epochs, with the batch fetched ahead running from the end of one epoch into the next."""
    import random

    import numpy as np

    from gptkit.dataset import BatchSampler, Split
    from gptkit.training import rng_state, set_rng_state

    (tmp_path / "train.bin").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    sampler = BatchSampler(Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": 1000}, 8), 3, 0, "cpu", order)
    for _ in range(41):  # 123 of an epoch's 124 windows
        sampler.next()
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    pending, _ = sampler.next()
    save_checkpoint({"rng": [rng_state(sampler)]}, tmp_path / "ckpt.pt")

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), sampler.next()[0].tolist()

    first = draws()
    torch.manual_seed(9), np.random.seed(9), random.seed(9), sampler.next()
    set_rng_state(load_checkpoint(tmp_path / "ckpt.pt")["rng"][0], sampler)
    assert sampler.next()[0].tolist() == pending.tolist()
    assert draws() == first


@pytest.mark.parametrize("length, block_size, batch_size", [(1000, 8, 3), (50, 16, 4), (9, 8, 2)])
def test_an_epoch_shows_every_window_once_before_any_again(tmp_path, length, block_size, batch_size):
    """batch_order='epochs': an epoch's windows lie block_size apart from a random first offset, so every token
    after it is a target once, and come each once in a random order; the batches run on into the next epoch, even
    where a batch holds more windows than the split."""
    import numpy as np

    from gptkit.dataset import BatchSampler, Split

    (tmp_path / "train.bin").write_bytes(np.arange(length, dtype=np.uint16).tobytes())
    split = Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": length}, block_size)
    sampler = BatchSampler(split, batch_size, 0, "cpu", "epochs")
    starts, epochs, start_epoch = [], [], sampler.start_epoch

    def noted_start():
        start_epoch()
        epochs.append(sampler.epoch)

    sampler.start_epoch = noted_start
    while len(epochs) < 3:  # two whole epochs drawn
        x, y = sampler.next()
        assert torch.equal(y, x + 1) and int(y.max()) < length  # the tokens are their own offsets
        starts += x[:, 0].tolist()
    for epoch in epochs[:2]:
        seen, starts = starts[:epoch.windows], starts[epoch.windows:]
        assert sorted(seen) == list(range(epoch.phase, epoch.phase + epoch.windows * block_size, block_size))
        assert epoch.phase + epoch.windows * block_size + 1 > length - block_size  # no whole window left out
        if epoch.windows > 20:
            assert seen != sorted(seen)


# ---------------------------------------------------------------------------------------------- atomic writes

def full_disk_file(limit):
    class Full(io.FileIO):
        def write(self, data):
            if self.tell() + len(data) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)
    return Full


@pytest.mark.parametrize("fault", ["write", "fsync", "replace"])
def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch, fault):
    """A full disk (during the writes or at fsync) or a failing rename: one clear error, old ckpt.pt intact."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"iter_num": 1, "w": torch.ones(4)}, path)
    real_open = open
    if fault == "write":
        full = full_disk_file(10_000)
        monkeypatch.setattr(checkpoint, "open", lambda p, mode="r", *a, **k:
                            full(p, "wb") if "w" in mode else real_open(p, mode, *a, **k), raising=False)
    elif fault == "fsync":
        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    else:
        def replace(src, dst):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(UserError) as info:
        save_checkpoint({"iter_num": 2, "w": torch.zeros(100_000)}, path)
    message = str(info.value)
    assert "\n" not in message and "the previous checkpoint is intact" in message
    if fault == "replace":
        assert message.startswith(f"could not write checkpoint {path} (") and "Permission denied" in message
    else:
        assert message == f"disk full while writing {path}; the previous checkpoint is intact"
    monkeypatch.undo()
    state = load_checkpoint(path)
    assert state["iter_num"] == 1 and torch.equal(state["w"], torch.ones(4))
    assert not path.with_name("ckpt.pt.tmp").exists()


def test_sigkill_while_saving_a_large_checkpoint(tmp_path):
    """A process SIGKILLed 1 MB into streaming a 64 MB state: the old file loads, the .tmp is ignored
    (and named when it is all there is), and the next save cleans up."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"iter_num": 1, "w": torch.ones(4)}, path)
    script = tmp_path / "big_save.py"
    script.write_text(f"""
import io, os, signal, sys
sys.path.insert(0, {str(REPO)!r})
import torch
from gptkit import checkpoint

class DiesMidWrite(io.FileIO):
    def write(self, data):
        if self.tell() > 1 << 20:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write(data)

checkpoint.open = lambda p, mode="r", *a, **k: DiesMidWrite(p, "wb")
torch.manual_seed(0)
checkpoint.save_checkpoint({{"iter_num": 2, "w": [torch.randn(4_000_000) for _ in range(4)]}}, {str(path)!r})
""", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    tmp = tmp_path / "ckpt.pt.tmp"
    assert tmp.stat().st_size > 1 << 20
    state = load_checkpoint(path)
    assert state["iter_num"] == 1 and torch.equal(state["w"], torch.ones(4))
    path.unlink()
    with pytest.raises(UserError, match=r"no checkpoint at .*ckpt\.pt \(ckpt\.pt\.tmp is an unfinished write"):
        load_checkpoint(path)
    save_checkpoint({"iter_num": 3}, path)
    assert load_checkpoint(path)["iter_num"] == 3 and not tmp.exists()


@pytest.mark.parametrize("name,nth,kept", [("best.pt", 1, ""), ("latest.pt", 2, "; the previous checkpoint is intact")])
def test_disk_full_while_saving_is_one_line_and_keeps_what_was_saved(tmp_path, data_dir, monkeypatch, name, nth, kept):
    """The disk fills while best.pt is first written at iteration 5 (there is no previous one to keep, and the
    message does not claim one), or while latest.pt is written at iteration 10 (iteration 5's is kept)."""
    import train

    out, real_open, full, opened = tmp_path / "out", open, full_disk_file(4096), []

    def open_filling_the_disk(path, mode="r", *args, **kwargs):
        if Path(path).name == name + ".tmp":
            opened.append(path)
            if len(opened) == nth:
                return full(path, "wb")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", open_filling_the_disk, raising=False)
    with pytest.raises(UserError) as info:
        train.main(train_args(data_dir, out, *COMMON, "--max_iters=20"))
    assert str(info.value) == f"disk full while writing {out / name}{kept}"
    assert not (out / f"{name}.tmp").exists()
    if kept:
        assert load_checkpoint(out / name)["iter_num"] == 5
    else:
        assert not (out / "best.pt").exists() and not (out / "latest.pt").exists()


# ---------------------------------------------------------------------------------------------- non-finite loss

NOT_FINITE = re.compile(r"error: (val loss|loss) is (nan|inf|-inf) at iteration (\d+); stopping with the last "
                        r"good checkpoint kept \(try a lower learning_rate or .+\)")


def test_exploding_learning_rate_stops_with_no_checkpoint(tmp_path, data_dir):
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *COMMON, "--learning_rate=1e9"), tmp_path / "log")
    assert run.wait() == 1
    m = NOT_FINITE.fullmatch(assert_one_error_line(run.stderr))
    assert m, run.stderr
    what, iteration = m.group(1), int(m.group(3))
    # the iteration named is the one that would have been logged next (or the evaluation's)
    assert iteration == (max(logged(out), default=0) + 1 if what == "loss" else max(logged(out, "eval", "val_loss")))
    assert iteration <= 5 and not list(out.glob("*.pt"))  # no good step was ever saved


def test_injected_nan_keeps_the_last_good_checkpoint(tmp_path, data_dir):
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *COMMON, script=wrapper(tmp_path, nan=8)), tmp_path / "log")
    assert run.wait() == 1
    line = assert_one_error_line(run.stderr)
    assert line == ("error: loss is nan at iteration 8; stopping with the last good checkpoint kept "
                    "(try a lower learning_rate or a longer warmup_iters)")
    assert max(logged(out)) == 7
    for name in ("latest.pt", "best.pt"):
        ckpt = load_checkpoint(out / name)
        assert ckpt["iter_num"] == 5
        assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


# ---------------------------------------------------------------------------------------------- safety

class RunsCode:
    """Unpickling this runs a shell command: what a hostile 'checkpoint' would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("form", ["torch.save", "with a valid checksum", "plain pickle"])
def test_hostile_checkpoint_is_refused_without_running_it(tmp_path, data_dir, form):
    """Neither sampling nor resuming runs a crafted checkpoint. A checksum proves a file undamaged, not harmless:
    one written by someone else with a correct header is still loaded with weights_only and refused."""
    import sample
    import train

    out, marker = tmp_path / "out", tmp_path / "MARKER"
    out.mkdir()
    state = {"format_version": 1, "model": RunsCode(marker), "iter_num": 0}
    if form == "plain pickle":
        with open(out / "ckpt.pt", "wb") as f:
            pickle.dump(state, f)
    else:
        torch.save(state, out / "ckpt.pt")
    if form == "with a valid checksum":
        payload = (out / "ckpt.pt").read_bytes()
        (out / "ckpt.pt").write_bytes(checkpoint.HEADER % (hashlib.sha256(payload).hexdigest().encode(), len(payload))
                                      + payload)
    for command in [lambda: sample.main([f"--out_dir={out}", "--device=cpu"]),
                    lambda: train.main(train_args(data_dir, out, "--init_from=resume", "--max_iters=2"))]:
        with pytest.raises(UserError) as info:
            command()
        if form == "plain pickle":  # not a zip, not a header: not read any further
            assert str(info.value) == f"{out / 'ckpt.pt'} is damaged or not a checkpoint (it does not begin with " \
                                      "a checkpoint header)"
        else:
            assert str(info.value).startswith(f"refusing to load {out / 'ckpt.pt'}: it holds objects other than "
                                              "tensors") and "GLOBAL posix.system" in str(info.value)  # names it
        assert not marker.exists(), "the checkpoint ran code"
    with open(out / "ckpt.pt", "rb") as f:  # proof the file is hostile: plain unpickling runs it
        try:
            pickle.load(f) if form == "plain pickle" else torch.load(checkpoint.Payload(
                f, checkpoint.HEADER_SIZE if form == "with a valid checksum" else 0), weights_only=False)
        except Exception:
            pass
    assert marker.exists()


def test_config_file_is_parsed_never_executed(tmp_path):
    marker = tmp_path / "MARKER"
    config = tmp_path / "evil.py"
    config.write_text(f"batch_size = __import__('os').system('touch {marker}')\n", encoding="utf-8")
    proc = run_script("train.py", str(config), cwd=tmp_path)
    assert proc.returncode == 1
    assert assert_one_error_line(proc.stderr) == (f"error: {config}:1: batch_size must be a literal value "
                                           "(config files are parsed, never executed)")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------- DDP

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")


@needs_gloo
@pytest.mark.parametrize("failure", ["rank 1 raises", "rank 0 cannot save"])
def test_ddp_rank_failure_stops_every_rank(tmp_path, data_dir, failure):
    """One rank fails on its own (a test wrapper raising on rank 1, or rank 0 alone finding the disk full as it
    writes latest.pt); the other must not hang in a collective: the whole job exits non-zero within a minute."""
    out = tmp_path / "out"
    if failure == "rank 1 raises":
        script, expected = wrapper(tmp_path, rank1=3), "error: rank 1 failed on purpose"
    else:  # only rank 0 writes checkpoints
        script, expected = wrapper(tmp_path, enospc=("latest.pt", 2)), f"error: disk full while writing {out}"
    run = Run(command("ddp", data_dir, out, script=script), tmp_path / "log")
    start = time.time()
    rc = run.wait(timeout=60)
    assert rc != 0
    assert expected in run.stderr, run.stderr
    assert time.time() - start < 60


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
    first = Run(command("ddp", data_dir, out, "--init_from=auto", script=wrapper(tmp_path, signal=("SIGUSR1", 9, [1]))),
                tmp_path / "usr1")
    assert first.wait(timeout=90) != 0
    assert stops_of_both_ranks(first, "SIGUSR1", out) == 9

    second = Run(command("ddp", data_dir, out, "--init_from=auto"), tmp_path / "term")
    wait_for_iteration(second, out, 17)
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(timeout=90) != 0
    assert 17 <= stops_of_both_ranks(second, "SIGTERM", out) < ITERS

    Run(command("ddp", data_dir, out, "--init_from=auto"), tmp_path / "rest").check_ok()
    assert_same_losses(out, reference("ddp"))


# ---------------------------------------------------------------------------------------------- a finished run


def test_resuming_a_finished_run_says_so_and_writes_nothing(tmp_path, data_dir, trained_run):
    """--init_from=auto (or resume) on a run with nothing left: one line saying why, exit 0, no file touched;
    a run that continues says where from."""
    import shutil

    from conftest import TRAINED_RUN, check_ok

    out = tmp_path / "out"
    shutil.copytree(trained_run[0], out)
    def files():  # run.lock is taken by every train.py that looks at the folder: the rest must not change
        return {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.lock"}

    before = files()
    for start in ("--init_from=auto", "--init_from=resume"):
        proc = check_ok(run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN, start)))
        lines = proc.stdout.strip().splitlines()
        assert lines == [f"resuming from iteration 30 of 30 ({out / 'latest.pt'})",
                         f"the run in {out} is finished (all 30 iterations are done); nothing to do: raise "
                         "--max_iters or --max_time to train it further, or start another run in a new --out_dir"]
        assert files() == before
    more = check_ok(run_script("train.py", *train_args(data_dir, out, *TRAINED_RUN, "--init_from=auto",
                                                        "--max_iters=32")))
    assert more.stdout.startswith(f"resuming from iteration 30 of 32 ({out / 'latest.pt'})\n")
    assert max(logged(out, "eval", "val_loss")) == 32


@pytest.mark.parametrize("when,extra,doing", [
    ("first", [], "evaluating before the first step (nothing was saved)"),
    ("first", ["--eval_only=True", "--init_from=resume"],
     "evaluating (eval_only: nothing is written but this evaluation's record)"),
    ("final", [], "scoring the whole val split at the end (the trained state is saved in {latest})"),
])
@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1"])
def test_a_signal_outside_the_loop_stops_with_one_line_and_its_status(tmp_path, data_dir, when, extra, doing, name):
    """The first evaluation, eval_only and the final score are not steps to finish: a signal there stops the
    run at once, saying what it interrupted, with the documented status 128 + the signal's number."""
    out = tmp_path / "out"
    if "--init_from=resume" in extra:
        Run(train_cmd(data_dir, out, *COMMON), tmp_path / "first").check_ok()
    before = {p.name: p.read_bytes() for p in out.glob("*.pt")}
    run = Run(train_cmd(data_dir, out, *COMMON, *extra, script=wrapper(tmp_path, eval_signal=(name, when))),
              tmp_path / "stopped")
    assert run.wait() == 128 + getattr(signal, name)
    assert assert_one_error_line(run.stderr) == f"error: stopped by {name} while " + doing.format(
        latest=out / "latest.pt")
    if when == "final":
        assert load_checkpoint(out / "latest.pt")["iter_num"] == ITERS
    else:
        assert {p.name: p.read_bytes() for p in out.glob("*.pt")} == before
