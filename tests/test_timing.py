"""gptkit/machine/timing.py: candidates timed in turns, each keeping its fastest turn, within a deadline. (A run's
start-up choices: test_choices.py; the precision: test_precision.py; threads: test_threads.py.)"""

import time

from gptkit.machine import timing


def test_probes_time_their_candidates_in_turns_and_keep_each_ones_fastest(monkeypatch):
    """A machine whose speed moves while a probe runs must slow each candidate alike, not the ones timed last;
    the untimed first call of each (kernel selection) never counts."""
    clock, order = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    durations = {"a": [0.1, 9, 7, 8], "b": [0.1, 5, 6, 3]}

    def run(name):
        order.append(name)
        clock[0] += durations[name][order.count(name) - 1]

    assert timing.fastest_in_turns({name: lambda name=name: run(name) for name in durations}, 3) == {"a": 7, "b": 3}
    assert order == ["a", "b"] * 4
    order.clear()  # where two turns settle what the timings are for, the others are not run; one never does,
    # since a spike in it could seem to
    assert timing.fastest_in_turns({name: lambda name=name: run(name) for name in durations}, 3,
                                   settled=lambda best: best["b"] < best["a"]) == {"a": 7, "b": 5}
    assert order == ["a", "b"] * 3


def test_past_a_deadline_no_turn_begins_after_the_first_timed_one(monkeypatch):
    """A first measurement within a run's budget: however many turns were asked, none begins past the deadline, and
    each candidate still has one timed turn."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def run():
        clock[0] += 1.0

    seconds = timing.fastest_in_turns({"a": run, "b": run}, 5, deadline=3.0)
    assert seconds == {"a": 1.0, "b": 1.0} and clock[0] == 4.0  # one untimed call each, then one turn
    clock[0] = 0.0
    assert timing.fastest_in_turns({"a": run}, 5, deadline=time.perf_counter() + 1e9) == {"a": 1.0}


def test_a_decode_timing_that_has_lost_already_is_not_repeated(monkeypatch):
    """Beside busy programs a timing on too many threads stalls for many times the work it times: once one took
    longer than the count to beat, the count has lost, and no more are taken."""
    from conftest import tiny_model
    from gptkit.machine import timing

    timed = []
    monkeypatch.setattr(timing, "seconds_of", lambda run, device: timed.append(run) or 5.0)
    assert timing.decode_seconds(tiny_model(), 2, 3, repeats=3, to_beat=1.0) == 5.0 and len(timed) == 1
    assert timing.decode_seconds(tiny_model(), 2, 3, repeats=3) == 5.0 and len(timed) == 4
