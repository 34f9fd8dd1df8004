"""gptkit/machine/threads.py: the thread count a training run follows as it goes, and decoding's, measured on the
model and taken only where more threads win clearly; and kept where the model's gradients differ between counts."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_model
from gptkit.machine import threads as thread_counts
from gptkit.machine.threads import ThreadTuner, same_gradients_on


def test_the_thread_count_follows_the_faster_steps():
    """On a busy machine one thread can step faster than two: a trial of the other count wins only when its
    steps (the first after the switch not counted) are faster by more than the margin; a loss changes nothing."""
    from gptkit.machine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, every=0.0, first=0.0, trial_steps=4)
        assert [tuner.after_step(0.100, i) for i in range(4)] == [None] * 4 and torch.get_num_threads() == 1
        lines = [tuner.after_step(s, 4 + i) for i, s in enumerate([0.5, 0.03, 0.03, 0.03, 0.03])]
        assert lines[:4] == [None] * 4 and lines[4] == "threads: 1 from iteration 8 (its steps took 30 ms, on 2 " \
                                                          "threads 100 ms)"
        assert torch.get_num_threads() == 1
        for i, s in enumerate([0.03] * 4 + [0.5] + [0.03] * 4):  # two threads as fast: not worth switching back
            assert tuner.after_step(s, 9 + i) is None
        assert torch.get_num_threads() == 1 and tuner.current == 1
    finally:
        torch.set_num_threads(before)


def test_thread_trials_back_off_while_they_keep_the_count_and_come_at_once_when_steps_drift():
    """Each trial costs steps: on an idle machine they must grow rare (up to `longest` apart on the most threads,
    twice `every` on one), yet a process arriving (the steps slowing by more than `drift`) must be tried at once."""
    from gptkit.machine.threads import ThreadTuner

    now, before = [0.0], torch.get_num_threads()

    def steps(tuner, seconds, count, advance=0.0):
        lines = []
        for _ in range(count):
            now[0] += advance
            lines.append(tuner.after_step(seconds, 0))
        return [line for line in lines if line]

    try:
        tuner = ThreadTuner(2, every=10.0, first=0.0, trial_steps=4, longest=40.0, drift=1.25, clock=lambda: now[0])
        assert steps(tuner, 0.1, 4) == [] and torch.get_num_threads() == 1  # the first trial, at once
        assert steps(tuner, 0.2, 5) == [] and torch.get_num_threads() == 2  # kept: next wait 20 s
        assert steps(tuner, 0.1, 15, advance=1.0) == [] and torch.get_num_threads() == 2  # 15 s: none yet
        steps(tuner, 0.1, 6, advance=1.0)
        assert torch.get_num_threads() == 1  # 21 s after the last: tried
        assert steps(tuner, 0.2, 5) == [] and tuner.wait == 40.0
        steps(tuner, 0.1, 1000, advance=0.03)  # 30 s of steady steps: no trial before the 40 s wait
        assert torch.get_num_threads() == 2 and tuner.trial is None
        assert steps(tuner, 0.3, 3) == [] and torch.get_num_threads() == 2  # three slow steps may be noise
        assert steps(tuner, 0.3, 1) == [] and torch.get_num_threads() == 1  # four: tried at once
        assert steps(tuner, 0.15, 5) == ["threads: 1 from iteration 0 (its steps took 150 ms, on 2 threads 300 ms)"]
        assert tuner.wait == 10.0
        for _ in range(3):  # on one thread the wait stops at twice `every`: a core freed again is found soon
            steps(tuner, 0.15, 4, advance=10.0)
            steps(tuner, 0.3, 5)
        assert tuner.current == 1 and tuner.wait == 20.0
    finally:
        torch.set_num_threads(before)


def test_a_hopeless_trial_ends_at_once_and_the_next_waits_for_what_it_cost():
    """Beside two busy processes on two cores a trial of two threads stalled each step for seconds: it ends at its
    first counted step that runs `hopeless` times the current count's, and the next trial waits at least what it
    cost over `share`, even where the steps drift, so that trials take at most that share of the run."""
    from gptkit.machine.threads import ThreadTuner

    now, before = [0.0], torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, start=1, every=10.0, first=0.0, trial_steps=4, share=0.1, clock=lambda: now[0])
        assert [tuner.after_step(0.2, i) for i in range(4)] == [None] * 4 and torch.get_num_threads() == 2
        assert tuner.trying  # the next steps are the trial's
        assert tuner.after_step(4.0, 4) is None and torch.get_num_threads() == 2  # the switch's step: not counted
        assert tuner.after_step(4.0, 5) is None and torch.get_num_threads() == 1 and not tuner.trying
        assert tuner.current == 1 and tuner.wait == pytest.approx(76.0)  # 2 x (4.0 - 0.2) s over one thread, / 0.1
        now[0] = 75.0  # the steps drift (twice the 0.2 s measured): still no trial before 76 s
        assert [tuner.after_step(0.4, i) for i in range(6, 14)] == [None] * 8 and not tuner.trying
        now[0] = 76.0
        assert tuner.after_step(0.4, 14) is None and tuner.trying
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("two_thread_speedup,want", [(1.8, 2), (1.1, 1), (0.2, 1)])
def test_decode_threads_are_measured_and_more_must_win_clearly(monkeypatch, two_thread_speedup, want):
    """On a busy machine a second thread stalls every step, so it is taken only when a probe shows it
    clearly faster; the count chosen is the one left set."""
    before = torch.get_num_threads()
    monkeypatch.setattr(thread_counts, "decode_seconds", lambda model, batch, tokens, to_beat=0: 1.0 / (
        two_thread_speedup if torch.get_num_threads() == 2 else 1.0))
    try:
        torch.set_num_threads(2)
        threads, why = thread_counts.pick_decode_threads(0, tiny_model(), "cpu")
        assert threads == want == torch.get_num_threads()
        assert why.endswith(f" (2 threads were {two_thread_speedup:.2f}x as fast as 1 on this model)")
        assert thread_counts.pick_decode_threads(3, tiny_model(), "cpu")[0] == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


class ThreadsInTheLastBits(torch.nn.Module):
    """A model whose loss, and so its gradient, moves in the last bits with the thread count when `moves`, as a bf16
    matmul of some widths does; its forward draws dropout's random numbers in training mode."""

    def __init__(self, moves):
        super().__init__()
        self.w, self.moves = torch.nn.Parameter(torch.ones(3)), moves

    def forward(self, x, y):
        w = torch.nn.functional.dropout(self.w, 0.5, self.training)
        return None, (w * x).sum() * (1 + 1e-6 * torch.get_num_threads() * self.moves)


@pytest.mark.parametrize("moves", [False, True])
def test_gradients_are_compared_on_each_count_leaving_the_run_as_it_was(moves):
    model, x = ThreadsInTheLastBits(moves).train(), torch.arange(3.0)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    assert same_gradients_on((1, 2), model, x, None, contextlib.nullcontext()) is not moves
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    assert model.training and model.w.grad is None


class ThreadsOnSomeTokens(ThreadsInTheLastBits):
    """As ThreadsInTheLastBits moving, but only on a batch whose first token is 2: as a bf16 matmul's sums round
    apart on some values only."""

    def forward(self, x, y):
        return None, (self.w * x).sum() * (1 + 1e-6 * torch.get_num_threads() * bool(x[0] == 2))


def test_the_gradients_are_compared_on_the_batch_shifted_as_many_times_as_a_small_model_affords():
    """A small model's sums that round apart on some batches only are found on the batch shifted along its
    positions ([0, 1, 2] then [2, 0, 1]); the trials' count follows the model's size alone."""
    assert not same_gradients_on((1, 2), ThreadsOnSomeTokens(True), torch.arange(3.0), None,
                                 contextlib.nullcontext())
    calls = []
    model = ThreadsInTheLastBits(False)
    model.register_forward_hook(lambda *args: calls.append(1))
    assert same_gradients_on((1, 2), model, torch.arange(3.0), None, contextlib.nullcontext())
    assert len(calls) == 2 * thread_counts.PROBE_TRIALS


def test_a_model_whose_gradients_follow_the_threads_keeps_its_count_with_one_line():
    from gptkit.training.budget import thread_tuner

    said = []
    for moves, tuned in [(False, True), (True, False)]:
        state = SimpleNamespace(model=ThreadsInTheLastBits(moves), choices=SimpleNamespace(threads=2, most_threads=2))
        tuner = thread_tuner(state, torch.arange(3.0), None, contextlib.nullcontext(), said.append)
        assert isinstance(tuner, ThreadTuner) is tuned
    assert said == ["threads: 2 for the whole run, busy or idle: this model's gradients differ between 1 and 2 "
                    "threads in the last bits, so following the load would make two runs of one command differ "
                    "(--threads=N sets the count)"]
