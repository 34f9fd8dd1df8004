"""Stop signals: a request to stop that a training loop sees between steps."""

import signal


class StopSignals:
    """Ctrl-C (SIGINT), a scheduler's stop (SIGTERM) and SLURM's warning before its time limit (SIGUSR1)
    become a request the training loop sees after its step, so the step finishes and is saved; `signum`
    is the first one received (0 for none). A second Ctrl-C stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum = 0

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in self.SIGNALS}
        return self

    def handle(self, signum, frame):
        if signum == signal.SIGINT and self.signum:
            self.__exit__()
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
