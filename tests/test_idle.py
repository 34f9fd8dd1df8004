"""gptkit/machine/idle.py: whether a measurement had the machine's cores to itself."""

import subprocess
import sys
import time

import pytest

from gptkit.machine import idle
from gptkit.machine.idle import IdleCheck


def test_the_cores_others_held_are_the_machines_cpu_time_less_this_processs_over_the_wall_time(monkeypatch):
    monkeypatch.delenv("GPTKIT_ASSUME_IDLE", raising=False)
    clock = iter([100.0, 102.0])
    machine, own = iter([50.0, 53.5]), iter([10.0, 12.0])  # 3.5 s of work, 2 of them this process's
    monkeypatch.setattr(idle.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(idle, "machine_cpu_seconds", lambda: next(machine))
    monkeypatch.setattr(idle, "own_cpu_seconds", lambda: next(own))
    with IdleCheck() as check:
        pass
    assert check.others == pytest.approx(0.75) and not check.idle


def test_where_the_machine_cannot_say_the_measurement_is_taken_as_idle(monkeypatch):
    monkeypatch.delenv("GPTKIT_ASSUME_IDLE", raising=False)
    monkeypatch.setattr(idle, "machine_cpu_seconds", lambda: None)
    with IdleCheck() as check:
        time.sleep(0.01)
    assert check.others == 0.0 and check.idle


@pytest.mark.skipif(idle.machine_cpu_seconds() is None, reason="no /proc/stat")
def test_a_busy_process_beside_a_measurement_is_seen(monkeypatch):
    monkeypatch.delenv("GPTKIT_ASSUME_IDLE", raising=False)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with IdleCheck() as check:
            time.sleep(1.0)
    finally:
        busy.kill()
    assert check.others > 0.6 and not check.idle
    monkeypatch.setenv("GPTKIT_ASSUME_IDLE", "1")
    assert check.idle  # the tests' own setting
