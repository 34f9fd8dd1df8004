"""Stop signals: a request to stop, seen by a training loop between steps, and at once anywhere else; and the
stop a training process gives itself when the launcher that started it is gone."""

import os
import signal
import threading
import time
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


# the process id of train.py's own launcher (gptkit/machine/runtime.py), in the environment of each process it starts
LAUNCHER_PID = "GPTKIT_LAUNCHER_PID"
WATCH_S = 0.25  # how often a training process looks for its launcher: a stop within a second, at no cost a step sees


def stop_with_launcher(grace_s):
    """In a process that train.py's launcher (or the lab) started, a thread that stops the process when the launcher
    is gone, however it went: killed with SIGKILL, it passes no stop on, and its processes would train on to the
    end, holding the run's lock against the same command started again to continue it. The launcher's going is a
    SIGTERM here (the step finishes, latest.pt saves it, status 143); a process still there grace_s later, stuck
    where no handler runs (waiting on the launcher's rendezvous, say), is killed, as the launcher would have killed
    it. A thread rather than Linux's PR_SET_PDEATHSIG: it works on macOS too, sees a launcher that was gone before
    it started, and can follow the stop with the kill. In any other process, nothing."""
    launcher = int(os.environ.get(LAUNCHER_PID, 0))
    if not launcher:
        return
    parent = os.getppid()  # the launcher, unless it is already gone (or torch put a process between them)

    def watch():
        while os.getppid() == parent and alive(launcher):
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="launcher watch", daemon=True).start()


def alive(pid):
    try:
        os.kill(pid, 0)  # no signal: only whether the process is there
    except (ProcessLookupError, PermissionError):  # gone, or another user's process has its number now
        return False
    return True
