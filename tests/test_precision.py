"""gptkit/machine/precision.py: the precision asked for where the device has it, and decoding's, measured on the
model and taken only where bfloat16 wins clearly."""

import time

import pytest
import torch

from conftest import tiny_model
from gptkit.base.errors import UserError
from gptkit.machine import precision
from gptkit.machine import idle as idle_check
from gptkit.machine.precision import pick_dtype


def test_the_precision_asked_for_is_taken_where_the_device_has_it():
    assert pick_dtype("bfloat16", "cpu") == "bfloat16" and pick_dtype("auto", "mps") == "float32"
    assert pick_dtype("auto", "cpu") == "float32"  # a CPU's is chosen at start-up: gptkit/machine/choices.py
    with pytest.raises(UserError, match="float16 is not supported on CPU"):
        pick_dtype("float16", "cpu")


@pytest.fixture(autouse=True)
def own_wisdom(tmp_path, monkeypatch):
    """Each test's decoding precisions are measured into a wisdom cache of its own."""
    monkeypatch.setenv("GPTKIT_WISDOM_DIR", str(tmp_path / "wisdom"))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(idle_check, "LOOK_S", 0.0)


def decoding_speed(monkeypatch, bf16_speedup):
    """A CPU on which bfloat16 decodes bf16_speedup times as fast as float32; the timings taken, counted."""
    timed = []
    monkeypatch.setattr(precision, "decode_seconds", lambda model, batch, tokens: timed.append(1) or {
        torch.float32: 1.0, torch.bfloat16: 1.0 / bf16_speedup}[next(model.parameters()).dtype])
    return timed


@pytest.mark.parametrize("bf16_speedup,want", [(2.0, "bfloat16"), (1.1, "float32"), (0.5, "float32")])
def test_decode_precision_is_measured_and_must_win_clearly(monkeypatch, bf16_speedup, want):
    decoding_speed(monkeypatch, bf16_speedup)
    dtype, why = precision.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == want and why == (f"decoding in {want} (bfloat16 was {bf16_speedup:.2f}x as fast as float32 on this "
                                     "model, measured now)")
    assert precision.pick_decode_dtype("float32", tiny_model(), "cpu")[0] == "float32"


def test_decode_precision_is_kept_for_the_machine_and_read_again_however_fast_a_moment_is(monkeypatch):
    """Measured once for a model: a later start reads it without timing, though the moment's speeds would choose
    otherwise; one measured beside a busy program is read while the machine is busy and measured again idle."""
    decoding_speed(monkeypatch, 2.0)
    assert precision.pick_decode_dtype("auto", tiny_model(), "cpu")[0] == "bfloat16"
    timed = decoding_speed(monkeypatch, 0.5)
    dtype, why = precision.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == "bfloat16" and not timed and why.endswith(f"measured on this CPU on {time.strftime('%Y-%m-%d')})")
    assert precision.pick_decode_dtype("auto", tiny_model(n_layer=1), "cpu")[0] == "float32" and timed

    monkeypatch.setenv("GPTKIT_ASSUME_IDLE", "0")
    busy = {"others": 1.2}
    monkeypatch.setattr(precision.IdleCheck, "__exit__", lambda self, *exc: setattr(self, "others", busy["others"]))
    model = tiny_model(n_layer=3)
    _, why = precision.pick_decode_dtype("auto", model, "cpu")
    assert why.endswith("measured now beside other programs, read again while the machine is busy)")
    timed = decoding_speed(monkeypatch, 2.0)
    assert precision.pick_decode_dtype("auto", model, "cpu")[0] == "float32" and not timed  # still busy: read
    busy["others"] = 0.0
    assert precision.pick_decode_dtype("auto", model, "cpu")[0] == "bfloat16" and timed  # idle: measured again


def test_a_model_py_that_does_not_run_in_bfloat16_decodes_in_float32_and_says_why(monkeypatch):
    """A learner's edit that adds a float32 table to the bfloat16 stream trains under autocast; decoding's
    bfloat16 weights then meet it in a layer norm. Timing bfloat16 fails, and decoding takes float32."""
    import model as model_py

    embed = model_py.GPT.embed
    monkeypatch.setattr(model_py.GPT, "embed", lambda self, idx, first_position=0: (
        (lambda x, rotary: (x + torch.zeros(x.shape[-1]), rotary))(*embed(self, idx, first_position))))
    dtype, why = precision.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == "float32" and why.startswith("decoding in float32 (this model.py does not run in bfloat16: ")
