"""The precision a model computes in: what the device offers (a CPU's bf16 instructions), the rule a run starts
from, autocast, and decoding's precision, timed on the model. The one owner of these decisions; a training
run's measured choice is gptkit/machine/choices.py's."""

import contextlib
import copy
import sys

import torch

from gptkit.base.errors import UserError, first_line
from gptkit.machine.idle import IdleCheck, idle_now
from gptkit.machine.timing import decode_seconds
from gptkit.machine.wisdom import Wisdom, decode_key, decode_problem, today

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# torch's threads as the process starts, before a tool picks decoding's: the wisdom's machine, whatever that pick
STARTING_THREADS = torch.get_num_threads()


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
    few tokens of this model once and kept in the machine's wisdom, as a training run's choices are (one taken
    beside a busy program is read while the machine is busy, and measured again at an idle start); and a line
    saying why. bfloat16 must win clearly, so the choice does not flip with a machine's noise and one seed keeps
    giving one text."""
    if name != "auto":
        return pick_dtype(name, device), f"decoding in {name}"
    if device.startswith("cuda"):
        return ("bfloat16" if torch.cuda.is_bf16_supported() else "float16"), "decoding in half precision on CUDA"
    if device != "cpu" or not cpu_has_bf16():
        return "float32", "decoding in float32"
    wisdom, key = Wisdom(device, STARTING_THREADS), decode_key(model.config, batch_size)
    kept = wisdom.entry(key, decode_problem)
    if kept and not ("busy" in kept and idle_now()):
        when = f"measured on this CPU on {kept['measured']}" + " beside other programs" * ("busy" in kept)
    else:
        with IdleCheck() as check:
            kept = decode_speedup(model, batch_size, tokens)
        if isinstance(kept, str):  # why bfloat16 cannot decode this model
            return "float32", f"decoding in float32 (this model.py does not run in bfloat16: {kept})"
        kept |= {"measured": today(), **({} if check.idle else {"busy": round(check.others, 2)})}
        wisdom.keep(key, kept)
        when = "measured now" + ("" if check.idle else " beside other programs, read again while the machine is busy")
    return kept["dtype"], "\n".join(wisdom.notes + [
        f"decoding in {kept['dtype']} (bfloat16 was {kept['speedup']:.2f}x as fast as float32 on this model, {when})"])


def decode_speedup(model, batch_size, tokens):
    """{dtype: the faster, speedup: bfloat16's over float32} decoding a few tokens of copies of model, or why
    bfloat16 cannot run it."""
    seconds = {"float32": decode_seconds(copy.deepcopy(model), batch_size, tokens)}
    try:
        seconds["bfloat16"] = decode_seconds(copy.deepcopy(model).to(torch.bfloat16), batch_size, tokens)
    except RuntimeError as e:  # an edited model.py that makes float32 tensors of its own, e.g. a position table
        return first_line(e)
    speedup = seconds["float32"] / seconds["bfloat16"]
    return {"dtype": "bfloat16" if speedup > 1.25 else "float32", "speedup": round(speedup, 4)}


def fast_dtype(device):
    """'bfloat16' where the device has fast bf16 matmuls (a CUDA GPU that has them, a CPU with AVX-512 BF16 or AMX),
    else 'float32': the precision analyze.py's ablation deltas take unless told (matmuls under autocast)."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if device == "cpu" and cpu_has_bf16() else "float32"
