"""End to end through the real command lines: train, sample, resume, evaluate only, stop on a time budget."""

import hashlib
import json
import shutil

import pytest

import train
from conftest import REPO, TRAINED_RUN, check_ok, logged, run_script, train_args
from gptkit.checkpoint import load_checkpoint
from gptkit.corpus import PrepareConfig, prepare
from gptkit.errors import UserError
from gptkit.flops import flops_per_token
from gptkit.rundir import load_model
from gptkit.metrics import read_metrics


def test_train_writes_checkpoint_and_metrics(trained_run, data_dir):
    out, proc = trained_run
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "latest.prev.pt", "latest.pt", "metrics.jsonl",
                                                     "run.lock"]
    assert load_checkpoint(out / "latest.prev.pt")["iter_num"] == 20  # the state before the latest
    best = load_checkpoint(out / "best.pt")
    evals = {r["iter"]: r["val_loss"] for r in read_metrics(out) if r["kind"] == "eval"}
    assert best["val_loss"] == min(v for i, v in evals.items() if i > 0) == evals[best["iter_num"]]
    assert "optimizer" not in best and best["model_args"]["n_layer"] == 2  # weights for sampling, not for resuming
    ckpt = load_checkpoint(out / "latest.pt")
    assert ckpt["iter_num"] == 30
    assert ckpt["tokenizer"]["tokenizer"] == "char"
    assert ckpt["model_args"]["n_layer"] == 2 and ckpt["model_args"]["block_size"] == 32
    assert ckpt["model_args"]["pos_emb"] == "rope" and ckpt["model_args"]["qk_norm"] is True
    assert ckpt["config"]["max_iters"] == 30 and ckpt["config"]["model"]["n_layer"] == 2
    # exactly max_iters optimizer steps
    steps = {float(s["step"]) for s in ckpt["optimizer"][0]["state"].values()}
    assert steps == {30.0}
    records = read_metrics(out)
    run = records[0]  # what the run was: what its figures mean
    assert run["kind"] == "run" and run["dtype"] == "float32" and run["tokens_per_iter"] == 8 * 32
    model = load_model(out, "cpu")[0]
    assert run["params"] == model.num_params() and run["flops_per_token"] == flops_per_token(model, 32)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["iter"] for r in train] == [5, 10, 15, 20, 25, 30]
    for r in train:
        assert {"kind", "iter", "loss", "adamw_lr", "tokens", "elapsed_s"} <= r.keys()
        assert r["tokens"] == r["iter"] * 8 * 32
        assert 0 < r["adamw_lr"] <= 3e-3 and r["loss"] > 0
    assert [r["iter"] for r in evals] == [0, 10, 20, 30]
    final = records[-1]  # the whole val split, every target scored once
    assert final["kind"] == "final" and final["iter"] == 30 and final["val_loss"] > 0
    assert final["val_tokens"] == json.loads((data_dir / "tiny" / "meta.json").read_text())["val_tokens"] - 1
    for r in evals:
        assert {"kind", "iter", "train_loss", "val_loss", "elapsed_s"} <= r.keys()
    assert evals[-1]["train_loss"] < evals[0]["train_loss"]  # it learned something
    elapsed = [r["elapsed_s"] for r in records]
    assert elapsed == sorted(elapsed)


def test_sample_is_reproducible_and_needs_only_the_checkpoint(trained_run, tmp_path):
    """Run from another folder: the tokenizer must come from best.pt, not from the dataset."""
    out, _ = trained_run
    args = [f"--out_dir={out}", "--num_samples=2", "--max_new_tokens=20", "--seed=7", "--device=cpu", "--dtype=float32"]
    first, second = (check_ok(run_script("sample.py", *args, cwd=tmp_path)) for _ in range(2))
    assert first.stdout == second.stdout
    assert first.stdout.count("---------------") == 2  # the separator after each of the other samples
    vocab = set(load_checkpoint(out / "best.pt")["tokenizer"]["vocab"])
    assert set(first.stdout) - {"-"} <= vocab | {"\n"}
    assert len(first.stdout) > 40


def test_resume_continues(trained_run, tmp_path, data_dir):
    out = tmp_path / "resumed"
    shutil.copytree(trained_run[0], out)
    check_ok(run_script("train.py", *train_args(data_dir, out, *resume_args(), "--max_iters=40")))
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 40
    assert sorted(logged(out)) == [5, 10, 15, 20, 25, 30, 35, 40]  # appended, no re-run of 1..30
    evals = [r["iter"] for r in read_metrics(out) if r["kind"] == "eval"]
    assert evals == [0, 10, 20, 30, 40]  # no extra evaluation at the resume point


def resume_args():
    """The trained run's own settings, to continue it with --init_from=resume."""
    return [*(a for a in TRAINED_RUN if not a.startswith("--max_iters")), "--init_from=resume"]


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.suffix == ".pt"}


def test_eval_only_evaluates_and_writes_nothing_else(trained_run, tmp_path, data_dir, capsys):
    out = tmp_path / "eval"
    shutil.copytree(trained_run[0], out)
    before = digests(out)
    train.main(train_args(data_dir, out, *resume_args(), "--eval_only=True"))
    printed = capsys.readouterr().out
    assert "step 30: train loss" in printed and "iter " not in printed  # evaluated, never trained
    assert digests(out) == before
    records = read_metrics(out)
    assert [(r["kind"], r["iter"]) for r in records[-2:]] == [("run", 30), ("eval", 30)]
    assert len(records) == len(read_metrics(trained_run[0])) + 2

    fresh = tmp_path / "fresh"
    train.main(train_args(data_dir, fresh, "--eval_only=True"))
    assert not digests(fresh)
    assert [(r["kind"], r["iter"]) for r in read_metrics(fresh)] == [("run", 0), ("eval", 0)]


def test_eval_only_on_another_dataset_keeps_the_checkpoints(trained_run, tmp_path, data_dir):
    """Issue #12's data loss: --eval_only on another dataset once rewrote the checkpoint with that dataset's
    tokenizer. One with the same vocabulary is evaluated and nothing is saved; another vocabulary is refused."""
    out = tmp_path / "eval"
    shutil.copytree(trained_run[0], out)
    before = digests(out)
    same = tmp_path / "same_vocab"
    shutil.copytree(data_dir / "tiny", same)
    train.main([f"--dataset={same}", f"--out_dir={out}", "--init_from=resume", "--eval_only=True"])
    other_text = tmp_path / "other.txt"  # text with other characters than the run's
    shutil.copy(trained_run[0] / "metrics.jsonl", other_text)
    other = prepare(PrepareConfig(input=str(other_text), name="other", data_dir=str(tmp_path)))[0]
    with pytest.raises(UserError, match=r"dataset '.*other' has a vocabulary of \d+ characters, but .*latest\.pt "
                                        r"was trained on a vocabulary of \d+ characters"):
        train.main([f"--dataset={other}", f"--out_dir={out}", "--init_from=resume", "--eval_only=True"])
    assert digests(out) == before


def test_max_time_covers_the_whole_run_and_a_resume_spends_only_what_is_left(tmp_path, data_dir):
    """max_time is the whole run's: start-up, steps, evaluations, saves and the final score. The seconds spent
    travel in the checkpoint (all of them, once the budget ended the run): a resumed run with the same budget
    takes no step, and with a larger one it trains until the two runs together reach it."""
    import time

    out = tmp_path / "timed"
    args = ["--max_iters=1000000", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
            "--max_time=4.0"]  # the budget keeps two seconds for the process to exit, so give it more than that
    start = time.time()
    train.main(train_args(data_dir, out, *args))
    whole = time.time() - start
    first = load_checkpoint(out / "latest.pt")
    assert first["seconds_spent"] == 4.0 and 0 < first["iter_num"] < 1000000 and whole < 4.0 * 1.05 + 0.3
    assert max(logged(out)) == first["iter_num"]  # stopped after the step that crossed the budget, and saved it

    train.main(train_args(data_dir, out, *args, "--init_from=resume"))  # a finished run: nothing to do
    assert load_checkpoint(out / "latest.pt")["iter_num"] == first["iter_num"]

    train.main(train_args(data_dir, out, *args[:-1], "--max_time=8.0", "--init_from=resume"))
    second = load_checkpoint(out / "latest.pt")
    assert second["seconds_spent"] == 8.0 and second["iter_num"] > first["iter_num"]
    assert sorted(logged(out)) == list(range(1, second["iter_num"] + 1))


PRESETS = sorted(p.name for p in (REPO / "config").glob("shakespeare_char*.py"))


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_train(preset, data_dir, tmp_path):
    """Each tinyshakespeare preset, on the tiny corpus: its own model and recipe (smaller batches, eager,
    fp32) takes a few steps without NaN and ends with a finite whole-split score."""
    out = tmp_path / "out"
    check_ok(run_script("train.py", f"config/{preset}", f"--data_dir={data_dir}", "--dataset=tiny",
                        f"--out_dir={out}", "--device=cpu", "--dtype=float32", "--compile=False", "--batch_size=2",
                        "--max_iters=3", "--eval_interval=3", "--eval_iters=1", "--log_interval=1", "--max_time=0"))
    records = read_metrics(out)
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    final = next(r for r in records if r["kind"] == "final")
    assert len(losses) == 3 and all(0 < x < 10 for x in [*losses, final["val_loss"]])


def test_a_new_run_never_takes_over_a_used_out_dir(tmp_path, data_dir, trained_run):
    """A fresh run into a folder holding another run's state refuses in one line naming the ways on; with
    --start_over the old files move into a folder beside them, deleting nothing."""
    import shutil

    from conftest import TRAINED_RUN, assert_one_error_line

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
