"""Several processes (gptkit/runtime.py): two CPU processes with DDP over gloo finish the run, rank 0 alone writing
the checkpoint and metrics; one rank failing on its own stops every rank; started by train.py itself
(--processes=2), the run ends in one line however it ends. (Stop signals and an exact resume on two processes: see
test_resume.py.)"""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import REPO, Run, assert_one_error_line, faulty_train, torchrun, train_cmd, wait_for_iteration
from gptkit.checkpoint import load_checkpoint
from gptkit.errors import UserError
from gptkit.metrics import read_metrics
from gptkit.runtime import trains_here
from test_resume import command

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no gloo backend")


def test_ddp_two_processes(data_dir, tmp_path):
    """gradient_accumulation_steps=1 with 2 processes: fewer micro-batches than processes, each takes one.
    (Two micro-batches over two processes run in test_resume's DDP test.)"""
    accum = 1
    out = tmp_path / "out"
    max_iters, log_interval = 6, 2
    cmd = torchrun("train.py", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out}", "--device=cpu",
                   "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
                   f"--gradient_accumulation_steps={accum}", f"--max_iters={max_iters}", "--eval_interval=3",
                   "--eval_iters=2", f"--log_interval={log_interval}", "--warmup_iters=1")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    ckpt = load_checkpoint(out / "latest.pt")
    assert ckpt["iter_num"] == max_iters
    assert len(ckpt["rng"]) == 2  # every rank's RNG and data order, for an exact resume
    gen0, gen1 = (state["sampler"]["generator"] for state in ckpt["rng"])
    assert not bool((gen0 == gen1).all())  # each rank draws its own batches
    records = read_metrics(out)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == max_iters // log_interval
    assert [r["iter"] for r in train] == [2, 4, 6]
    # 2 processes x 1 micro-batch each x 4 sequences x 16 tokens per optimizer step
    assert train[-1]["tokens"] == max_iters * 2 * 4 * 16
    assert [r["iter"] for r in records if r["kind"] == "eval"] == [0, 3, 6]
    assert proc.stdout.count(f"iter {max_iters}:") == 1  # printed by rank 0 only


@pytest.mark.parametrize("failure", ["rank 1 raises", "rank 0 cannot save"])
def test_ddp_rank_failure_stops_every_rank(tmp_path, data_dir, failure):
    """One rank fails on its own (a test wrapper raising on rank 1, or rank 0 alone finding the disk full as it
    writes latest.pt); the other must not hang in a collective: the whole job exits non-zero within a minute."""
    out = tmp_path / "out"
    if failure == "rank 1 raises":
        script, expected = faulty_train(tmp_path, rank1=3), "error: rank 1 failed on purpose"
    else:  # only rank 0 writes checkpoints
        script, expected = faulty_train(tmp_path, enospc=("latest.pt", 2)), f"error: disk full while writing {out}"
    run = Run(command("ddp", data_dir, out, script=script), tmp_path / "log")
    start = time.time()
    rc = run.wait(timeout=60)
    assert rc != 0
    assert expected in run.stderr, run.stderr
    assert time.time() - start < 60


# a run of two processes that goes on until it is stopped
UNTIL_STOPPED = ["--processes=2", "--max_iters=1000000", "--eval_interval=1000000", "--eval_iters=2",
                 "--log_interval=2", "--warmup_iters=1"]


def test_sigterm_to_the_launcher_of_two_processes_is_one_line(data_dir, tmp_path):
    """`python train.py --processes=2` starts its processes itself: SIGTERM to it (and to it alone) reaches both,
    they save, and it ends with 143 and one line. (torchrun's own launcher ends with 1 and ~30 lines of its
    traceback.) stderr is a file here, not a terminal."""
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *UNTIL_STOPPED), tmp_path / "logs")
    wait_for_iteration(run, out, 4)
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 143, run.stderr
    line = assert_one_error_line(run.stderr, "error: stopped by SIGTERM at iteration *")
    assert line.endswith(f"; latest state saved to {out / 'latest.pt'}, continue with --init_from=auto"), line
    assert load_checkpoint(out / "latest.pt")["iter_num"] == int(re.search(r"iteration (\d+);", line).group(1))


def test_a_failure_every_process_meets_is_said_once(data_dir, tmp_path):
    run = Run(train_cmd(data_dir, tmp_path / "out", "--processes=2", "--dataset=missing"), tmp_path / "logs")
    assert run.wait() == 1
    assert_one_error_line(run.stderr, f"error: dataset folder {data_dir / 'missing'} not found; *")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the processes through Linux's /proc")
def test_a_process_killed_under_the_launcher_is_named_in_one_line(data_dir, tmp_path):
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *UNTIL_STOPPED), tmp_path / "logs")
    wait_for_iteration(run, out, 2)
    children = Path(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children").read_text().split()
    rank1 = next(pid for pid in children if "RANK=1" in Path(f"/proc/{pid}/environ").read_text().split("\0"))
    os.kill(int(rank1), signal.SIGKILL)
    assert run.wait() == 128 + signal.SIGKILL
    assert_one_error_line(run.stderr, "error: training process 1 of 2 was killed by SIGKILL")


def test_processes_under_torchrun_must_be_the_number_it_started(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert trains_here(1) and not trains_here(2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert trains_here(1) and trains_here(2)  # as torchrun, or train.py's own launcher, started it
    with pytest.raises(UserError, match=r"^processes=4, but torchrun started 2 processes; "):
        trains_here(4)


def test_nccl_without_cuda_is_one_line_before_any_process_group(monkeypatch):
    """--backend=nccl on a machine without CUDA GPUs: each process says so in one line (it raised a
    traceback from inside init_process_group)."""
    from gptkit.errors import UserError
    from gptkit.runtime import Runtime

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"^backend nccl needs CUDA GPUs and a torch built with NCCL \(device here: "
                                        r"cpu\); use --backend=gloo, or auto$"):
        Runtime(device="cpu", backend="nccl")
    assert not dist.is_initialized()
