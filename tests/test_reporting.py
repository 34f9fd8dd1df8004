"""gptkit/training/reporting.py: the overfitting warning's rule, and what a run prints and records (plain lines in a log
file, each new best.pt, the warning, the summary)."""

import json
import re

import pytest

import train
from conftest import train_args
from gptkit.training.reporting import overfitting, untrained_note

# the default on tinyshakespeare, evaluation by evaluation: train and val fall together, val a little above
HEALTHY = [(0, 4.17, 4.17), (50, 2.45, 2.46), (100, 2.05, 2.08), (500, 1.52, 1.62), (1000, 1.38, 1.52),
           (1300, 1.33, 1.48)]


def test_a_healthy_run_is_not_called_overfitting():
    assert all(overfitting(HEALTHY[:i]) is None for i in range(1, len(HEALTHY) + 1))


def test_a_val_loss_far_above_train_loss_is_overfitting():
    """A learner's run on a short text: train 0.70 against val 1.17 at the last evaluation."""
    assert overfitting([(1000, 1.30, 1.40), (2000, 0.6979, 1.1722)]) == \
        "val loss 1.1722 is far above train loss 0.6979"


def test_val_rising_while_train_falls_is_overfitting():
    evals = [(100, 1.50, 1.55), (200, 1.45, 1.53), (300, 1.42, 1.54), (400, 1.40, 1.56), (500, 1.38, 1.57)]
    assert overfitting(evals[:4]) is None  # rising twice is not yet a trend
    assert overfitting(evals) == "val loss rose at each of the last 3 evaluations (to 1.5700) while train loss fell"
    assert overfitting(evals[:-1] + [(500, 1.41, 1.57)]) is None  # train loss rose too: not this


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_that_learns_its_text_by_heart_says_so_once(tmp_path, data_dir, capsys):
    """A model far too big for its text, trained long: one line and one health record naming the iteration best.pt
    keeps and what helps; each new best.pt is said; the summary names the files and why the final score differs."""
    out = tmp_path / "out"
    train.main(train_args(data_dir, out, "--n_layer=2", "--n_embd=128", "--block_size=32", "--batch_size=16",
                          "--max_iters=120", "--eval_interval=30", "--eval_iters=2", "--log_interval=30",
                          "--learning_rate=3e-3", "--warmup_iters=0", "--decay_lr=False", "--weight_decay=0"))
    printed = capsys.readouterr().out.splitlines()
    warned = [line for line in printed if line.startswith("overfitting: ")]
    health = [r for r in records(out) if r["kind"] == "health"]
    assert len(warned) == len(health) == 1
    best = health[0]["best_iter"]
    assert f"best.pt keeps iteration {best:,}" in warned[0] and warned[0].endswith(
        "What helps: more text, weight decay, dropout, a smaller model, fewer steps.")
    saved = [line for line in printed[:printed.index(warned[0]) + 2] if line.startswith("saved ")]
    assert saved[-1].startswith(f"saved {out / 'best.pt'}: iteration {best:,}, val loss ")  # as the warning says
    assert printed[-3].startswith("done: 120 iterations in ") and "best.pt holds iteration " in printed[-3]
    assert printed[-2].startswith("the final score reads every one of the ")
    assert printed[-1].startswith("fair: 120 steps and ")  # what a comparison with another run is fair in
    assert not any("%|" in line for line in printed)  # no progress bar outside a terminal


@pytest.mark.parametrize("verbose", [False, True])
def test_the_machinery_is_shown_only_with_verbose(tmp_path, data_dir, capsys, verbose):
    train.main(train_args(data_dir, tmp_path / "out", "--max_iters=2", "--eval_interval=2", "--dtype=auto",
                          "--attention_path=auto", f"--verbose={verbose}"))
    printed = capsys.readouterr().out
    assert "model: 1 layer × 32, " in printed and "attention: the " in printed
    assert ("step: " in printed) == verbose


def test_a_run_that_ends_near_its_starting_loss_says_it_is_untrained():
    """Within 10% of the loss before the first step: a note with what to do. A trained run, or a resumed one (it
    never saw its start), says nothing."""
    start = [(0, 4.2, 4.19)]
    note = untrained_note(start + [(1, 4.1, 4.1)], 4.05, 1)
    assert note == ("note: the model is barely trained: val loss 4.0500 after 1 step, against 4.1900 before the "
                    "first; samples from it will be noise (give it more --max_time or --max_iters)")
    assert untrained_note(start + [(300, 2.0, 2.1)], 2.05, 300) is None
    assert untrained_note([(300, 4.2, 4.19)], 4.19, 301) is None


def test_a_run_logged_to_a_file_tells_its_progress_besides_its_iteration_lines(tmp_path, data_dir, capsys,
                                                                                monkeypatch):
    """stdout in a file (no terminal): besides a line per log_interval, a 'training: N%' line with the time left
    comes every LINE_EVERY_S seconds (here at every step), so a long run's log never goes quiet."""
    from gptkit.base import progress

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0)
    train.main(train_args(data_dir, tmp_path / "out", "--max_iters=4", "--eval_interval=4", "--log_interval=2"))
    printed = capsys.readouterr().out.splitlines()
    told = [line for line in printed if line.startswith("training: ")]
    assert told and all(re.match(r"training: \d+%, \d\d:\d\d elapsed", line) for line in told)
    assert told[-1].startswith("training: 100%, ") and any(", iter 2, loss " in line for line in told)
    assert [line.split(":")[0] for line in printed if line.startswith("iter ")] == ["iter 2", "iter 4"]
