"""The time budget (max_time) as a user plans by it, start-up and the final score included, and the threads a
run follows as it goes.

A budget is planned in steps: max_time becomes the number of steps that fit in it on this machine idle, from the
idle speed its wisdom keeps for the model (gptkit.machine.choices), so that the same command trains the same steps,
and the same model, however busy the machine is; a busy machine takes longer, and the run says how much longer.
wall_clock=True stops at the clock instead (a race, a deadline), and max_iters, given, is what trains."""

import collections
import dataclasses
import math
import statistics
import time

from gptkit.base.errors import UserError
from gptkit.machine.threads import TRIALS_SHARE, ThreadTuner, same_gradients_on

START_SECONDS = 3.0  # an idle run's start-up to its first evaluation: the interpreter, torch, the data, the model
END_SECONDS = 1.0  # the summary, and the process's exit
RECORDS_SHARE = 0.03  # the timeline's records and the snapshots, of the time a run spends stepping (at most)
# a run's steps take about this much over the fastest of the measured ones (docs/speed.md#benchpy-fair): the data,
# the thread pool's waits, a step's spread around its median
STEP_SPREAD = 1.08
SAVE_BYTES_PER_SECOND = 100e6  # a checkpoint written and flushed to disk (latest.pt, and best.pt where it improved)
FEWEST_STEPS = 100  # a budget that fits fewer steps than this trains nothing worth sampling: said at start-up
OFF_PLAN = 0.05  # a run foretold to take this share more or less than planned says how long it will take
CHECK_SHARE = 0.1  # the share of a planned run's steps after which its pace says whether the machine is busy
FEWEST_CHECKED = 30  # the steps a busy machine is checked after, at least


class TimeBudget:
    """max_time as a user plans by it: the whole run, start-up, steps, evaluations, saves and the final score,
    across every process that worked on it (a resumed run spends what is left). The loop stops early enough to
    leave what the last evaluation, save and final score will cost, estimated from what they cost so far."""

    def __init__(self, max_time, started, final_tokens):
        self.max_time, self.started, self.final_tokens = max_time, started, final_tokens
        self.eval_seconds = self.eval_seconds_per_token = self.save_seconds = 0.0

    def spent(self):
        return time.time() - self.started

    def evaluated(self, seconds, seconds_per_token):
        self.eval_seconds, self.eval_seconds_per_token = seconds, seconds_per_token

    def saved(self, seconds):
        self.save_seconds = max(self.save_seconds, seconds)

    def reserve(self):
        """Seconds kept for the end: one more evaluation and save, then the final score, with half again as a
        margin (on a noisy machine the final score's time moves from run to run), and two seconds for the
        process to exit, which takes a compiled run a while too (docs/speed.md#what-was-tried)."""
        return 1.5 * (self.eval_seconds + self.save_seconds + self.eval_seconds_per_token * self.final_tokens) + 2.0

    def progress(self):
        """The fraction of the training time spent, 0 to 1 (what the schedule follows)."""
        if self.max_time <= 0:
            return 0.0
        return min(1.0, self.spent() / max(1e-9, self.max_time - self.reserve()))

    def over(self):
        return self.max_time > 0 and self.spent() + self.reserve() >= self.max_time


@dataclasses.dataclass
class StepCosts:
    """What a run's parts cost on this machine idle, in seconds: a step (all its micro-batches and the optimizer's
    update), an evaluation with the save after it, and the final score over the whole val split."""
    step: float
    eval: float
    final: float

    @classmethod
    def of(cls, cfg, choices, final_tokens, block_size, params, micro_batches):
        step = choices.whole_seconds + (micro_batches - 1) * choices.step_seconds
        # latest.pt holds the weights, their average and the optimizer's moments (about four copies in float32), and
        # best.pt, written at most evaluations of a short run, the average again
        save = (4 + 1) * 4 * params / SAVE_BYTES_PER_SECOND
        final = math.ceil(final_tokens / (cfg.batch_size * block_size)) * choices.forward_seconds
        return cls(step * STEP_SPREAD * (1 + RECORDS_SHARE), 2 * cfg.eval_iters * choices.forward_seconds + save,
                   final)

    def seconds(self, steps, eval_interval):
        """An idle run's wall time for `steps` steps: start-up, the evaluation before the first step and one every
        eval_interval and at the end, the final score."""
        evals = 1 + steps // eval_interval + (steps % eval_interval > 0)
        return START_SECONDS + steps * self.step + evals * self.eval + self.final + END_SECONDS

    def steps_in(self, max_time, eval_interval):
        """The most steps whose idle run takes at most max_time (0 where not even one does)."""
        n = max(0, math.floor((max_time - self.seconds(0, eval_interval)) / (self.step + self.eval / eval_interval)))
        while self.seconds(n + 1, eval_interval) <= max_time:  # the evaluations come in whole ones: settle it
            n += 1
        while n > 0 and self.seconds(n, eval_interval) > max_time:
            n -= 1
        return n


def plan_steps(cfg, choices, costs, given):
    """(cfg, lines): with a time budget, the steps the run trains, planned from max_time at this machine's idle speed
    (see the module's docstring) and kept in choices.planned for a resume; max_iters as given, or the clock, where
    the learner asked for them."""
    if cfg.max_time <= 0 or costs is None and (cfg.wall_clock or "max_iters" in given):
        return cfg, []
    if costs is None:  # pretrained weights: their step is not timed before they load
        return dataclasses.replace(cfg, wall_clock=True), [
            f"time: max_time={cfg.max_time:g} s by the clock: the step of weights loaded from elsewhere is not "
            "measured before they load, so the budget is not planned in steps (--max_iters=N trains N)"]
    if "max_iters" in given and not cfg.wall_clock:  # what trains: a max_time too short for a step is no matter
        about = costs.seconds(cfg.max_iters, cfg.eval_interval)
        return cfg, [f"steps: {cfg.max_iters:,}, as max_iters gives them (max_time={cfg.max_time:g} plans none "
                     f"then): about {about:.0f} s on this machine idle"]
    fit = costs.steps_in(cfg.max_time, cfg.eval_interval)
    step_ms = f"{costs.step * 1e3:.0f} ms a step"
    if fit < 1 and not cfg.wall_clock:  # by the clock, the first step is taken all the same
        raise UserError(f"max_time={cfg.max_time:g} fits no step of this model here ({step_ms} idle, and "
                         f"{costs.seconds(0, cfg.eval_interval):.1f} s for start-up and the scores): the least "
                         f"max_time that fits {FEWEST_STEPS} steps is {least_time(costs, cfg.eval_interval)}")
    lines = [] if fit >= FEWEST_STEPS else [
        f"note: about {fit} step{'s' * (fit != 1)} fit in max_time={cfg.max_time:g} here ({step_ms} idle), too few "
        f"to train (fewer than {FEWEST_STEPS}): give --max_time={least_time(costs, cfg.eval_interval)} or more, or "
        "a smaller model"]
    if cfg.wall_clock:
        return cfg, lines + [f"time: max_time={cfg.max_time:g} s by the clock (wall_clock=True): the run stops when "
                             f"they are spent, after about {fit:,} steps here idle, fewer when the machine is busy"]
    idle = costs.seconds(fit, cfg.eval_interval)
    choices.planned = {"steps": fit, "step": costs.step, "eval": costs.eval, "final": costs.final,
                       "idle_seconds": idle, "measuring": choices.measuring_seconds}
    return dataclasses.replace(cfg, max_iters=fit), lines + [
        f"steps: {fit:,}, planned from max_time={cfg.max_time:g} at this machine's idle speed ({step_ms}; with "
        f"the evaluations and the final score, about {idle:.0f} s idle): the same command trains the same steps, "
        "idle or busy (--wall_clock=True stops at the clock instead)"]


def least_time(costs, eval_interval):
    return math.ceil(costs.seconds(FEWEST_STEPS, eval_interval))


class Pace:
    """A planned run's steps against the plan's idle speed: once a tenth of them are timed, one line where the run
    will take OFF_PLAN more or less than planned, with the time it will take (the machine is busy, or its steps run
    faster than the one idle measurement said); and at the end, what a comparison with another run of the same
    command is fair in."""

    def __init__(self, planned, iter_num, cfg):
        self.planned, self.cfg = planned, cfg
        checked = max(FEWEST_CHECKED, round(planned["steps"] * CHECK_SHARE)) if planned else 0
        self.check_at = iter_num + checked if planned else None
        self.recent = collections.deque(maxlen=max(1, checked // 2))
        self.steps = {False: [0, 0.0], True: [0, 0.0]}  # by trial: how many steps, and their seconds

    def stepped(self, iter_num, seconds, spent, trial=False, switched=False):
        """A line to say, or None: once, at check_at or after, where the run goes off its plan. Its steps' pace
        is the mean of the latest steps, as many as half those before the check: the first ones on a busy
        machine run slower until the thread count has followed the load (ThreadTuner), and would foretell too
        long a run; and a busy machine's steps mostly run near their idle time with a few stalled for long, so
        their median foretells too short a one (beside one busy process, the median of ten said 150 s for a run
        that took 208 s). A step of a thread trial (trial=True) is left out: the ThreadTuner keeps trials to a
        tenth of the run, and one of them in the window foretold 720 s for a run that took 534 s. Where the
        thread count changed (switched=True), the steps before it say nothing of the rest, and the check waits
        until as many have run on the new count. What the trials cost is foretold apart (trials_share)."""
        if self.check_at is None:  # said, or nothing planned to say it against
            return None
        if switched:
            self.recent.clear()
        if not trial:
            self.recent.append(seconds)
        self.steps[trial][0] += 1
        self.steps[trial][1] += seconds
        if iter_num < self.check_at or len(self.recent) < self.recent.maxlen:
            return None
        self.check_at = None
        p = self.planned
        slower = statistics.fmean(self.recent) / (p["step"] / (1 + RECORDS_SHARE))
        left = p["steps"] - iter_num
        evals = left // self.cfg.eval_interval + 1
        stepping = slower * left * p["step"] / (1 - self.trials_share())
        expected = spent + stepping + slower * (evals * p["eval"] + p["final"]) + END_SECONDS
        # a first run measures this machine before its steps (its line said so): those seconds are not a busy one
        planned = p["idle_seconds"] + p.get("measuring", 0.0)
        if abs(expected / planned - 1) <= OFF_PLAN:
            return None
        if slower > 1:
            return (f"note: this machine is busy (a step takes {slower:.1f}x its idle time): the run trains its "
                    f"{p['steps']:,} steps all the same, in about {minutes(expected)} rather than {planned:.0f} s")
        return (f"note: the steps run faster than this machine's idle measurement said ({slower:.2f}x its step): "
                f"the run takes about {minutes(expected)} rather than {planned:.0f} s")

    def trials_share(self):
        """The share of the stepping time so far that the thread trials' steps took over what as many counted
        steps take, at most what the ThreadTuner allows them: beside two busy processes trials stalled for
        seconds every minute, a tenth of the run that a pace without them left out (it said 520 s for a run that
        took 619 s)."""
        (counted, counted_seconds), (tried, tried_seconds) = self.steps[False], self.steps[True]
        if not counted or not tried:
            return 0.0
        over = tried_seconds - tried * counted_seconds / counted
        return min(TRIALS_SHARE, max(0.0, over / (counted_seconds + tried_seconds)))

    def summary(self, iter_num, tokens_per_iter, spent):
        """What this run may be compared with another in: its steps and tokens, and with a planned budget the idle
        seconds they take here."""
        idle = f", {self.planned['idle_seconds']:.0f} s of this machine idle" if self.planned else ""
        seconds = (self.planned or {}).get("measuring", 0.0)
        measuring = f", {seconds:.0f} s of it measuring this machine" if seconds >= 0.5 else ""
        return (f"fair: {iter_num:,} steps and {iter_num * tokens_per_iter / 1e6:.2f}M tokens{idle} (this run took "
                f"{spent:.0f} s{measuring})")


def minutes(seconds):
    """'2m05s', or '45 s'."""
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 100 else f"{seconds // 60}m{seconds % 60:02d}s"


def time_budget(cfg, data, state, started):
    """The run's TimeBudget: this process started at `started`, after what earlier ones spent."""
    val = data.splits["val"].length - 1
    final_tokens = min(val, cfg.final_eval_tokens) if cfg.final_eval_tokens > 0 else val
    # only a wall-clock budget stops the run; a planned one counts the time, for the summary
    return TimeBudget(cfg.max_time if cfg.wall_clock else 0.0, started - state.seconds_spent, final_tokens)


def thread_tuner(state, x, y, autocast, say):
    """Threads measured as the run goes (a ThreadTuner), from the count start-up chose, where the count is the
    run's to choose (gptkit.machine.choices: on a CPU, in one process, with threads=0 and more than one to choose
    from), and where the model's gradients are the same on any of them: else the count stays, and `say` says why."""
    choices = state.choices
    if not choices.threads:
        return None
    if not same_gradients_on((1, choices.most_threads), state.model, x, y, autocast):
        say(f"threads: {choices.threads} for the whole run, busy or idle: this model's gradients differ between 1 and "
            f"{choices.most_threads} threads in the last bits, so following the load would make two runs of one "
            "command differ (--threads=N sets the count)")
        return None
    return ThreadTuner(choices.most_threads, choices.threads)


