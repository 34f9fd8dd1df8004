"""The time budget (max_time) as a user plans by it, start-up and the final score included, and the threads a
run follows as it goes."""

import time

from gptkit.machine.threads import ThreadTuner


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


def time_budget(cfg, data, state, started):
    """The run's TimeBudget: this process started at `started`, after what earlier ones spent."""
    val = data.splits["val"].length - 1
    final_tokens = min(val, cfg.final_eval_tokens) if cfg.final_eval_tokens > 0 else val
    return TimeBudget(cfg.max_time, started - state.seconds_spent, final_tokens)


def thread_tuner(choices):
    """Threads measured as the run goes (a ThreadTuner), from the count start-up chose, where the count is the
    run's to choose (gptkit.machine.choices: on a CPU, in one process, with threads=0 and more than one to choose
    from)."""
    if not choices.threads:
        return None
    return ThreadTuner(choices.most_threads, choices.threads)


