"""gptkit/training/reporting.py: the overfitting warning's rule, and what a run prints and records (plain lines in a log
file, each new best.pt, the warning, the summary)."""

import json
import re

import pytest

import train
from conftest import train_args
from gptkit.interp.timeline import due
from gptkit.training.reporting import Pacing, overfitting, untrained_note

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


# ----------------------------------------------------------------------------- what the records cost


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def paced(steps, startup, step_s, record_s, eval_interval=250, share=0.03):
    """A run on a fake clock, recording as Reporter does: its start and its end always, and between them each step
    the timeline calls for (gptkit.interp.timeline.due, and every evaluation) where Pacing affords it. record_s:
    a record's seconds, or a function of the step. (the steps recorded, [(the paced records' seconds so far, the
    run's seconds so far)] after each record paced, and last before the end's)."""
    clock = FakeClock(startup)
    pacing, taken, shares = Pacing(clock, share, clock=clock), [], []

    def record(step, always=False):
        if always or pacing.affords():
            with pacing.paid(paced=not always):
                clock.now += record_s(step) if callable(record_s) else record_s
            taken.append(step)
            shares.append((pacing.spent, clock.now))
    record(0, always=True)
    for step in range(1, steps + 1):
        clock.now += step_s
        if step == steps:
            shares.append((pacing.spent, clock.now))
            record(step, always=True)
        elif due(step, eval_interval) or step % eval_interval == 0:
            record(step)
    return taken, shares[1:-1]


def test_a_short_run_on_a_busy_machine_records_its_start_and_its_end_only():
    """Issue 63: max_time=30 beside three busy programs, 29 steps, each record 1.3 s: steps 0, 1, 2, 4, 8 and 16 took
    8 s. Now its start and its end; and the lab's full GPT in 20 s (one step, records of 2.85 s) its start and end."""
    assert paced(29, startup=5.0, step_s=0.7, record_s=1.3)[0] == [0, 29]
    assert paced(1, startup=8.0, step_s=4.0, record_s=2.85)[0] == [0, 1]


def test_records_stay_within_their_share_of_the_time_so_far_at_any_load():
    """The records paced, of a steady cost, keep within 3% of the run's time after every one; where the machine grows
    busy (records 10 times dearer from step 1,000) the first dearer one goes past it, the next waits until the run
    is back within it, and the run ends within it. The run still records often, and where records are cheap, at
    every step the timeline calls for."""
    steady, shares = paced(3000, startup=3.0, step_s=0.02, record_s=0.06, eval_interval=50)
    assert all(spent <= 0.03 * elapsed for spent, elapsed in shares)
    assert len(steady) > 20 and steady[0] == 0 and steady[-1] == 3000
    busier, shares = paced(3000, startup=3.0, step_s=0.02, record_s=lambda step: 0.06 if step < 1000 else 0.6,
                           eval_interval=50)
    over = [i for i, (spent, elapsed) in enumerate(shares) if spent > 0.03 * elapsed]
    assert len(over) == 1 and busier[over[0] + 1] >= 1000 and shares[-1][0] <= 0.03 * shares[-1][1]
    cheap, _ = paced(3000, startup=3.0, step_s=0.02, record_s=1e-4, eval_interval=50)
    assert cheap == [0, 1, 2, 4, 8, 16, 32, *range(50, 3001, 50)]


def test_the_starts_record_holds_back_no_early_record():
    """config/induction.py idle: 3 s to the first step, 24 ms a step, its first record 0.15 s (warming up), the
    others 0.06 s. Its heads form between steps 175 and 250: the records pass through the change, as they could not
    were the start's cost counted against the 3% (the first record paced then came at step 300)."""
    taken, _ = paced(3000, startup=3.0, step_s=0.024, record_s=lambda step: 0.15 if step == 0 else 0.06,
                     eval_interval=50)
    assert {150, 200, 250} <= set(taken)


def test_a_resumed_run_counts_its_earlier_processes_records_at_their_whole_share():
    clock = FakeClock(110.0)  # 100 s spent before this process
    pacing = Pacing(clock, 0.03, before=100.0, clock=clock)
    assert pacing.affords()  # 3 s of records at the most before, 3.3 s allowed now, this one's cost not yet known
    with pacing.paid():
        clock.now += 1.0
    assert not pacing.affords()
    clock.now = (3.0 + 1.0 + 1.0) / 0.03
    assert pacing.affords()


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
