"""The precision a model computes in: what the device offers (a CPU's bf16 instructions), the rule a run starts
from, autocast, and decoding's precision, timed on the model. The one owner of these decisions; a training
run's measured choice is gptkit/machine/choices.py's."""

import contextlib
import copy
import sys

import torch

from gptkit.base.errors import UserError, first_line
from gptkit.machine.timing import decode_seconds

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_bf16():
    """AVX-512 BF16 or AMX in the CPU flags: bf16 matmul instructions exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_dtype(name, device):
    """The training precision: as asked, or for 'auto' bf16 on a GPU that has it, else fp32 (on a CPU with bf16
    instructions, training then times its own step in each: pick_training_dtype)."""
    if name != "auto":
        if name == "float16" and device == "cpu":
            raise UserError("dtype float16 is not supported on CPU; use bfloat16 or float32")
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def autocast_for(dtype, device_type="cpu"):
    """Mixed precision: weights stay fp32, matmuls run in dtype."""
    return contextlib.nullcontext() if dtype == "float32" else torch.autocast(device_type, getattr(torch, dtype))


def pick_decode_dtype(name, model, device, batch_size=1, tokens=16):
    """The weights' precision for decoding: as asked, or for 'auto' the faster of float32 and bfloat16 on
    this machine (bfloat16 reads half the bytes per token, but some CPUs compute it slowly), timed on a
    few tokens of this model; and a line saying why. bfloat16 must win clearly, so the choice does not flip
    with a machine's noise and one seed keeps giving one text."""
    if name != "auto":
        return pick_dtype(name, device), f"decoding in {name}"
    if device.startswith("cuda"):
        return ("bfloat16" if torch.cuda.is_bf16_supported() else "float16"), "decoding in half precision on CUDA"
    if device != "cpu" or not cpu_has_bf16():
        return "float32", "decoding in float32"
    seconds = {"float32": decode_seconds(copy.deepcopy(model), batch_size, tokens)}
    try:
        seconds["bfloat16"] = decode_seconds(copy.deepcopy(model).to(torch.bfloat16), batch_size, tokens)
    except RuntimeError as e:  # an edited model.py that makes float32 tensors of its own, e.g. a position table
        return "float32", f"decoding in float32 (this model.py does not run in bfloat16: {first_line(e)})"
    best = "bfloat16" if seconds["bfloat16"] * 1.25 < seconds["float32"] else "float32"
    return best, (f"decoding in {best} (bfloat16 was {seconds['float32'] / seconds['bfloat16']:.2f}x as fast as "
                  "float32 on this model)")


def fast_dtype(device):
    """'bfloat16' where the device has fast bf16 matmuls (a CUDA GPU that has them, a CPU with AVX-512 BF16 or AMX),
    else 'float32': the precision analyze.py's ablation deltas take unless told (matmuls under autocast)."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if device == "cpu" and cpu_has_bf16() else "float32"
