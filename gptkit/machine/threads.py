"""CPU threads: for decoding, timed on the model; for training, followed as the run goes (ThreadTuner), since a
busy core stalls every operation of a step on several threads."""

import copy
import statistics
import time

import torch

from gptkit.machine.timing import decode_seconds


CLEARLY = 1.3  # how much faster than one thread more must decode to be taken


def pick_decode_threads(threads, model, device, batch_size=1, tokens=16):
    """CPU threads for decoding, set here: as asked, or for 0 the faster of 1 and torch's default on this
    model, now; and a line saying why. Decoding runs many small operations, each of which waits for all its
    threads: when another process holds a core, every step stalls. So more than one thread must win clearly."""
    if threads:
        torch.set_num_threads(threads)
        return threads, f"decoding on {threads} thread{'s' if threads > 1 else ''}, as asked"
    most = torch.get_num_threads()
    if device != "cpu" or most == 1:
        return most, ""
    torch.set_num_threads(1)
    seconds = {1: decode_seconds(model, batch_size, tokens)}
    torch.set_num_threads(most)
    seconds[most] = decode_seconds(model, batch_size, tokens, to_beat=seconds[1] / CLEARLY)
    best = most if seconds[most] * CLEARLY < seconds[1] else 1
    torch.set_num_threads(best)
    return best, (f"decoding on {best} thread{'s' if best > 1 else ''} ({most} threads were "
                  f"{seconds[1] / seconds[most]:.2f}x as fast as 1 on this model)")


def same_gradients_on(counts, model, x, y, autocast):
    """Whether a forward and backward of (x, y) gives the same gradients, bit for bit, on each of `counts` threads.
    Where it does not (bf16 matmuls of some widths sum in another order on more threads), a run whose thread count
    followed the load would differ from the same command run idle. Taken on a copy of the model with random weights
    (a fresh model's zero-started projections give gradients of exact zeros, which any count sums alike), in eval
    mode (no dropout draws), with the random state and the thread count left as they were. Which sums round apart
    depends on the values, now and then: so trials of weights of two sizes, each on the batch shifted along its
    positions, as many as cost about PROBE_WORK (a small model's many; the count follows the shape alone, so that
    the answer is the same busy or idle)."""
    most = torch.get_num_threads()
    trials = min(PROBE_TRIALS, max(len(PROBE_SPREADS), PROBE_WORK // sum(p.numel() for p in model.parameters())))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            probe = copy.deepcopy(model).eval()
            for trial in range(trials):
                with torch.no_grad():
                    for p in probe.parameters():
                        p.normal_(0.0, PROBE_SPREADS[trial % len(PROBE_SPREADS)])
                batch = [None if t is None else t.roll(trial, -1) for t in (x, y)]
                grads = [gradients_on(n, probe, *batch, autocast) for n in counts]
                if not all(torch.equal(a, b) for other in grads[1:] for a, b in zip(grads[0], other)):
                    return False
    finally:
        torch.set_num_threads(most)
    return True


def gradients_on(threads, model, x, y, autocast):
    torch.set_num_threads(threads)
    model.zero_grad(set_to_none=True)
    with autocast:
        loss = model(x, y)[1]
    loss.backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


PROBE_SPREADS = (0.02, 0.2)  # same_gradients_on's random weights' standard deviations
PROBE_WORK = 2_000_000  # parameters times trials: two of the default's 4 x 128 (about half a second)
PROBE_TRIALS = 32  # at most


TRIALS_SHARE = 0.1  # the most of a run's time its thread trials cost over the current count's steps (ThreadTuner)


class ThreadTuner:
    """CPU threads for training, measured as the run goes: each small op waits for all its threads, so when
    another process holds a core, two threads stall each other at every step while one runs on. `first` seconds
    in (start-up times no threads, so the first trial comes soon), a few steps run on the other thread count, and
    it is kept when its steps are faster by more than `margin`. Trials cost steps, so while they keep the count the
    wait for the next one doubles from `every` (up to `longest` on the most threads, to twice `every` on one, where
    a core freed again would go unseen), and is never shorter than what the last trial cost over `share`; a trial
    whose step runs `hopeless` times the current count's ends at once (beside busy processes a step on more
    threads than cores are free can stall for seconds). A trial comes at once when the current count's steps slow
    down or speed up by more than `drift` from what the last trial measured (another process came or went), but
    never sooner than the last one's cost over `share`: beside two busy processes the steps' time swung by more than
    `drift` every few seconds, and the trials the swings brought cost 12.6% of the stepping time over as many of
    the current count's steps (7.9% with this wait; docs/speed.md#benchpy-fair).
    after_step() returns a line saying so when it changes the count, else None. It starts on `start` threads, the
    count start-up chose (gptkit.machine.choices)."""

    def __init__(self, most, start=None, every=15.0, first=5.0, trial_steps=4, margin=1.1, longest=120.0,
                 drift=1.25, hopeless=2.0, share=TRIALS_SHARE, clock=time.perf_counter):
        self.most, self.current = most, start or most
        self.other = 1 if self.current == most else most
        self.every, self.longest, self.wait = every, longest, every
        self.trial_steps, self.margin, self.drift = trial_steps, margin, drift
        self.hopeless, self.share, self.clock = hopeless, share, clock
        self.recent = []  # the latest steps' seconds on the current count
        self.trial = None  # steps' seconds on the other count, while a trial runs
        self.measured = None  # the current count's median step at the last trial
        self.least_wait = 0.0  # what the last trial cost over `share`: no trial comes sooner
        self.last_trial = clock() - every + first
        torch.set_num_threads(self.current)

    def after_step(self, seconds, iteration):
        if self.trial is None:
            self.recent = (self.recent + [seconds])[-self.trial_steps:]
            since = self.clock() - self.last_trial
            if len(self.recent) == self.trial_steps and since >= self.least_wait and (self.drifted() or
                                                                                     since >= self.wait):
                self.trial = []
                torch.set_num_threads(self.other)
            return None
        self.trial.append(seconds)
        mine = statistics.median(self.recent)
        if len(self.trial) > 1 and seconds > self.hopeless * mine:  # the first after a switch pays for it
            return self.keep(mine)
        if len(self.trial) <= self.trial_steps:
            return None
        theirs = statistics.median(self.trial[1:])
        if mine <= theirs * self.margin:
            return self.keep(mine)
        old, (self.current, self.other) = self.current, (self.other, self.current)
        self.end_trial(theirs, self.every)
        return (f"threads: {self.current} from iteration {iteration} (its steps took {theirs * 1e3:.0f} ms, on "
                f"{old} thread{'s' if old > 1 else ''} {mine * 1e3:.0f} ms)")

    @property
    def trying(self):
        """Whether the steps run on the other thread count now, for a trial (the step just taken, until
        after_step hears of it, was one of them)."""
        return self.trial is not None

    def keep(self, mine):
        """The trial lost: back to the current count, and the next trial waits longer (see the class)."""
        cost = sum(self.trial) - mine * len(self.trial)  # the seconds the trial's steps took over the current's
        longest = self.longest if self.current == self.most else 2 * self.every
        self.end_trial(mine, max(min(2 * self.wait, longest), cost / self.share), cost / self.share)
        return None

    def end_trial(self, measured, wait, least_wait=0.0):
        """The trial is over, won or lost: the steps run on the current count, whose step it measured, and the
        next trial waits `wait` seconds, and even where the steps drift, `least_wait`."""
        self.measured, self.wait, self.least_wait = measured, wait, least_wait
        self.trial, self.recent, self.last_trial = None, [], self.clock()
        torch.set_num_threads(self.current)

    def drifted(self):
        """Every one of the latest steps on the current count is slower or faster by more than `drift` than the
        last trial measured (one slow step is noise): try again now, and soon after."""
        if self.measured is None:
            return False
        slower, faster = min(self.recent) > self.measured * self.drift, max(self.recent) < self.measured / self.drift
        if not (slower or faster):
            return False
        self.wait = self.every
        return True
