"""Several processes (gptkit/machine/runtime.py): two CPU processes with DDP over gloo finish the run, rank 0 alone
writing the checkpoint and metrics; one rank failing on its own stops every rank; started by train.py itself
(--processes=2), the run ends in one line however it ends, and its processes save and stop when it is killed. (Stop
signals and an exact resume on two processes: see test_resume.py.) Two torchrun "nodes" on this machine train as one
process with the same global batch, a run continues on another number of processes with the same global batch and
data order (given its config file again too) and says a batch changed anew as old → new, and a node that dies ends
the others with one line."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import train
from conftest import (REPO, Run, assert_one_error_line, faulty_train, logged, torchrun, train_args, train_cmd,
                      wait_for_iteration)
from gptkit.base.errors import UserError
from gptkit.machine.runtime import trains_here
from gptkit.run.checkpoint import load_checkpoint
from gptkit.run.metrics import read_metrics
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
    assert len(ckpt["rng"]) == 2  # every rank's RNG, for an exact resume
    gen0, gen1 = (state["sampler"]["generator"] for state in ckpt["rng"])
    assert torch.equal(gen0, gen1)  # one data order, each rank taking its stride of it
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


def started(pid):
    """(state, start time) of a process, as /proc has them ('Z': ended, left for its parent to reap); None when gone.
    The start time tells the process from a later one given its number."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], fields[19]


def still_there(processes):
    """Those of processes ({pid: its start time}) that have not ended: a process ending closes its files (the run's
    lock among them) before it is a zombie, but its command line is gone before that."""
    return [pid for pid, start in processes.items() if (now := started(pid)) and now[0] != "Z" and now[1] == start]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the processes through Linux's /proc")
def test_processes_whose_launcher_is_killed_save_and_stop_and_the_same_command_continues(data_dir, tmp_path,
                                                                                       monkeypatch):
    """kill -9 of `python train.py --processes=2` passes no stop on: its processes see it gone and stop within
    seconds as SIGTERM stops them (the step finishes, latest.pt saves it), freeing the run's lock, so that the same
    command, requeued, continues the run. (They trained on to the end, holding the lock: the requeued command was
    refused as "in use by another run".)"""
    out = tmp_path / "out"
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the launcher keeps its processes' stderr, left there now
    command = train_cmd(data_dir, out, *UNTIL_STOPPED, "--init_from=auto")
    run = Run(command, tmp_path / "first")
    wait_for_iteration(run, out, 2)
    children = {int(pid): started(pid)[1]
                for pid in Path(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children").read_text().split()}
    assert len(children) == 2
    run.proc.kill()  # the launcher alone: its processes are in sessions of their own
    run.proc.wait()
    try:
        deadline = time.time() + 10
        while still_there(children) and time.time() < deadline:
            time.sleep(0.1)
        assert not still_there(children), "still training 10 s after their launcher was killed"
    finally:
        for pid in still_there(children):
            os.kill(pid, signal.SIGKILL)
    said = {path.read_text() for path in tmp_path.glob("gptkit-processes-*/*/attempt_*/*/stderr.log")}
    assert len(said) == 1, said  # both processes stopped at the same step, and said so alike
    line = said.pop().strip()
    assert re.fullmatch(rf"error: stopped by SIGTERM at iteration (\d+); latest state saved to "
                        rf"{re.escape(str(out / 'latest.pt'))}, continue with --init_from=auto", line), line
    saved = load_checkpoint(out / "latest.pt")["iter_num"]
    assert saved == int(re.search(r"iteration (\d+);", line).group(1))
    again = Run(command + [f"--max_iters={saved + 2}"], tmp_path / "again").check_ok()
    assert f"resuming from iteration {saved} of {saved + 2}" in again.stdout
    assert load_checkpoint(out / "latest.pt")["iter_num"] == saved + 2


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
    from gptkit.base.errors import UserError
    from gptkit.machine.runtime import Runtime

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"^backend nccl needs CUDA GPUs and a torch built with NCCL \(device here: "
                                        r"cpu\); use --backend=gloo, or auto$"):
        Runtime(device="cpu", backend="nccl")
    assert not dist.is_initialized()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(rank, port, *args):
    """The command line of one of two torchrun nodes of one process each, meeting at a rendezvous on this
    machine's loopback as two machines would over a network (docs/multi_node.md)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=test", "train.py", *args]


# float32 on one thread each, no dropout: what differs between the runs compared below is only the order of sums
ALIKE = ["--threads=1", "--lr_decay_iters=12", "--eval_interval=6", "--eval_iters=2", "--log_interval=1",
         "--warmup_iters=2", "--batch_order=epochs", "--optimizer=adamw"]
TOLERANCE = 1e-5  # of a loss near 4: float32 sums in another order (they differed by 2.4e-7 at most)


def assert_losses_follow(out, reference, iterations):
    for kind, field in [("train", "loss"), ("eval", "val_loss")]:
        ours, theirs = logged(out, kind, field), logged(reference, kind, field)
        for i in (i for i in iterations if i in theirs):
            assert abs(ours[i] - theirs[i]) < TOLERANCE, (kind, i, ours[i], theirs[i])


@pytest.mark.slow
def test_two_nodes_train_as_one_process_taking_the_same_global_batch(data_dir, tmp_path):
    """Two nodes of one process, one micro-batch of 4 each, against one process with two micro-batches of 4."""
    port, nodes = free_port(), tmp_path / "nodes"
    runs = [Run(node(rank, port, *train_args(data_dir, nodes, *ALIKE, "--max_iters=12")), tmp_path / f"node{rank}")
            for rank in (0, 1)]
    alone = tmp_path / "alone"
    for run in runs:
        run.wait(timeout=240)
        assert run.proc.returncode == 0, run.stderr
    Run(train_cmd(data_dir, alone, *ALIKE, "--max_iters=12", "--gradient_accumulation_steps=2"),
        tmp_path / "alone-log").check_ok()
    assert_losses_follow(nodes, alone, range(1, 13))
    assert logged(nodes, "train", "tokens")[12] == logged(alone, "train", "tokens")[12] == 12 * 8 * 16
    assert "iter 12:" in runs[0].stdout and "iter 12:" not in runs[1].stdout  # rank 0 reports and writes


@pytest.mark.slow
@pytest.mark.parametrize("saved_by, continued_on, note", [
    (2, 1, "continues on 1: each takes 2 micro-batches of 4 sequences a step, the 8 a step it was saved with"),
    (1, 2, "continues on 2: each takes 1 micro-batch of 2 sequences a step, the 4 a step it was saved with")])
def test_a_run_continues_on_another_number_of_processes_as_it_would_have_gone_on(data_dir, tmp_path, saved_by,
                                                                                 continued_on, note):
    """Saved at iteration 6 by some processes, continued to 12 on another number: the same sequences a step
    (accumulation or a smaller micro-batch makes up the difference), the optimizer's state and the data order
    where they were, so the losses after the resume are those of a run on one process that never stopped."""
    def on(processes, out, *extra):
        args = train_args(data_dir, out, *ALIKE, *extra)
        return torchrun("train.py", *args) if processes == 2 else [sys.executable, "train.py", *args]

    reference, resized = tmp_path / "reference", tmp_path / "resized"
    accumulate = f"--gradient_accumulation_steps={saved_by}"  # 2 micro-batches of 4 on one process: 8 a step
    Run(on(1, reference, accumulate, "--max_iters=12"), tmp_path / "r").check_ok()
    Run(on(saved_by, resized, "--max_iters=6"), tmp_path / "first").check_ok()
    second = Run(on(continued_on, resized, "--init_from=resume", "--max_iters=12"), tmp_path / "second").check_ok()
    assert f"note: this run was saved by {saved_by} process{'es' * (saved_by > 1)} and {note}" in second.stdout
    assert_losses_follow(resized, reference, range(7, 13))
    assert logged(resized, "train", "tokens")[12] == 12 * 4 * saved_by * 16


@pytest.mark.slow
def test_a_run_given_its_config_file_again_keeps_its_global_batch_and_a_new_one_is_said(data_dir, tmp_path, capsys):
    """A preset says batch_size=16; the run started with --batch_size=4 on 2 processes takes 8 sequences a step.
    Continued on 1 process by the same preset, it keeps 8 (it took the preset's 16, and said "the 16 a step it
    started with"). A batch the command line sets anew is said as old → new."""
    out, preset = tmp_path / "out", tmp_path / "preset.py"
    preset.write_text("batch_size = 16\ngradient_accumulation_steps = 1\n")
    args = [str(preset), *(a for a in train_args(data_dir, out) if not a.startswith("--batch_size")),
            "--eval_interval=2", "--eval_iters=2", "--log_interval=1", "--warmup_iters=1", "--init_from=auto"]
    Run([sys.executable, "train.py", *args, "--batch_size=4", "--processes=2", "--max_iters=2"],
        tmp_path / "first").check_ok()
    train.main([*args, "--max_iters=4"])
    said = capsys.readouterr().out
    assert "note: the config file's batch_size=16 is not the 4 this run was saved with: it keeps 4, and its global " \
           "batch (--batch_size=16 would change them)" in said, said
    assert "note: this run was saved by 2 processes and continues on 1: each takes 2 micro-batches of 4 sequences a " \
           "step, the 8 a step it was saved with, in the same data order; " in said, said
    assert load_checkpoint(out / "latest.pt")["global_batch"] == 8 and "128 tokens per iteration" in said
    train.main([*args, "--max_iters=6", "--gradient_accumulation_steps=4"])
    said = capsys.readouterr().out
    assert "note: the global batch changes, 8 → 16 sequences a step, as the command line sets " \
           "gradient_accumulation_steps=4; it continues on its 1 process: each takes 4 micro-batches of 4 sequences " \
           "a step; from here on the losses are another run's" in said, said
    assert load_checkpoint(out / "latest.pt")["global_batch"] == 16


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the processes through Linux's /proc")
@pytest.mark.parametrize("dies", ["rank 0's node", "the other node"])
def test_a_node_that_dies_ends_the_other_with_one_line_and_the_last_good_state_kept(data_dir, tmp_path, dies):
    """The rendezvous numbers the nodes as they arrive (node_rank is for static rendezvous only): rank 0 is the
    one that reports. Either node dying (its launcher and training process killed) ends the other."""
    out, port = tmp_path / "out", free_port()
    args = train_args(data_dir, out, "--threads=1", "--max_iters=1000000", "--eval_interval=4", "--eval_iters=2",
                      "--log_interval=2", "--warmup_iters=1")
    nodes = [Run(node(rank, port, *args), tmp_path / f"node{rank}") for rank in (0, 1)]
    wait_for_iteration(nodes[0], out, 10)
    rank0 = next(run for run in nodes if "iter 2:" in run.stdout)
    dying = rank0 if dies == "rank 0's node" else next(run for run in nodes if run is not rank0)
    survivor = next(run for run in nodes if run is not dying)
    for pid in Path(f"/proc/{dying.proc.pid}/task/{dying.proc.pid}/children").read_text().split():
        os.kill(int(pid), signal.SIGKILL)  # a machine that goes away takes its training process with it
    dying.kill_group()
    assert survivor.wait(timeout=60) != 0
    # the training process says one line; torchrun's launcher then reports in its own words (a traceback of its
    # own where the node that died held the rendezvous)
    said = [line for line in survivor.stderr.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and not re.search(r"\[rank\d\]: Traceback", survivor.stderr), survivor.stderr
    assert said[0].startswith("error: lost the connection to the process at 127.0.0.1 (port "), survivor.stderr
    saved = load_checkpoint(out / "latest.pt")
    assert saved["iter_num"] % 4 == 0 and saved["iter_num"] >= 8


def test_a_lost_peer_is_named_even_behind_the_launcher_s_stop_signal():
    """A node that dies makes gloo fail here, and torchrun's launcher send its stop signal at once; the signal's
    RunStopped may overtake the failure on its way out. Either way the one line names the lost address."""
    from gptkit.base.errors import RunStopped
    from gptkit.machine.runtime import lost_peer

    gloo = RuntimeError("[/w/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[10.0.0.2]:21641. This is typically caused by a remote worker crashing.")
    try:
        try:
            raise gloo
        except RuntimeError:
            raise RunStopped("stopped by SIGTERM while training", signal.SIGTERM)
    except RunStopped as stopped:
        behind = stopped
    for exc in (gloo, behind):
        assert lost_peer(exc).startswith("lost the connection to the process at 10.0.0.2 (port 21641): connection "
                                         "closed by peer; that process or its node stopped")
    assert lost_peer(RuntimeError("shapes do not match")) is None and lost_peer(RunStopped("x", 15)) is None
