"""The peak FLOP/s a GPU's datasheet promises, against which model FLOPs utilisation (MFU) is reckoned; the
FLOPs a model's token costs are model.py's (GPT.flops_per_token)."""

import torch


# dense bf16/fp16 tensor-core peaks from the vendors' datasheets; the first key found in the name wins
GPU_PEAKS = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
             "A10": 125e12, "4090": 165e12}


def peak_flops(device, dtype):
    """The device's dense peak FLOP/s for dtype, or None where it is not known (every CPU: their peak is
    measured instead, by timing.matmul_peak)."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in GPU_PEAKS.items():
        if key in name:
            return flops if dtype != "float32" else flops / 2  # TF32 runs at half the bf16 rate
    return None
