"""Fault injection: SIGKILL at any moment, a crash in the middle of a checkpoint write, a full disk, Ctrl-C,
non-finite losses, hostile checkpoints and a failing DDP rank. Each test builds its own tiny corpus and runs
the real command lines on the CPU; a resumed run must give the uninterrupted run's losses exactly."""

import errno
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

from conftest import REPO, Run, assert_one_error_line, logged, run_script, train_cmd, wait_for_iteration
from gptkit import checkpoint
from gptkit.checkpoint import load_checkpoint, save_checkpoint
from gptkit.errors import UserError

ITERS = 120  # long enough that a kill lands mid-run; a CPU step here takes a few milliseconds
COMMON = [f"--max_iters={ITERS}", "--log_interval=1", "--eval_interval=5", "--eval_iters=2",
          "--always_save_checkpoint=True", "--dropout=0.1", "--warmup_iters=5"]
CONFIGS = {  # dropout makes the torch RNG matter, accumulation the sampler's state between micro-batches
    "adamw": ["--optimizer=adamw"],
    "muon-accum2": ["--optimizer=muon", "--gradient_accumulation_steps=2"],
}
LOSS_TOL = 1e-6


# ---------------------------------------------------------------------------------------------- helpers

def assert_same_losses(resumed_dir, reference):
    """Every iteration's loss (and learning rate, and every evaluation) equals the uninterrupted run's."""
    for kind, field, tol in [("train", "loss", LOSS_TOL), ("train", "lr", 0.0), ("eval", "val_loss", LOSS_TOL)]:
        resumed, straight = logged(resumed_dir, kind, field), reference[kind, field]
        assert sorted(resumed) == sorted(straight) and len(straight) >= ITERS // 5, (kind, sorted(resumed))
        for i in straight:
            assert abs(resumed[i] - straight[i]) <= tol, (
                f"iteration {i}: resumed {field} {resumed[i]!r} != uninterrupted {straight[i]!r}")


@pytest.fixture(scope="module")
def reference(workdir, data_dir):
    """Uninterrupted runs of every config, started together in the background; get(name) waits for one."""
    runs = {name: Run(train_cmd(data_dir, workdir / f"ref-{name}", *COMMON, *extra), workdir / f"ref-{name}-log")
            for name, extra in CONFIGS.items()}
    cache = {}

    def get(name):
        if name not in cache:
            runs[name].check_ok()
            cache[name] = {(kind, field): logged(workdir / f"ref-{name}", kind, field)
                           for kind, field in [("train", "loss"), ("train", "lr"), ("eval", "val_loss")]}
            assert sorted(cache[name]["train", "loss"]) == list(range(1, ITERS + 1))
        return cache[name]

    yield get
    for run in runs.values():
        run.kill_group()


WRAPPER = '''
import io, os, signal, sys
sys.path.insert(0, {repo!r})
sys.argv[0] = os.path.join({repo!r}, "train.py")
import train
from gptkit import checkpoint
from gptkit.errors import run_main

FAULT, NTH = {fault!r}, {nth!r}
saves = 0

class Faulty(io.FileIO):
    """A checkpoint file that dies (SIGKILL) or fills the disk after its first 4 KiB."""
    written = 0

    def write(self, data):
        if self.written + len(data) > 4096:
            if FAULT == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(28, os.strerror(28))  # ENOSPC
        self.written += len(data)
        return super().write(data)

def faulty_open(path, mode="r", *args, **kwargs):
    global saves
    if str(path).endswith(".tmp"):
        saves += 1
        if saves == NTH:
            return Faulty(path, "wb")
    return open(path, mode, *args, **kwargs)

if FAULT in ("kill", "enospc"):
    checkpoint.open = faulty_open
elif FAULT == "nan":  # the training loss of forward pass NTH becomes NaN
    import model
    real_forward = model.GPT.forward
    calls = 0

    def forward(self, *args, **kwargs):
        global calls
        logits, loss = real_forward(self, *args, **kwargs)
        if self.training and loss is not None:
            calls += 1
            if calls == NTH:
                loss = loss * float("nan")
        return logits, loss

    model.GPT.forward = forward
elif FAULT == "rank1":  # rank 1 fails on its own after DDP is up, at iteration NTH
    import torch.distributed as dist
    from gptkit.errors import UserError
    real_step = train.step_optimizers

    def step_optimizers(state, grad_clip):
        if dist.get_rank() == 1 and state.iter_num == NTH:
            raise UserError("rank 1 failed on purpose")
        return real_step(state, grad_clip)

    train.step_optimizers = step_optimizers
run_main(train.main)
'''


def wrapper(tmp_path, fault, nth):
    """A test-only script that runs train.py with one fault injected; the product code has no hooks."""
    path = tmp_path / f"train_{fault}.py"
    path.write_text(WRAPPER.format(repo=str(REPO), fault=fault, nth=nth), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- exact resume

@pytest.mark.parametrize("name,kill_at", [("adamw", 12), ("muon-accum2", 23)])
def test_sigkill_then_resume_gives_the_uninterrupted_losses(name, kill_at, tmp_path, data_dir, reference):
    """SIGKILL mid-interval (past a checkpoint), resume: every later loss equals the uninterrupted run's.
    The adamw run logs to wandb (offline): the resumed run continues the same wandb run id."""
    out = tmp_path / "out"
    extra = [*COMMON, *CONFIGS[name]]
    wandb = ["--wandb_log=True"] if name == "adamw" else []
    run = Run(train_cmd(data_dir, out, *extra, *wandb), tmp_path / "killed")
    seen = wait_for_iteration(run, out, kill_at)
    run.proc.send_signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    killed_at = max(logged(out))
    assert seen <= killed_at < ITERS, "the run finished before the kill landed"
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert 5 <= ckpt["iter_num"] <= killed_at and ckpt["iter_num"] % 5 == 0
    json.dumps(ckpt["tokenizer"])  # the tokenizer travels as plain JSON-able data

    Run(train_cmd(data_dir, out, *extra, *wandb, "--init_from=resume"), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference(name))
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == ITERS
    if wandb:  # one offline wandb run directory per process, each with its log, both continuing one run id
        runs = sorted((out / "wandb").glob("offline-run-*"))
        assert len(runs) == 2 and ckpt["wandb_id"], runs
        assert all(r.name.endswith("-" + ckpt["wandb_id"]) and list(r.glob("*.wandb")) for r in runs), runs


def test_kill_during_checkpoint_write_keeps_the_previous_one(tmp_path, data_dir, reference):
    """SIGKILL while ckpt.pt.tmp is half written (the second save, at iteration 10): ckpt.pt is still the one
    from iteration 5, the .tmp is never loaded, and resuming from 5 reproduces the uninterrupted losses."""
    out = tmp_path / "out"
    extra = [*COMMON, *CONFIGS["adamw"]]
    run = Run(train_cmd(data_dir, out, *extra, script=wrapper(tmp_path, "kill", 2)), tmp_path / "killed")
    assert run.wait() == -signal.SIGKILL
    tmp = out / "ckpt.pt.tmp"
    assert 0 < tmp.stat().st_size <= 4096
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 5
    assert max(logged(out)) == 10
    with pytest.raises(Exception):
        torch.load(tmp, weights_only=True)  # what the .tmp holds is not a checkpoint

    Run(train_cmd(data_dir, out, *extra, "--init_from=resume"), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference("adamw"))
    assert not tmp.exists()  # a later save replaced it


def test_ctrl_c_saves_the_current_step_and_resume_is_exact(tmp_path, data_dir, reference):
    out = tmp_path / "out"
    extra = [*COMMON, *CONFIGS["adamw"]]
    run = Run(train_cmd(data_dir, out, *extra), tmp_path / "interrupted")
    wait_for_iteration(run, out, 7)
    run.proc.send_signal(signal.SIGINT)
    rc = run.wait()
    assert rc == 130, f"exit {rc}\nstderr:\n{run.stderr}"
    line = assert_one_error_line(run.stderr)
    m = re.fullmatch(r"error: interrupted at iteration (\d+); checkpoint saved to (.+), "
                     r"continue with --init_from=resume", line)
    assert m, line
    stopped = int(m.group(1))
    assert Path(m.group(2)) == out / "ckpt.pt"
    assert stopped == max(logged(out)) < ITERS  # the step under way finished, was logged and saved
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == stopped

    Run(train_cmd(data_dir, out, *extra, "--init_from=resume"), tmp_path / "resumed").check_ok()
    assert_same_losses(out, reference("adamw"))


def test_every_rng_round_trips_through_a_checkpoint(tmp_path):
    """torch, numpy, python and the sampler (which redraws the batch it had fetched ahead) come back exactly."""
    import random

    import numpy as np

    from gptkit.dataset import BatchSampler, Split
    from gptkit.training import rng_state, set_rng_state

    (tmp_path / "train.bin").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    sampler = BatchSampler(Split(tmp_path, "train", "uint16", 8), 3, 0, "cpu")
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


def test_disk_full_during_training_is_one_line_and_keeps_the_last_checkpoint(tmp_path, data_dir):
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *COMMON, "--max_iters=20", script=wrapper(tmp_path, "enospc", 2)),
              tmp_path / "log")
    assert run.wait() == 1
    assert assert_one_error_line(run.stderr) == (f"error: disk full while writing {out / 'ckpt.pt'}; "
                                          "the previous checkpoint is intact")
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 5
    assert not (out / "ckpt.pt.tmp").exists()


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
    assert iteration <= 5 and not (out / "ckpt.pt").exists()  # no good step was ever saved


def test_injected_nan_keeps_the_last_good_checkpoint(tmp_path, data_dir):
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *COMMON, script=wrapper(tmp_path, "nan", 8)), tmp_path / "log")
    assert run.wait() == 1
    line = assert_one_error_line(run.stderr)
    assert line == ("error: loss is nan at iteration 8; stopping with the last good checkpoint kept "
                    "(try a lower learning_rate or a longer warmup_iters)")
    assert max(logged(out)) == 7
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 5
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


# ---------------------------------------------------------------------------------------------- safety

class RunsCode:
    """Unpickling this runs a shell command: what a hostile 'checkpoint' would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("form", ["torch.save", "plain pickle"])
def test_hostile_checkpoint_is_refused_without_running_it(tmp_path, data_dir, form):
    out, marker = tmp_path / "out", tmp_path / "MARKER"
    out.mkdir()
    state = {"format_version": 1, "model": RunsCode(marker), "iter_num": 0}
    if form == "torch.save":
        torch.save(state, out / "ckpt.pt")
    else:
        with open(out / "ckpt.pt", "wb") as f:
            pickle.dump(state, f)
    runs = [Run([sys.executable, str(REPO / "sample.py"), f"--out_dir={out}", "--device=cpu"], tmp_path / "sample"),
            Run(train_cmd(data_dir, out, "--init_from=resume", "--max_iters=2"), tmp_path / "train")]
    for run in runs:
        assert run.wait() == 1
        line = assert_one_error_line(run.stderr)
        assert line.startswith(f"error: refusing to load {out / 'ckpt.pt'}: it holds objects other than tensors"), line
        if form == "torch.save":
            assert "GLOBAL posix.system" in line  # names what it refused
        assert not marker.exists(), "the checkpoint ran code"
    with open(out / "ckpt.pt", "rb") as f:  # proof the file is hostile: plain unpickling runs it
        try:
            torch.load(f, weights_only=False) if form == "torch.save" else pickle.load(f)
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

@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")
@pytest.mark.parametrize("failure", ["rank 1 raises", "rank 0 cannot save"])
def test_ddp_rank_failure_stops_every_rank(tmp_path, data_dir, failure):
    """One rank fails on its own (a test wrapper raising on rank 1, or rank 0 alone failing to write the
    checkpoint); the other must not hang in a collective: the whole job exits non-zero within a minute."""
    out = tmp_path / "out"
    if failure == "rank 1 raises":
        script, expected = wrapper(tmp_path, "rank1", 3), "error: rank 1 failed on purpose"
    else:  # only rank 0 writes checkpoints; a directory in the way makes its rename fail
        script, expected = REPO / "train.py", f"error: could not write checkpoint {out / 'ckpt.pt'}"
        (out / "ckpt.pt").mkdir(parents=True)
        (out / "ckpt.pt" / "keep").write_text("x")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           *train_cmd(data_dir, out, *COMMON, "--gradient_accumulation_steps=2")[2:]]
    run = Run(cmd, tmp_path / "log")
    start = time.time()
    rc = run.wait(timeout=60)
    assert rc != 0
    assert expected in run.stderr, run.stderr
    assert time.time() - start < 60


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")
def test_ddp_ctrl_c_stops_every_rank_at_the_same_step(tmp_path, data_dir):
    """Ctrl-C reaches torchrun, which passes it on to each process: they agree on one step, save it together
    and each exits with the one-line message naming that step."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "train.py"), *train_cmd(data_dir, out, *COMMON, "--max_iters=100000",
                                              "--gradient_accumulation_steps=2")[2:]]
    run = Run(cmd, tmp_path / "log")
    wait_for_iteration(run, out, 7)
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) != 0
    stops = re.findall(r"^error: interrupted at iteration (\d+);", run.stderr, flags=re.M)
    assert len(stops) == 2 and stops[0] == stops[1], run.stderr
    assert "Traceback" not in run.stderr.split("error: interrupted")[1]  # (torchrun itself may print one later)
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == int(stops[0]) == max(logged(out))
    assert len(ckpt["rng"]) == 2
