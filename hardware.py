"""Pick the device and numeric precision, and know the device's peak speed for MFU."""

import functools
import sys
import time
from contextlib import nullcontext

import torch

from errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name):
    """'auto' means cuda, then mps, then cpu; an explicit choice must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but this torch build sees no CUDA GPU; use --device=cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("device 'mps' asked for, but MPS is not available here; use --device=cpu")
    return name


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


def matmul_seconds(dtype, size=768, repeats=3):
    a = torch.randn(size, size).to(dtype)
    a @ a  # the first call pays for kernel selection
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return time.perf_counter() - start


@functools.cache
def cpu_bf16_pays():
    """Whether bf16 matmuls actually beat fp32 here: some CPUs that list the bf16 instructions
    run them slower than fp32 (measured 160 vs 290 GFLOP/s on one 2-core Xeon VM), so ask the
    hardware with a probe of a few tens of milliseconds."""
    return cpu_has_bf16() and matmul_seconds(torch.bfloat16) * 1.2 < matmul_seconds(torch.float32)


def pick_dtype(name, device):
    if name != "auto":
        if name == "float16" and device == "cpu":
            raise UserError("dtype float16 is not supported for training on CPU; use bfloat16 or float32")
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device == "cpu" and cpu_bf16_pays():
        return "bfloat16"
    return "float32"


def autocast(device, dtype):
    """Mixed precision: weights stay fp32, matmuls run in dtype."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=DTYPES[dtype])


def peak_flops(device, dtype):
    """The device's dense peak FLOP/s for dtype, or None where it is not known."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    # dense bf16/fp16 tensor-core peaks from the vendors' datasheets; the first key found in the name wins
    table = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
             "A10": 125e12, "4090": 165e12}
    for key, flops in table.items():
        if key in name:
            return flops if dtype != "float32" else flops / 2  # TF32 runs at half the bf16 rate
    return None
