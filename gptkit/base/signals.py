"""Stop signals: a request to stop, seen by a training loop between steps, and at once anywhere else."""

import signal
from contextlib import contextmanager

from gptkit.base.errors import RunStopped


class StopSignals:
    """Ctrl-C (SIGINT), a scheduler's stop (SIGTERM) and SLURM's warning before its time limit (SIGUSR1).
    Inside `deferred()` (the training loop) a signal becomes a request the loop sees after its step, so the
    step finishes and is saved; `signum` is the first one received (0 for none). Anywhere else (start-up, the
    first evaluation, the final score, eval_only) it stops the run at once with RunStopped, whose message says
    what `doing` was interrupted. A second Ctrl-C stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum, self.deferring, self.doing = 0, False, "starting"

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in self.SIGNALS}
        return self

    def handle(self, signum, frame):
        if signum == signal.SIGINT and self.signum:
            self.__exit__()
            raise KeyboardInterrupt
        self.signum = self.signum or signum
        if not self.deferring:
            raise RunStopped(f"stopped by {signal.Signals(signum).name} while {self.doing}", signum)

    @contextmanager
    def deferred(self):
        self.deferring = True
        try:
            yield self
        finally:
            self.deferring = False

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
