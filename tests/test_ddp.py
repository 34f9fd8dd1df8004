"""Two CPU processes with DDP over gloo: the run finishes, rank 0 alone writes the checkpoint and metrics."""

import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import REPO
from gptkit.checkpoint import load_checkpoint
from gptkit.metrics import read_metrics

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no gloo backend")


def test_ddp_two_processes(data_dir, tmp_path):
    """gradient_accumulation_steps=1 with 2 processes: fewer micro-batches than processes, each takes one.
    (Two micro-batches over two processes run in test_reliability's DDP tests.)"""
    accum = 1
    out = tmp_path / "out"
    max_iters, log_interval = 6, 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out}", "--device=cpu", "--dtype=float32",
           "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
           f"--gradient_accumulation_steps={accum}", f"--max_iters={max_iters}", "--eval_interval=3", "--eval_iters=2",
           f"--log_interval={log_interval}", "--warmup_iters=1"]
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
