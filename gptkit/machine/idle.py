"""Whether this process had the machine to itself while it measured: a measurement taken while another program held a
core is slower than the machine is, and kept, it would plan every later run from the wrong speed.

The check reads the CPU time the whole machine spent between two moments (Linux's /proc/stat, steal included: a
shared virtual machine's neighbours count as other programs too) and takes away this process's own (os.times, every
thread of it); what is left, over the wall time between, is the cores other programs held. A browser at rest or an
editor holds a few hundredths of a core; a program computing holds a whole one. Where /proc/stat is missing (macOS),
it cannot tell, and takes the measurement as idle. GPTKIT_ASSUME_IDLE=1 takes every measurement as idle: for the
tests, whose two workers keep both cores busy."""

import os
import time

BUSY_CORES = 0.3  # other programs holding this much of a core on average: the measurement was not taken idle
LOOK_S = 0.25  # how long idle_now watches the machine (before a start reads a measurement taken busy)


def machine_cpu_seconds():
    """Seconds of CPU time every core of the machine has spent working since boot, or None where it cannot say."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    working = sum(ticks) - ticks[3] - ticks[4]
    return working / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds():
    t = os.times()
    return t.user + t.system


class IdleCheck:
    """`with IdleCheck() as check: ...measure...`, then check.others: the cores other programs held meanwhile, on
    average (0.0 where it cannot tell), and check.idle."""

    def __enter__(self):
        self.start = (time.perf_counter(), machine_cpu_seconds(), own_cpu_seconds())
        self.others = 0.0
        return self

    def __exit__(self, *exc):
        wall, machine, own = time.perf_counter(), machine_cpu_seconds(), own_cpu_seconds()
        wall0, machine0, own0 = self.start
        if machine is not None and machine0 is not None and wall > wall0:
            self.others = max(0.0, (machine - machine0) - (own - own0)) / (wall - wall0)
        return False

    @property
    def idle(self):
        return self.others < BUSY_CORES or os.environ.get("GPTKIT_ASSUME_IDLE") == "1"


def idle_now():
    """Whether other programs leave this machine idle now: its CPU time watched while this process sleeps."""
    with IdleCheck() as check:
        time.sleep(LOOK_S)
    return check.idle
