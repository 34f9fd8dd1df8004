"""End to end through the real command lines: prepare, train, sample, resume."""

import shutil

import pytest
import torch

from batches import BatchSampler, Split
from checkpoint import load_checkpoint
from conftest import check_ok, run_script, run_scripts
from metrics import read_metrics

MODEL = ["--device=cpu", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
         "--batch_size=4"]


def train_args(data_dir, out_dir, *extra):
    return ["--data_dir=" + str(data_dir), "--dataset=tiny", "--out_dir=" + str(out_dir), *MODEL, *extra]


@pytest.fixture(scope="module")
def trained(workdir, data_dir):
    """A 12-iteration run as a user would start it."""
    out = workdir / "out"
    proc = check_ok(run_script("train.py", *train_args(data_dir, out, "--max_iters=12", "--eval_interval=6",
                                                       "--eval_iters=2", "--log_interval=3", "--warmup_iters=2")))
    return out, proc


def train_records(out_dir):
    return [r for r in read_metrics(out_dir) if r["kind"] == "train"]


def test_train_writes_checkpoint_and_metrics(trained):
    out, proc = trained
    assert "Traceback" not in proc.stderr
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 12
    assert ckpt["tokenizer"]["tokenizer"] == "char"
    assert ckpt["model_args"]["n_layer"] == 1 and ckpt["model_args"]["block_size"] == 16
    assert ckpt["config"]["max_iters"] == 12
    # exactly max_iters optimizer steps
    steps = {float(s["step"]) for s in ckpt["optimizer"][0]["state"].values()}
    assert steps == {12.0}
    assert not (out / "ckpt.pt.tmp").exists()

    records = read_metrics(out)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["iter"] for r in train] == [3, 6, 9, 12]
    for r in train:
        assert {"kind", "iter", "loss", "lr", "tokens", "elapsed_s"} <= r.keys()
        assert r["tokens"] == r["iter"] * 4 * 16
        assert 0 < r["lr"] <= 6e-4 and r["loss"] > 0
    assert [r["iter"] for r in evals] == [0, 6, 12]
    for r in evals:
        assert {"kind", "iter", "train_loss", "val_loss", "elapsed_s"} <= r.keys()
    assert evals[-1]["train_loss"] < evals[0]["train_loss"]  # it learned something
    elapsed = [r["elapsed_s"] for r in records]
    assert elapsed == sorted(elapsed)


def test_sample_is_reproducible_and_needs_only_the_checkpoint(trained, tmp_path):
    """Run from another folder: the tokenizer must come from ckpt.pt, not from the dataset."""
    out, _ = trained
    args = [f"--out_dir={out}", "--num_samples=2", "--max_new_tokens=20", "--seed=7", "--device=cpu"]
    # the third run recomputes the whole context every token, and must sample exactly the same text
    first, second, uncached = map(check_ok, run_scripts(("sample.py", *args), ("sample.py", *args),
                                                        ("sample.py", *args, "--kv_cache=False"), cwd=tmp_path))
    assert first.stdout == second.stdout
    assert first.stdout.count("---------------") == 2  # the separator after each of the other samples
    vocab = set(load_checkpoint(out / "ckpt.pt")["tokenizer"]["vocab"])
    assert set(first.stdout) - {"-"} <= vocab | {"\n"}
    assert len(first.stdout) > 40
    assert uncached.stdout == first.stdout


def test_resume_continues(trained, workdir, data_dir):
    src, _ = trained
    out = workdir / "resumed"
    shutil.copytree(src, out)
    check_ok(run_script("train.py", *train_args(data_dir, out, "--init_from=resume", "--max_iters=18",
                                                "--eval_interval=6", "--eval_iters=2", "--log_interval=3",
                                                "--warmup_iters=2")))
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 18
    iters = [r["iter"] for r in train_records(out)]
    assert iters == [3, 6, 9, 12, 15, 18]  # appended after the first run's lines, no re-run of 1..12
    evals = [r["iter"] for r in read_metrics(out) if r["kind"] == "eval"]
    assert evals == [0, 6, 12, 18]  # no extra evaluation at the resume point


def test_resume_missing_checkpoint_is_one_line_error(tmp_path, data_dir):
    proc = run_script("train.py", *train_args(data_dir, tmp_path / "empty", "--init_from=resume", "--max_iters=2"))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error:") and "ckpt.pt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_resumed_losses_equal_uninterrupted_run(workdir, data_dir):
    """Checkpoint at 12 then resume to 18 == one run to 18: weights, optimizer, schedule, RNG and data order
    all come back. Dropout and gradient accumulation make the RNG and the sampler's state matter."""
    common = ["--eval_interval=6", "--eval_iters=2", "--log_interval=1", "--warmup_iters=2",
              "--lr_decay_iters=18", "--dropout=0.1", "--gradient_accumulation_steps=2"]
    split = workdir / "split"
    whole = workdir / "whole"
    for proc in run_scripts(("train.py", *train_args(data_dir, split, "--max_iters=12", *common)),
                            ("train.py", *train_args(data_dir, whole, "--max_iters=18", *common))):
        check_ok(proc)
    check_ok(run_script("train.py", *train_args(data_dir, split, "--max_iters=18", "--init_from=resume", *common)))
    resumed = {r["iter"]: r for r in train_records(split)}
    straight = {r["iter"]: r for r in train_records(whole)}
    assert sorted(resumed) == sorted(straight) == list(range(1, 19))
    for i in range(1, 19):
        assert resumed[i]["lr"] == pytest.approx(straight[i]["lr"], rel=1e-12), i
        assert resumed[i]["loss"] == pytest.approx(straight[i]["loss"], abs=1e-6), (
            f"iteration {i}: resumed loss {resumed[i]['loss']} != uninterrupted {straight[i]['loss']}")
    a, b = load_checkpoint(split / "ckpt.pt")["model"], load_checkpoint(whole / "ckpt.pt")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0)


def test_sampler_state_redraws_the_pending_batch(tmp_path):
    """The trainer fetches one batch ahead; a sampler restored from its state must give that batch again."""
    (tmp_path / "train.bin").write_bytes(torch.arange(500, dtype=torch.int16).numpy().tobytes())
    split = Split(tmp_path, "train", "uint16", 8)
    sampler = BatchSampler(split, 3, 0, "cpu")
    sampler.next()
    pending, _ = sampler.next()
    state = sampler.state_dict()
    after, _ = sampler.next()
    restored = BatchSampler(split, 3, 99, "cpu")
    restored.load_state_dict(state)
    again, _ = restored.next()
    assert torch.equal(again, pending)
    assert torch.equal(restored.next()[0], after)
    assert not torch.equal(pending, after)
