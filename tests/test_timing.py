"""The choices a run makes by timing this machine (gptkit/timing.py): the training precision and the attention path,
each timed on the path it would train on, candidates timed in turns; tokens per parameter at the timed step; the
thread count while training; and the precision and thread count for decoding."""

import pytest
import torch

from conftest import tiny_model, train_config
from gptkit import timing
from gptkit.errors import UserError
from gptkit.kernels import attention_path_of
from gptkit.timing import pick_dtype


# ---------------------------------------------------------------------------------------------- training

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
    order.clear()  # where the first turn settles what the timings are for, the other turns are not run
    assert timing.fastest_in_turns({name: lambda name=name: run(name) for name in durations}, 3,
                                   settled=lambda best: best["b"] < best["a"]) == {"a": 9, "b": 5}
    assert order == ["a", "b"] * 2


@pytest.mark.parametrize("bf16_instructions,matmul_speedup,step_speedup,want", [
    (True, 2.0, 2.0, "bfloat16"), (True, 2.0, 1.1, "float32"), (True, 4.0, 0.5, "float32"),
    (True, 0.5, None, "float32"), (False, 2.0, 2.0, "float32")])
def test_training_precision_is_the_faster_step_not_the_flags(monkeypatch, bf16_instructions, matmul_speedup,
                                                             step_speedup, want):
    """'auto' on a CPU times the model's own step in each precision, and bf16 must win clearly; where bf16
    matmuls are slower than fp32 no step is timed, and without bf16 instructions nothing is."""
    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: bf16_instructions)
    monkeypatch.setattr(timing, "bf16_matmul_speedup", lambda: matmul_speedup)
    asked = {}

    def step_seconds_in_turns(model, batch_size, paths, settled):
        asked["settled"] = settled
        return {"float32": 1.0, "bfloat16": 1.0 / step_speedup}

    monkeypatch.setattr(timing, "step_seconds_in_turns", step_seconds_in_turns)
    model = tiny_model(config=train_config().model, vocab_size=20)
    dtype, why, _, seconds = timing.pick_training_dtype("auto", model, 4, "cpu")
    assert dtype == want
    if "settled" in asked:  # one timing of each settles it, unless bf16's speed-up is within 1.3x of the 1.15x margin
        assert asked["settled"]({"float32": 1.0, "bfloat16": 1.0 / step_speedup}) == (step_speedup != 1.1)
    step = 1.0 if want == "float32" else 1.0 / step_speedup  # the chosen precision's step, where one was timed
    assert seconds == (None if not bf16_instructions or step_speedup is None else step)
    if not bf16_instructions:
        assert why is None
    elif step_speedup is None:
        assert why == "precision: float32 (bfloat16 matmuls ran at 0.50x the float32 speed here)"
    else:
        assert why == (f"precision: {want} (a training step, forward and backward, took 1000 ms in float32 and "
                       f"{1000 / step_speedup:.0f} ms in bfloat16 here)")
    fresh = tiny_model(config=train_config().model, vocab_size=20)
    assert timing.pick_training_dtype("float32", fresh, 4, "cpu") == ("float32",) + (None,) * 3
    assert pick_dtype("bfloat16", "cpu") == "bfloat16" and pick_dtype("auto", "mps") == "float32"
    with pytest.raises(UserError, match="float16 is not supported on CPU"):
        pick_dtype("float16", "cpu")


def test_each_precision_is_timed_on_the_attention_path_it_would_train_on(monkeypatch):
    """SDPA's fused kernel can take three times the folded path's time on a CPU: a step timed on a path the run
    will not take misjudges the precision. Each precision's step runs on the path measured fastest in it, or on
    the configured one, and the model's own path is put back; the run then trains on the chosen precision's
    path without measuring the paths again (noise could pick another)."""
    from gptkit.runtime import Runtime
    from gptkit.training import settle_attention_path, settle_precision

    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(timing, "bf16_matmul_speedup", lambda: 2.0)
    fastest, measured = {"float32": "written", "bfloat16": "folded"}, []

    def attention_seconds(attn, shape, autocast, paths):
        measured.extend(paths)
        best = fastest["bfloat16" if isinstance(autocast, torch.autocast) else "float32"]
        return {path: 1e-3 if path == best else 3e-3 for path in paths}

    monkeypatch.setattr(timing, "attention_seconds", attention_seconds)
    timed = []
    monkeypatch.setattr(timing, "step_seconds_in_turns", lambda model, batch_size, paths, settled: timed.append(
        dict(paths)) or {"float32": 1.0, "bfloat16": 0.5})
    model = tiny_model(config=train_config().model, vocab_size=20)
    dtype, _, (path, why), _ = timing.pick_training_dtype("auto", model, 4, "cpu")
    assert timed == [{"float32": "written", "bfloat16": "folded"}]
    assert (dtype, path) == ("bfloat16", "folded") and why.startswith("attention: the folded path (")
    assert [attention_path_of(block.attn) for block in model.transformer.h] == ["fused"] * 2
    timed.clear()
    assert timing.pick_training_dtype("auto", model, 4, "cpu", attention_path="written")[2] == ("written", None)
    assert timed == [{"float32": "written", "bfloat16": "written"}]
    measured.clear()
    rt = Runtime(device="cpu", dtype="float32")
    assert settle_attention_path(train_config(), rt, model, {},
                                 settle_precision(train_config(), rt, model, {})[0]) == "folded"
    assert rt.dtype == "bfloat16" and len(measured) == 6  # three paths in each precision, none after


def test_timing_training_steps_takes_turns_on_each_precisions_path_and_leaves_no_trace():
    """Each precision's step runs on its own attention path, the two taking turns (a machine whose speed moves
    must slow both alike). The probe runs before training: it must leave no gradients, the model's own path, and
    the random generators unmoved, so that a run's data order and dropout masks do not depend on it."""
    model = tiny_model(config=train_config(dropout=0.1).model, vocab_size=20).train()  # dropout draws
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(
        ([attention_path_of(block.attn) for block in module.transformer.h], torch.is_autocast_enabled("cpu"))))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    seconds = timing.step_seconds_in_turns(model, 2, {"float32": "written", "bfloat16": "folded"}, repeats=2)
    assert set(seconds) == {"float32", "bfloat16"} and min(seconds.values()) > 0
    assert calls == [(["written"] * 2, False), (["folded"] * 2, True)] * 3  # one untimed call each, then 2 turns
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())
    assert [attention_path_of(block.attn) for block in model.transformer.h] == ["fused"] * 2


@pytest.mark.parametrize("fastest", ["fused", "written", "folded"])
def test_attention_path_is_the_fastest_one_measured(monkeypatch, fastest):
    monkeypatch.setattr(timing, "attention_seconds", lambda attn, shape, autocast, paths: {
        path: (1.0 if path == fastest else 3.0) / 1e3 for path in paths})
    model = tiny_model(config=train_config().model, vocab_size=20)
    path, why = timing.attention_path_for("auto", model, 4, torch.autocast("cpu", enabled=False), "cpu")
    assert path == fastest and why.startswith(f"attention: the {fastest} path (") and "3.0 ms" in why
    assert timing.attention_path_for("auto", model, 4, None, "cuda") == ("fused", None)  # no probe on a GPU
    assert timing.attention_path_for("written", model, 4, None, "cpu") == ("written", None)  # as set
    uniform = tiny_model(config=train_config(attention="uniform").model, vocab_size=20)
    assert timing.attention_path_for("auto", uniform, 4, None, "cpu") == ("fused", None)  # nothing to choose


def test_tokens_per_parameter_is_the_budget_at_the_timed_step_over_the_parameters(monkeypatch):
    model = tiny_model(config=train_config().model, vocab_size=20)
    timed = []
    monkeypatch.setattr(timing, "training_step_seconds", lambda *args, **kwargs: timed.append(args) or 0.5)
    seen = timing.tokens_per_parameter(model, 4, "float32", 60, processes=2)
    assert timed == [(model, 4, "float32")]
    assert seen == pytest.approx(60 * 2 * 4 * 16 / 0.5 / model.num_params())  # 2 processes of 4 x 16 tokens
    assert timing.tokens_per_parameter(model, 4, "float32", 60, 2, step=0.25) == pytest.approx(2 * seen)
    assert len(timed) == 1  # a step timed already is not timed again


def test_the_thread_count_follows_the_faster_steps():
    """On a busy machine one thread can step faster than two: a trial of the other count wins only when its
    steps (the first after the switch not counted) are faster by more than the margin; a loss changes nothing."""
    from gptkit.timing import ThreadTuner

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
    from gptkit.timing import ThreadTuner

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


# ---------------------------------------------------------------------------------------------- decoding

@pytest.mark.parametrize("bf16_speedup,want", [(2.0, "bfloat16"), (1.1, "float32"), (0.5, "float32")])
def test_decode_precision_is_measured_and_must_win_clearly(monkeypatch, bf16_speedup, want):
    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(timing, "decode_seconds", lambda model, batch, tokens: {
        torch.float32: 1.0, torch.bfloat16: 1.0 / bf16_speedup}[next(model.parameters()).dtype])
    dtype, why = timing.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == want and why == (f"decoding in {want} (bfloat16 was {bf16_speedup:.2f}x as fast as float32 on this "
                                     "model)")
    assert timing.pick_decode_dtype("float32", tiny_model(), "cpu")[0] == "float32"


@pytest.mark.parametrize("two_thread_speedup,want", [(1.8, 2), (1.1, 1), (0.2, 1)])
def test_decode_threads_are_measured_and_more_must_win_clearly(monkeypatch, two_thread_speedup, want):
    """On a busy machine a second thread stalls every step, so it is taken only when a probe shows it
    clearly faster; the count chosen is the one left set."""
    before = torch.get_num_threads()
    monkeypatch.setattr(timing, "decode_seconds", lambda model, batch, tokens: 1.0 / (
        two_thread_speedup if torch.get_num_threads() == 2 else 1.0))
    try:
        torch.set_num_threads(2)
        threads, why = timing.pick_decode_threads(0, tiny_model(), "cpu")
        assert threads == want == torch.get_num_threads()
        assert why.endswith(f" (2 threads were {two_thread_speedup:.2f}x as fast as 1 on this model)")
        assert timing.pick_decode_threads(3, tiny_model(), "cpu")[0] == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
