"""gptkit/machine/precision.py: the precision asked for where the device has it, and decoding's, measured on the
model and taken only where bfloat16 wins clearly."""

import pytest
import torch

from conftest import tiny_model
from gptkit.base.errors import UserError
from gptkit.machine import precision
from gptkit.machine.precision import pick_dtype


def test_the_precision_asked_for_is_taken_where_the_device_has_it():
    assert pick_dtype("bfloat16", "cpu") == "bfloat16" and pick_dtype("auto", "mps") == "float32"
    assert pick_dtype("auto", "cpu") == "float32"  # a CPU's is chosen at start-up: gptkit/machine/choices.py
    with pytest.raises(UserError, match="float16 is not supported on CPU"):
        pick_dtype("float16", "cpu")


@pytest.mark.parametrize("bf16_speedup,want", [(2.0, "bfloat16"), (1.1, "float32"), (0.5, "float32")])
def test_decode_precision_is_measured_and_must_win_clearly(monkeypatch, bf16_speedup, want):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(precision, "decode_seconds", lambda model, batch, tokens: {
        torch.float32: 1.0, torch.bfloat16: 1.0 / bf16_speedup}[next(model.parameters()).dtype])
    dtype, why = precision.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == want and why == (f"decoding in {want} (bfloat16 was {bf16_speedup:.2f}x as fast as float32 on this "
                                     "model)")
    assert precision.pick_decode_dtype("float32", tiny_model(), "cpu")[0] == "float32"


def test_a_model_py_that_does_not_run_in_bfloat16_decodes_in_float32_and_says_why(monkeypatch):
    """A learner's edit that adds a float32 table to the bfloat16 stream trains under autocast; decoding's
    bfloat16 weights then meet it in a layer norm. Timing bfloat16 fails, and decoding takes float32."""
    import model as model_py

    embed = model_py.GPT.embed
    monkeypatch.setattr(model_py.GPT, "embed", lambda self, idx, first_position=0: (
        (lambda x, rotary: (x + torch.zeros(x.shape[-1]), rotary))(*embed(self, idx, first_position))))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    dtype, why = precision.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == "float32" and why.startswith("decoding in float32 (this model.py does not run in bfloat16: ")
