"""gptkit/training/budget.py: a time budget planned in steps at this machine's idle speed, so that the same command
trains the same steps, idle or busy; max_iters or the clock where the learner asks for them; the line a busy machine
gets, and what a run is fair in."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

import train
from conftest import logged, train_args, train_config
from gptkit.base.errors import UserError
from gptkit.run.checkpoint import load_checkpoint
from gptkit.training.budget import FEWEST_STEPS, RECORDS_SHARE, STEP_SPREAD, Pace, StepCosts, plan_steps

COSTS = StepCosts(step=0.1, eval=0.5, final=2.0)


def choices():
    return SimpleNamespace(planned=None, measuring_seconds=0.0)


def test_the_planned_steps_are_the_most_whose_idle_run_fits_in_max_time():
    for max_time in (10, 37.5, 150, 600):
        n = COSTS.steps_in(max_time, 50)
        assert COSTS.seconds(n, 50) <= max_time < COSTS.seconds(n + 1, 50)
    # start-up, the evaluations (one before the first step, every 50 and at the end) and the final score
    assert COSTS.seconds(120, 50) == pytest.approx(3.0 + 120 * 0.1 + 4 * 0.5 + 2.0 + 1.0)


def test_costs_follow_the_measured_step_with_its_micro_batches_and_the_evaluations_forwards():
    measured = SimpleNamespace(whole_seconds=0.2, step_seconds=0.15, forward_seconds=0.05)
    cfg = train_config(batch_size=4, eval_iters=3)
    costs = StepCosts.of(cfg, measured, final_tokens=1000, block_size=10, params=1000, micro_batches=2)
    assert costs.step == pytest.approx((0.2 + 0.15) * STEP_SPREAD * (1 + RECORDS_SHARE))
    assert costs.final == pytest.approx(25 * 0.05)  # 1,000 tokens in windows of 4 x 10
    assert costs.eval == pytest.approx(2 * 3 * 0.05, rel=1e-3)  # both splits, and a save of a tiny model


def test_max_time_becomes_the_steps_that_fit_and_the_run_keeps_them():
    picked = choices()
    cfg, lines = plan_steps(train_config(max_time=60, eval_interval=50), picked, COSTS, given=set())
    assert cfg.max_iters == COSTS.steps_in(60, 50) and picked.planned["steps"] == cfg.max_iters
    assert picked.planned["idle_seconds"] <= 60
    assert lines == [f"steps: {cfg.max_iters:,}, planned from max_time=60 at this machine's idle speed (100 ms a "
                     f"step; with the evaluations and the final score, about {picked.planned['idle_seconds']:.0f} s "
                     "idle): the same command trains the same steps, idle or busy (--wall_clock=True stops at the "
                     "clock instead)"]


def test_max_iters_given_or_the_clock_asked_for_plan_nothing():
    picked = choices()
    cfg, lines = plan_steps(train_config(max_time=60, max_iters=77), picked, COSTS, given={"max_iters"})
    assert cfg.max_iters == 77 and picked.planned is None
    assert lines[0].startswith("steps: 77, as max_iters gives them (max_time=60 plans none then): about ")
    # max_iters is what trains: a max_time too short for one step is not refused for it
    cfg, lines = plan_steps(train_config(max_time=0.001, max_iters=2), picked, COSTS, given={"max_iters"})
    assert cfg.max_iters == 2 and lines[0].startswith("steps: 2, as max_iters gives them (max_time=0.001 plans none")
    cfg, lines = plan_steps(train_config(max_time=60, wall_clock=True), picked, COSTS, given=set())
    assert cfg.max_iters == 5000 and picked.planned is None
    assert lines[0].startswith("time: max_time=60 s by the clock (wall_clock=True): the run stops when they are spent")
    assert plan_steps(train_config(max_time=0), picked, COSTS, given=set())[1] == []
    # pretrained weights, whose step is not timed before they load: the clock, said
    cfg, lines = plan_steps(train_config(max_time=60), picked, None, given=set())
    assert cfg.wall_clock and lines[0].startswith("time: max_time=60 s by the clock: the step of weights loaded ")
    assert plan_steps(train_config(max_time=60, max_iters=9), picked, None, given={"max_iters"}) == \
        (train_config(max_time=60, max_iters=9), [])


def test_a_budget_too_short_for_one_step_is_one_line_and_too_few_steps_a_note():
    least = int(-(-COSTS.seconds(FEWEST_STEPS, 50) // 1))
    with pytest.raises(UserError, match=rf"^max_time=5 fits no step of this model here \(100 ms a step idle, and "
                                        rf"6\.5 s for start-up and the scores\): the least max_time that fits "
                                        rf"{FEWEST_STEPS} steps is {least}$"):
        plan_steps(train_config(max_time=5, eval_interval=50), choices(), COSTS, given=set())
    cfg, lines = plan_steps(train_config(max_time=12, eval_interval=50), choices(), COSTS, given=set())
    assert lines[0] == (f"note: about {cfg.max_iters} steps fit in max_time=12 here (100 ms a step idle), too few to "
                        f"train (fewer than {FEWEST_STEPS}): give --max_time={least} or more, or a smaller model")


def test_a_busy_machine_is_said_once_with_the_time_the_planned_steps_will_take():
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}
    cfg = train_config(eval_interval=50)
    busy, idle = Pace(planned, 0, cfg), Pace(planned, 0, cfg)
    said = [busy.stepped(i, 0.2, spent=3.0 + 0.2 * i) for i in range(1, 301)]
    assert [line for line in said if line] == [
        "note: this machine is busy (a step takes 2.0x its idle time): the run trains its 300 steps all the same, "
        "in about 76 s rather than 40 s"]  # 9 s at step 30, then 270 steps, 6 evaluations and the score at 2x
    assert not any(idle.stepped(i, 0.1, spent=3.0 + 0.1 * i) for i in range(1, 301))
    assert busy.summary(300, 4096, 83.4) == "fair: 300 steps and 1.23M tokens, 40 s of this machine idle (this run " \
                                            "took 83 s)"


def test_a_first_run_s_measuring_of_the_machine_is_not_called_a_busy_machine():
    """The first run of a model on a machine measures it (6 s here) before its steps, which run at their idle
    pace: it ends that much later, which the summary says, and no line calls the machine busy."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0,
               "measuring": 6.0}
    pace = Pace(planned, 0, train_config(eval_interval=50))
    assert not any(pace.stepped(i, 0.1, spent=9.0 + 0.1 * i) for i in range(1, 301))
    assert pace.summary(300, 4096, 46.2) == "fair: 300 steps and 1.23M tokens, 40 s of this machine idle (this run " \
                                            "took 46 s, 6 s of it measuring this machine)"
    busy = Pace(planned, 0, train_config(eval_interval=50))
    said = [busy.stepped(i, 0.2, spent=9.0 + 0.2 * i) for i in range(1, 31)]
    assert said[-1] == ("note: this machine is busy (a step takes 2.0x its idle time): the run trains its 300 steps "
                        "all the same, in about 82 s rather than 46 s")


def test_the_busy_line_foretells_the_run_from_its_steps_once_the_thread_count_has_followed_the_load():
    """Beside a busy process the first steps, still on two threads, ran 2.4x the idle time and the rest 1.6x
    (bench.py fair said 444 s for a run that took 312 s). The steps just before the check, not the first, say how
    long the rest takes."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}
    pace = Pace(planned, 0, train_config(eval_interval=50))
    said = [pace.stepped(i, 0.24 if i < 10 else 0.16, spent=3.0 + 0.2 * i) for i in range(1, 31)]
    assert said[-1].startswith("note: this machine is busy (a step takes 1.6x its idle time)")


def test_the_steps_of_a_thread_trial_do_not_foretell_the_run():
    """A thread trial's steps beside two busy processes stalled for seconds; the ThreadTuner keeps trials to a
    tenth of the run, so the pace leaves them out (with them, 720 s was said for a run that took 534 s)."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}
    pace = Pace(planned, 0, train_config(eval_interval=50))
    said = [pace.stepped(i, 4.0 if i in (20, 21) else 0.2, spent=3.0 + 0.2 * i, trial=i in (20, 21))
            for i in range(1, 31)]
    assert said[-1].startswith("note: this machine is busy (a step takes 2.0x its idle time)")


def test_the_busy_line_waits_for_steps_on_the_thread_count_the_run_switched_to():
    """Beside a busy process the steps on two threads stalled (0.3 s) until the ThreadTuner moved the run to one
    (0.15 s) just before the check: the line waits until as many steps have run on one thread, and foretells
    from them alone."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}
    pace = Pace(planned, 0, train_config(eval_interval=50))
    said = {i: pace.stepped(i, 0.3 if i < 25 else 0.15, spent=3.0 + 0.2 * i, trial=25 <= i <= 28,
                            switched=i == 28) for i in range(1, 301)}  # a trial of steps 25 to 28 won
    assert [i for i, line in said.items() if line] == [43]  # 15 steps on one thread, the window's length
    assert said[43].startswith("note: this machine is busy (a step takes 1.5x its idle time)")


def test_the_busy_line_foretells_the_thread_trials_by_their_share_of_the_steps_so_far():
    """Beside two busy processes the trials stalled for seconds every minute, a tenth of the run, which a pace
    without them left out (520 s said, 619 s taken). Their cost over the counted steps' so far, as a share of
    the stepping time, lengthens the rest; at most TRIALS_SHARE, all the ThreadTuner lets them take."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}

    def said(trial_seconds):
        pace = Pace(planned, 0, train_config(eval_interval=50))
        lines = [pace.stepped(i, trial_seconds if 10 <= i <= 13 else 0.2, spent=3.0 + 0.2 * i, trial=10 <= i <= 13)
                 for i in range(1, 31)]
        return lines[-1]
    # 270 steps at 2x, 6 evaluations and the score at 2x, from 9 s at step 30: 76 s without trials; trials of
    # 4 x 0.3 s took 0.4 s over 6.4 s of stepping (6.25%), and of 4 x 1.0 s more than the 10% allowed
    assert said(0.2).endswith("in about 76 s rather than 40 s")
    assert said(0.3).endswith("in about 79 s rather than 40 s")
    assert said(1.0).endswith("in about 82 s rather than 40 s")


def test_a_run_faster_than_its_plan_says_how_long_it_will_take():
    """The one idle measurement can be slower than the steps turn out (it said 150 s for a run that took 122 s):
    a run foretold more than 5% off its plan says so, faster as slower."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}
    pace = Pace(planned, 0, train_config(eval_interval=50))
    said = [pace.stepped(i, 0.07, spent=3.0 + 0.07 * i) for i in range(1, 301)]
    assert [line for line in said if line] == [
        "note: the steps run faster than this machine's idle measurement said (0.70x its step): the run takes "
        "about 29 s rather than 40 s"]  # 5.1 s at step 30, then 270 steps, 6 evaluations and the score at 0.7x


def test_the_busy_line_counts_the_few_long_stalls_of_a_busy_machine():
    """Beside a busy process most steps ran near their idle time and a few stalled for long: the median of ten
    steps said 150 s for a run that took 208 s. The mean of the steps before the check says the pace."""
    planned = {"steps": 300, "step": 0.1 * (1 + RECORDS_SHARE), "eval": 0.5, "final": 2.0, "idle_seconds": 40.0}
    pace = Pace(planned, 0, train_config(eval_interval=50))
    said = [pace.stepped(i, 0.35 if i % 5 == 0 else 0.11, spent=3.0 + 0.16 * i) for i in range(1, 31)]
    assert said[-1].startswith("note: this machine is busy (a step takes 1.6x its idle time)")


def test_the_same_command_trains_the_same_steps_beside_a_busy_process(tmp_path, data_dir):
    """A real busy process beside the second run: the steps, and so the weights, are the first run's."""
    args = ["--max_time=8", "--eval_interval=20", "--eval_iters=1", "--log_interval=1", "--threads=1"]
    train.main(train_args(data_dir, tmp_path / "idle", *args))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        train.main(train_args(data_dir, tmp_path / "busy", *args))
    finally:
        busy.kill()
    idle, loaded = (load_checkpoint(tmp_path / name / "latest.pt") for name in ("idle", "busy"))
    assert idle["iter_num"] == loaded["iter_num"] == idle["measured"]["planned"]["steps"] > 1
    assert logged(tmp_path / "idle") == logged(tmp_path / "busy")
    train.main(train_args(data_dir, tmp_path / "given", *args, "--max_iters=3"))
    assert load_checkpoint(tmp_path / "given" / "latest.pt")["iter_num"] == 3
