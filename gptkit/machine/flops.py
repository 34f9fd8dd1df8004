"""FLOP accounting for model FLOPs utilisation (MFU): the training FLOPs a model's token costs, and the
peak a GPU's datasheet promises."""

import torch


def flops_per_token(model, seq_len):
    """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B): 2 FLOPs forward and 4
    backward per multiply-add, over seq_len keys for each of n_embd channels. Dot-product attention has two
    such products (scores and values), uniform only the values, and additive about three (the sum and tanh
    of q+k, the product with v, the values)."""
    cfg = model.config
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("transformer.w"))
    n += model.lm_head.weight.numel() if cfg.tie_weights else 0
    products = {"scaled": 2, "dot": 2, "uniform": 1, "additive": 3}[cfg.attention]
    return 6 * n + 6 * products * cfg.n_layer * cfg.n_embd * seq_len


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
