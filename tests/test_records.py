"""A run's records (gptkit/training/records.py): paced on a fake clock, within their share of the run's time so
far and of the whole run, at any load, its start and its end always."""

from contextlib import nullcontext
from types import SimpleNamespace

import torch

from conftest import tiny_model
from gptkit.interp.experiments import induction_tokens
from gptkit.interp.timeline import Probe, due
from gptkit.training.records import Pacing, Records


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def paced(steps, startup, step_s, record_s, eval_interval=250, share=0.03):
    """A run on a fake clock, recording as Reporter does: its start and its end always, and between them each step
    the timeline calls for (gptkit.interp.timeline.due, and every evaluation) where Pacing affords it. record_s:
    a record's seconds, or a function of the step. (the steps recorded, [(the paced records' seconds so far, the
    run's seconds so far)] after each record paced, and the share of the whole run every record took)."""
    clock = FakeClock(startup)
    pacing, taken, shares = Pacing(clock, share, clock=clock), [], []

    def record(step, always=False):
        if always or pacing.affords(max(clock.now, startup + steps * step_s)):
            with pacing.paid(paced=not always):
                clock.now += record_s(step) if callable(record_s) else record_s
            taken.append(step)
            shares.append((pacing.paced, clock.now))
    record(0, always=True)
    for step in range(1, steps + 1):
        clock.now += step_s
        if step == steps:
            record(step, always=True)
        elif due(step, eval_interval) or step % eval_interval == 0:
            record(step)
    return taken, shares[1:-1], pacing.spent / clock.now


def test_a_short_run_on_a_busy_machine_records_its_start_and_its_end_only():
    """Issue 63: max_time=30 beside three busy programs, 29 steps, each record 1.3 s: steps 0, 1, 2, 4, 8 and 16 took
    8 s. Now its start and its end; and the lab's full GPT in 20 s (one step, records of 2.85 s) its start and end."""
    assert paced(29, startup=5.0, step_s=0.7, record_s=1.3)[0] == [0, 29]
    assert paced(1, startup=8.0, step_s=4.0, record_s=2.85)[0] == [0, 1]


def test_a_runs_records_stay_within_their_share_of_the_whole_run_where_its_start_and_end_fit():
    """max_time=20 planned, beside three busy programs: 131 steps in 69 s, records of 0.7 s. Paced by the time so
    far alone, records at steps 50 and 100 would come, and the end's after them: 3.9% of the run. With the end's
    cost kept, the records are the start's and the end's: 2%. A long run's records stay within the share too."""
    taken, _, whole = paced(131, startup=8.0, step_s=0.465, record_s=0.7, eval_interval=25)
    assert taken == [0, 131] and whole <= 0.03
    taken, _, whole = paced(3000, startup=3.0, step_s=0.02, record_s=0.06, eval_interval=50)
    assert whole <= 0.03 and len(taken) > 20


def test_records_stay_within_their_share_of_the_time_so_far_at_any_load():
    """The records paced, of a steady cost, keep within 3% of the run's time after every one; where the machine grows
    busy (records 10 times dearer from step 1,000) the first dearer one goes past it, the next waits until the run
    is back within it, and the run ends within it. The run still records often, and where records are cheap, at
    every step the timeline calls for."""
    steady, shares, _ = paced(3000, startup=3.0, step_s=0.02, record_s=0.06, eval_interval=50)
    assert all(spent <= 0.03 * elapsed for spent, elapsed in shares)
    assert len(steady) > 20 and steady[0] == 0 and steady[-1] == 3000
    busier, shares, whole = paced(3000, startup=3.0, step_s=0.02, eval_interval=50,
                                  record_s=lambda step: 0.06 if step < 1000 else 0.6)
    over = [i for i, (spent, elapsed) in enumerate(shares) if spent > 0.03 * elapsed]
    assert len(over) == 1 and busier[over[0] + 1] >= 1000 and whole <= 0.03
    cheap, _, _ = paced(3000, startup=3.0, step_s=0.02, record_s=1e-4, eval_interval=50)
    assert cheap == [0, 1, 2, 4, 8, 16, 32, *range(50, 3001, 50)]


def test_the_starts_record_holds_back_no_early_record():
    """config/induction.py idle: 3 s to the first step, 24 ms a step, its first record 0.1 s (warming up), the
    others 0.05 s, a record due every 25 steps. Its heads form between steps 175 and 250: a record lands in the
    change, as none could were the start's cost counted against the time so far (the first record paced then came
    at step 300)."""
    taken, _, _ = paced(3000, startup=3.0, step_s=0.024, record_s=lambda step: 0.1 if step == 0 else 0.05,
                        eval_interval=25)
    assert {150, 225} <= set(taken)


def test_a_resumed_run_counts_its_earlier_processes_records_at_their_whole_share():
    clock = FakeClock(110.0)  # 100 s spent before this process
    pacing = Pacing(clock, 0.03, before=100.0, clock=clock)
    assert pacing.affords(1000.0)  # 3 s of records at the most before, 3.3 s allowed now, this one's cost unknown
    with pacing.paid():
        clock.now += 1.0
    assert not pacing.affords(1000.0)
    clock.now = (3.0 + 1.0 + 1.0) / 0.03
    assert pacing.affords(1000.0)


def timeline_of_two_steps(model):
    """What Records.take logs at steps 0 and 1 of a run of model, and what it says."""
    windows = torch.randint(model.config.vocab_size, (2, model.config.block_size))
    records, said, logged = Records.__new__(Records), [], []
    records.cfg, records.log = SimpleNamespace(timeline=True, snapshots=0), SimpleNamespace(write=logged.append)
    records.state, records.say = SimpleNamespace(model=model, scored=nullcontext), said.append
    records.probe = Probe(windows, windows, induction_tokens(model, model.config.vocab_size))
    records.pacing, records.timeline = Pacing(lambda: 1.0, 0.025), []
    records.take(0)
    records.take(1)
    return logged, said


def test_an_attention_module_of_the_learners_own_records_a_timeline_without_head_scores(monkeypatch):
    """The notes' MultiHeadAttention in Block's place has no hook points of SelfAttention's: the run's first record
    stopped training ("no hook point 'blocks.0.attn.hook_pattern' in this model"). Now it is said once, and the
    timeline goes on without head scores."""
    from test_choices import with_heads_of_its_own

    with_heads_of_its_own(monkeypatch)
    logged, said = timeline_of_two_steps(tiny_model())
    assert [r["iter"] for r in logged] == [0, 1] and not any("heads" in r for r in logged)
    assert len(said) == 1 and said[0].startswith("timeline: no head scores in this run's records: no hook point "
                                                 "'blocks.0.attn.hook_pattern' in this model (it has ")


def test_an_attention_written_past_its_pattern_hook_records_a_timeline_without_head_scores(monkeypatch):
    """The notes' averaging as a learner writes it, its own loop past self.hook_pattern: the run's first record
    stopped training ("model.py's forward never passes through the hook point ..."). Now it says so once and
    records the in-context learning score and the loss by position, without head scores, at every step."""
    import model as model_py

    def averaged(self, q, k, v):  # the mean of each position's past, without the pattern's hook
        return v.cumsum(2) / torch.arange(1, v.size(2) + 1).view(1, 1, -1, 1)
    monkeypatch.setattr(model_py.SelfAttention, "written", averaged)
    logged, said = timeline_of_two_steps(tiny_model(attention="uniform"))
    assert [r["iter"] for r in logged] == [0, 1] and not any("heads" in r for r in logged)
    assert all(len(r["loss_by_position"]) == 8 for r in logged)
    assert said == ["timeline: no head scores in this run's records: model.py's forward never passes through the "
                    "hook point blocks.0.attn.hook_pattern, which this analysis reads: an edit left out its "
                    "self.hook_pattern(...) call; put it back where model.py had it (training and sampling run "
                    "without it)"]
