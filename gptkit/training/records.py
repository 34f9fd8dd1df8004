"""What a run records of itself as it trains, from rank 0 alone: the timeline's numbers (gptkit/interp/timeline.py)
to metrics.jsonl and, with --snapshots, the weights (gptkit/training/snapshots.py); at the run's start and its
end, and between them at the steps the timeline calls for where the run can afford them (Pacing)."""

import time
from contextlib import contextmanager

from gptkit.base.errors import UserError
from gptkit.interp.hooks import MissingHookPoint
from gptkit.interp.timeline import Probe, due, has_attention, record, timeline_of, travelled
from gptkit.run.metrics import read_metrics
from gptkit.training.evaluation import eagerly
from gptkit.training.snapshots import take

# the share of a run's time that its records are paced to take: a record costs about as much however long the
# run, so a short run or a loaded machine affords fewer of them. 2.5%, not the 3% they must stay within: a
# record may cost more than the last one did, which the pacing expects of it
RECORD_SHARE = 0.025


class Pacing:
    """Whether a record a step calls for is affordable now, by two rules. The records paced so far, and this one's
    expected cost (what the last one took), stay within `share` of the run's seconds so far (elapsed()): one not
    affordable waits for a later step that calls for one. And every record, the start's too, with this one and
    as much again kept for the run's end, stays within `share` of the run's expected seconds in all. The start
    and the end are recorded always: the first rule leaves the start's record out, as it does the start-up, so
    that it holds back no early record, where a model changes fastest; the second keeps the whole run's records
    within the share wherever the start's and the end's fit in it, at any time budget and load. A resumed run's
    earlier processes (`before` seconds) are taken to have spent their share."""

    def __init__(self, elapsed, share, before=0.0, clock=time.perf_counter):
        self.elapsed, self.share, self.clock = elapsed, share, clock
        self.paced = self.spent = share * before if before else 0.0
        self.cost = 0.0
        self.total = 0.0  # the records' seconds in this process: the final record's

    def affords(self, expected):
        return (self.paced + self.cost <= self.share * self.elapsed() and
                self.spent + 2 * self.cost <= self.share * expected)

    @contextmanager
    def paid(self, paced=True):
        """Time what the block does as one record's cost: spent (and, paced, counted in the first rule), and
        the next one's expected cost."""
        start = self.clock()
        try:
            yield
        finally:
            self.cost = self.clock() - start
            self.spent += self.cost
            self.paced += self.cost if paced else 0.0
            self.total += self.cost


class Records:
    """A run's records: `due` says whether a step is recorded, `take` records it. Neither changes what trains:
    the model is read in eval mode, and no random generator is drawn from. Off on other ranks than 0, in
    eval_only (which evaluates a saved state whose records its run made already), and with neither --timeline
    nor --snapshots."""

    def __init__(self, cfg, rt, data, state, log, budget, run, say):
        self.cfg, self.state, self.log, self.budget, self.run, self.say = cfg, state, log, budget, run, say
        self.on = rt.master and not cfg.eval_only and budget is not None and (cfg.timeline or cfg.snapshots > 0)
        self.last, self.timeline, self.probe, self.pacing = None, [], None, None
        if not self.on:
            return
        self.pacing = Pacing(budget.spent, RECORD_SHARE, state.seconds_spent)
        self.first_iter, self.first_spent = state.iter_num, budget.spent()
        if cfg.timeline:
            if not has_attention(state.model):
                say("timeline: this model has no attention (a bigram table), so its timeline records the in-context "
                    "learning score and the loss by position, and no head scores")
            self.probe = Probe.of(state.model, data.splits["val"], data.meta["vocab_size"])
            if cfg.snapshots and state.iter_num:
                self.timeline = earlier_timeline(run)  # the snapshots are spread along it

    def due(self, iter_num, evaluated=False, always=False):
        """Whether to record this step (once a step): always (the run's start, its end), or a step the timeline
        calls for (1, 2, 4, ... before the first evaluation; every evaluation) that the run can afford."""
        if not self.on or iter_num == self.last:
            return False
        wanted = always or evaluated or due(iter_num, self.cfg.eval_interval)
        return wanted and (always or self.pacing.affords(self.expected_seconds(iter_num)))

    def end_missing(self, iter_num):
        """Whether a run resumed with its steps all done lacks its end's record: killed (kill -9) after its last
        save and before the record, whose resume goes straight to the final score."""
        if not self.on:
            return False
        if self.cfg.timeline:
            return not any(t.get("iter") == iter_num for t in self.timeline or earlier_timeline(self.run))
        return not self.run.snapshot(iter_num).exists()

    def take(self, iter_num, paced=True):
        """Record the step: the timeline's numbers to metrics.jsonl, and with --snapshots the weights, kept at a
        few steps spread along the timeline. Unpaced (the start's, the end's), it counts toward the whole run's
        share only."""
        self.last = iter_num
        with self.pacing.paid(paced):
            if self.cfg.timeline:
                numbers = self.timeline_numbers()
                heads = numbers.pop("heads")
                numbers = {"iter": iter_num, **numbers, **({"heads": heads} if heads else {})}
                self.log.write({"kind": "timeline", **numbers})
                self.timeline.append(numbers)
            if self.cfg.snapshots:
                along = travelled(self.timeline) if self.timeline else None
                take(self.state, self.run, self.cfg.snapshots, along)

    def timeline_numbers(self):
        """The timeline's numbers for the model as it is now. Where the learner's forward skips a hook point the head
        scores read (an attention written without self.hook_pattern), the run says so once and goes on: its
        records keep the in-context learning score and the loss by position, without head scores."""
        with self.state.scored(), eagerly():
            try:
                return record(self.state.model, self.probe)
            except MissingHookPoint as e:
                if self.probe.repeated is None:
                    raise
                self.say(f"timeline: no head scores in this run's records: {e}")
                self.probe.repeated = None
                return record(self.state.model, self.probe)

    def expected_seconds(self, iter_num):
        """The run's seconds in all, as foretold now: a time budget's by the clock; else the seconds so far, and
        the steps left at the pace of those this process took (its evaluations and records included)."""
        spent = self.budget.spent()
        if self.budget.max_time > 0:
            return max(spent, self.budget.max_time)
        steps = iter_num - self.first_iter
        return spent + (self.cfg.max_iters - iter_num) * (spent - self.first_spent) / steps if steps > 0 else spent

    def seconds(self):
        """What this process's records took, or None where it records nothing."""
        return round(self.pacing.total, 3) if self.pacing is not None else None


def earlier_timeline(run):
    """The timeline records of a resumed run's metrics.jsonl (those past its state are dropped already); none
    where the file cannot be read as records: only the snapshots' spacing reads them."""
    try:
        return timeline_of(read_metrics(run.path))
    except UserError:
        return []
