"""train.py end to end: what a run writes (checkpoints, metrics, the final score), evaluation only, the time budget,
each shipped preset, gradient accumulation and the weight average, and how a run ends: a non-finite loss, Ctrl-C
(once, or twice during a save), a stop signal outside the training loop, none of which touches the best weights."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import sample
import train
from conftest import (BPE_VOCAB, REPO, Run, assert_one_error_line, check_ok, faulty_train, logged, run_here, run_script,
                      train_args, train_cmd)
from gptkit.base.errors import UserError
from gptkit.base.settings import make
from gptkit.data.dataset import Split, load_meta
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.run.checkpoint import TRAINING_KEYS, load_checkpoint, model_from_checkpoint
from gptkit.run.metrics import read_metrics
from gptkit.run.run_folder import load_model
from gptkit.training.evaluation import evaluate_split
from gptkit.training.train_config import TrainConfig
from test_checkpoints import digest
from test_resume import COMMON, ITERS, resume_args

# ---------------------------------------------------------------------------------------------- a run

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
    assert run["params"] == model.num_params() and run["flops_per_token"] == model.flops_per_token(32)
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


def test_train_scores_a_final_eval_shorter_than_a_block(tmp_path, data_dir):
    out = tmp_path / "out"
    proc = check_ok(run_script("train.py", *train_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                                       "--eval_iters=1", "--final_eval_tokens=5")))
    assert "on 5 val tokens" in proc.stdout
    assert list(logged(out, "final", "val_tokens").values()) == [5]


def digests(folder):
    return {p.name: digest(p) for p in folder.iterdir() if p.suffix == ".pt"}


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


def test_max_time_by_the_clock_covers_the_whole_run_and_a_resume_spends_only_what_is_left(tmp_path, data_dir):
    """With wall_clock, max_time is the whole run's: start-up, steps, evaluations, saves and the final score. The
    seconds spent
    travel in the checkpoint (all of them, once the budget ended the run): a resumed run with the same budget
    takes no step, and with a larger one it trains until the two runs together reach it."""
    out = tmp_path / "timed"
    args = ["--max_iters=1000000", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
            "--wall_clock=True", "--max_time=4.0"]  # the budget keeps two seconds for the exit: give it more
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


def test_an_evaluation_that_spends_the_budget_is_the_last_one(tmp_path, data_dir, monkeypatch):
    """Where a regular evaluation leaves no time for another, the run ends at it, rather than taking one more step
    and printing a second evaluation of almost the same weights (the budget is made to run out by that
    evaluation)."""
    from gptkit.training.budget import TimeBudget

    evaluated = TimeBudget.evaluated

    def counted(self, seconds, per_token):
        self.evaluations = getattr(self, "evaluations", 0) + 1
        evaluated(self, seconds, per_token)
    monkeypatch.setattr(TimeBudget, "evaluated", counted)
    monkeypatch.setattr(TimeBudget, "over", lambda self: getattr(self, "evaluations", 0) >= 2)
    out = tmp_path / "out"
    train.main(train_args(data_dir, out, "--max_iters=100", "--eval_interval=4", "--eval_iters=1", "--log_interval=1",
                          "--max_time=1000", "--wall_clock=True"))
    assert [r["iter"] for r in read_metrics(out) if r["kind"] == "eval"] == [0, 4]
    assert load_checkpoint(out / "latest.pt")["iter_num"] == 4


PRESETS = sorted(p.name for p in (REPO / "config").glob("shakespeare_char*.py"))


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_train(preset, data_dir, tmp_path):
    """Each tinyshakespeare preset, on the tiny corpus: its own model and recipe (smaller batches, eager,
    fp32) takes a few steps without NaN and ends with a finite whole-split score. The default preset as a user
    runs it, the others in this process."""
    out = tmp_path / "out"
    train_py = run_script if preset == "shakespeare_char.py" else run_here
    check_ok(train_py("train.py", f"config/{preset}", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out}",
                      "--device=cpu", "--dtype=float32", "--compile=False", "--batch_size=2", "--max_iters=3",
                      "--eval_interval=3", "--eval_iters=1", "--log_interval=1", "--max_time=0"))
    records = read_metrics(out)
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    final = next(r for r in records if r["kind"] == "final")
    assert len(losses) == 3 and all(0 < x < 10 for x in [*losses, final["val_loss"]])


def test_gradient_accumulation_gives_the_update_of_one_big_batch(tmp_path, data_dir):
    """train.py with 2 micro-batches of 4 takes the same step as with one batch of 8: the sampler draws
    the same 8 windows either way, and each micro-batch's loss is divided by the number of them."""
    # one attention path for both: each run's probe could pick another, whose sums round differently
    common = ["--max_iters=2", "--eval_interval=100", "--eval_iters=1", "--warmup_iters=0", "--learning_rate=1e-2",
              "--grad_clip=0", "--attention_path=written"]
    shapes = {"big": ["--batch_size=8"], "accum": ["--batch_size=4", "--gradient_accumulation_steps=2"]}
    for name, shape in shapes.items():
        train.main(train_args(data_dir, tmp_path / name, *common, *shape))
    big, accum = (load_checkpoint(tmp_path / name / "latest.pt") for name in ("big", "accum"))
    assert big["iter_num"] == accum["iter_num"] == 2
    big, accum = big["model"], accum["model"]
    for key in big:
        torch.testing.assert_close(accum[key], big[key], rtol=0, atol=1e-6)


def test_with_a_weight_average_the_runs_score_and_checkpoint_the_average(tmp_path, data_dir):
    """The final score is the score of latest.pt's model, the average; the weights trained on are kept beside it."""
    train.main(train_args(data_dir, tmp_path, "--max_iters=20", "--eval_interval=10", "--eval_iters=1",
                          "--warmup_iters=2", "--learning_rate=1e-2", "--ema_decay=0.9"))
    ckpt = load_checkpoint(tmp_path / "latest.pt")
    assert any(not torch.equal(ckpt["model"][k], ckpt["trained"][k]) for k in ckpt["model"])
    folder, meta = load_meta(str(data_dir), "tiny")
    model = model_from_checkpoint(ckpt, "latest.pt")
    loss, _ = evaluate_split(model, Split(folder, "val", meta, 16), torch.autocast("cpu", enabled=False), 4)
    assert logged(tmp_path, "final", "val_loss")[20] == pytest.approx(loss, rel=1e-6)


def test_an_eager_run_never_imports_torchs_compiler(tmp_path, data_dir):
    """Building a torch.optim optimizer, or asking for eager evaluation, imports torch's compiler: about a second
    before the first step on a 2-core CPU. A run that compiles nothing trains, evaluates and saves without it."""
    code = ("import sys, train; train.main(sys.argv[1:]); "
            "print('compiler imported' if 'torch._dynamo' in sys.modules else 'compiler never imported')")
    args = train_args(data_dir, tmp_path / "out", "--optimizer=muon", "--ema_decay=0.9", "--max_iters=3",
                      "--eval_interval=2", "--compile=False")
    proc = check_ok(subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                                   timeout=120))
    assert proc.stdout.strip().endswith("compiler never imported"), proc.stdout


def test_wandb_records_the_settings_the_run_trains_with():
    """A run fitted to its budget trains other settings than it was given: wandb's config is the trained ones."""
    given = make(TrainConfig, {"wandb_log": True, "n_layer": 4, "muon_weight_decay": 0.6})
    fitted = replace(given, model=replace(given.model, n_layer=3), muon_weight_decay=0.3)
    args = train.wandb_args(SimpleNamespace(wandb_id="run-id", cfg=fitted))
    assert (args["id"], args["config"]["model"]["n_layer"], args["config"]["muon_weight_decay"]) == ("run-id", 3, 0.3)


# ---------------------------------------------------------------------------------------------- how a run ends

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


def test_the_notes_inverted_mask_is_named_before_any_step(tmp_path, data_dir, monkeypatch):
    """Note 003's masked_fill(mask, -inf) with mask = tril hides the positions each query may see: the first row has
    no key left, and its softmax is nan from the initial weights. The line said "try a lower learning_rate or a
    longer warmup_iters", and that the last good checkpoint was kept (there is none); now it names the model."""
    import torch.nn.functional as F

    import model as model_py

    def inverted(self, q, k):
        scores = self.score(self, q, k).masked_fill(self.visible(q.size(2), k.size(2)), float("-inf"))
        return self.hook_pattern(F.softmax(self.hook_attn_scores(scores), dim=-1))
    monkeypatch.setattr(model_py.SelfAttention, "pattern", inverted)
    with pytest.raises(UserError) as e:
        train.main(train_args(data_dir, tmp_path / "out", *COMMON))
    assert str(e.value) == (
        "val loss is nan at iteration 0, before any training step: model.py computes it from the initial weights, "
        "which no learning rate changes (first at blocks.0.attn.hook_pattern: a query whose every score is -inf, "
        "whose softmax is nan: does the mask hide the keys each query may see, masked_fill(tril, ...) where "
        "masked_fill(tril == 0, ...) is meant?)")
    assert not list((tmp_path / "out").glob("*.pt"))


def test_a_model_that_sees_the_tokens_after_each_position_is_said_to_at_the_start(tmp_path, data_dir, capsys,
                                                                                  monkeypatch):
    """The notes' encoder, causal=False or the mask line deleted by hand (its settings still causal): its loss falls
    far below what it can write, and training said nothing of it; now one note at the start, and none for a
    decoder."""
    import torch.nn.functional as F

    import model as model_py

    said = "the next token, the one it is asked to predict, is among them, so its loss will fall far below what it " \
        "can write, and its samples will be garbage\n"
    train.main(train_args(data_dir, tmp_path / "decoder", "--max_iters=1", "--eval_iters=1"))
    assert said not in capsys.readouterr().out
    train.main(train_args(data_dir, tmp_path / "encoder", "--max_iters=1", "--eval_iters=1", "--causal=False"))
    assert f"note: causal=False lets each position see the tokens after it: {said}" in capsys.readouterr().out
    monkeypatch.setattr(model_py.SelfAttention, "sdpa", lambda self, q, k, v: F.scaled_dot_product_attention(q, k, v))
    train.main(train_args(data_dir, tmp_path / "by_hand", "--max_iters=1", "--eval_iters=1"))
    assert ("note: model.py's attention lets each position see the tokens after it, though causal=True (an edit took "
            f"out or changed the mask): {said}") in capsys.readouterr().out


def test_injected_nan_keeps_the_last_good_checkpoint(tmp_path, data_dir):
    out = tmp_path / "out"
    run = Run(train_cmd(data_dir, out, *COMMON, script=faulty_train(tmp_path, nan=8)), tmp_path / "log")
    assert run.wait() == 1
    line = assert_one_error_line(run.stderr)
    assert line == ("error: loss is nan at iteration 8; stopping with the last good checkpoint kept "
                    "(try a lower learning_rate or a longer warmup_iters)")
    assert max(logged(out)) == 7
    for name in ("latest.pt", "best.pt"):
        ckpt = load_checkpoint(out / name)
        assert ckpt["iter_num"] == 5
        assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


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


def test_a_second_ctrl_c_during_a_save_exits_as_an_interrupt(tmp_path, data_dir):
    """Through the CLI: the documented exit of a second Ctrl-C (130, `error: interrupted`), the state saved
    before it (iteration 5) intact as latest.pt, and no .tmp left behind."""
    script = faulty_train(tmp_path, ctrl_c=("latest.pt", 2))  # in the second save of latest.pt
    out = tmp_path / "out"
    proc = subprocess.run(train_cmd(data_dir, out, "--max_iters=20", "--eval_interval=5", "--eval_iters=2",
                                    script=script), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert_one_error_line(proc.stderr, "error: interrupted")
    assert load_checkpoint(out / "latest.pt", required=TRAINING_KEYS)["iter_num"] == 5
    assert not (out / "latest.pt.tmp").exists() and not (out / "latest.prev.pt").exists()


@pytest.fixture(scope="module")
def finished(workdir, data_dir):
    """A run of COMMON's settings trained to its end, once, for the tests that continue it (each on a copy)."""
    out = workdir / "finished"
    Run(train_cmd(data_dir, out, *COMMON), workdir / "finished-log").check_ok()
    return out


@pytest.mark.parametrize("when,extra,doing", [
    ("first", [], "evaluating before the first step (no step was trained: the same command starts it anew)"),
    ("first", ["--eval_only=True", "--init_from=resume"],
     "evaluating (eval_only: nothing is written but this evaluation's record)"),
    ("final", [], "scoring the whole val split at the end (the trained state is saved in {latest})"),
])
@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1"])
def test_a_signal_outside_the_loop_stops_with_one_line_and_its_status(tmp_path, data_dir, request, when, extra, doing,
                                                                     name):
    """The first evaluation, eval_only and the final score are not steps to finish: a signal there stops the
    run at once, saying what it interrupted, with the documented status 128 + the signal's number."""
    out = tmp_path / "out"
    if "--init_from=resume" in extra:
        shutil.copytree(request.getfixturevalue("finished"), out)
    before = {p.name: p.read_bytes() for p in out.glob("*.pt")}
    run = Run(train_cmd(data_dir, out, *COMMON, *extra, script=faulty_train(tmp_path, eval_signal=(name, when))),
              tmp_path / "stopped")
    assert run.wait() == 128 + getattr(signal, name)
    assert assert_one_error_line(run.stderr) == f"error: stopped by {name} while " + doing.format(
        latest=out / "latest.pt")
    if when == "final":
        assert load_checkpoint(out / "latest.pt")["iter_num"] == ITERS
    else:
        assert {p.name: p.read_bytes() for p in out.glob("*.pt")} == before


def test_a_bpe_run_resumes_and_refuses_a_dataset_tokenized_by_another_trained_bpe(bpe_trained_run, bpe_data, tmp_path):
    """The checkpoint's trained tokenizer must be the dataset's, checked by checksum: the same merges continue,
    another tokenizer trained on the same text (another size) is refused in one line."""
    out = tmp_path / "run"
    shutil.copytree(bpe_trained_run, out)
    train.main([f"--data_dir={bpe_data[0]}", "--dataset=tiny_bpe", f"--out_dir={out}", "--init_from=resume",
                "--max_iters=12", "--eval_interval=5", "--eval_iters=1"])
    assert [r["iter"] for r in read_metrics(out) if r["kind"] == "final"][-1] == 12
    other = prepare(PrepareConfig(input=str(bpe_data[0].parent / "input.txt"), name="other", tokenizer="bpe",
                                  vocab_size=BPE_VOCAB + 10, data_dir=str(tmp_path), workers=1))[0]
    with pytest.raises(UserError, match=r"dataset '.*other' has a trained BPE of 310 tokens \(\w+\), but .*latest\.pt "
                                        r"was trained on a trained BPE of 300 tokens"):
        train.main([f"--dataset={other}", f"--out_dir={out}", "--init_from=resume", "--max_iters=14"])
