"""Optimizers (AdamW, or Muon for hidden matrices plus AdamW) and the learning-rate schedule."""

import inspect
import math

import torch


def is_hidden_matrix(name, p):
    """Muon's domain: the weight matrices of the transformer blocks' linear layers, not embeddings, the head,
    or additive attention's score vectors (one per head, stacked: 2-D, but not a map from one space to another)."""
    return p.ndim == 2 and ".h." in f".{name}" and name.endswith(".weight")


def is_embedding(name):
    """Token and learned-position tables (a tied head shares the token table)."""
    return name.startswith(("transformer.wte.", "transformer.wpe."))


def adamw(groups, cfg, device):
    extra = {}
    if device.startswith("cuda") and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        extra["fused"] = True
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), **extra)


def build_optimizers(model, cfg, device):
    """AdamW over everything, or Muon over hidden matrices and AdamW over the rest.

    Embeddings get their own AdamW learning rate (embedding_lr): each step updates only the rows
    of the tokens it saw, so they can move faster than the dense matrices. Weight decay applies
    to matrices and embeddings, never to biases and norm gains."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    muon = [p for n, p in params if cfg.optimizer == "muon" and is_hidden_matrix(n, p)]
    muon_ids = {id(p) for p in muon}
    rest = [(n, p) for n, p in params if id(p) not in muon_ids]
    embeddings = [p for n, p in rest if is_embedding(n)]
    groups = [{"params": embeddings, "weight_decay": cfg.weight_decay, "lr": cfg.embedding_lr or cfg.learning_rate},
              {"params": [p for n, p in rest if p.ndim >= 2 and not is_embedding(n)],
               "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in rest if p.ndim < 2], "weight_decay": 0.0}]
    optimizers = [adamw([g for g in groups if g["params"]], cfg, device)]
    if muon:
        optimizers.append(torch.optim.Muon(muon, lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                                           weight_decay=cfg.muon_weight_decay))
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def lr_multiplier(cfg, iter_num, time_progress=0.0):
    """Fraction of the peak learning rate for this step; never divides by zero.

    Warmup counts optimizer steps. With a time budget (max_time) the decay follows whichever is further
    along, iterations or time (time_progress, the fraction of the training time spent), so a timed run still
    ends cooled down."""
    if not cfg.decay_lr:  # as nanoGPT: a constant learning rate, no warmup either
        return 1.0
    if iter_num < cfg.warmup_iters:
        return (iter_num + 1) / cfg.warmup_iters
    step = iter_num
    if cfg.max_time > 0:
        step = max(step, cfg.max_iters * time_progress)
    floor = cfg.min_lr / cfg.learning_rate if cfg.learning_rate > 0 else 0.0
    if cfg.lr_schedule == "wsd":
        decay_start = cfg.max_iters * (1 - cfg.warmdown_frac)
        if step < decay_start:
            return 1.0
        ratio = min(1.0, (step - decay_start) / max(1e-9, cfg.max_iters - decay_start))
        return 1.0 - ratio * (1.0 - floor)
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if decay_iters <= cfg.warmup_iters:
        return floor if step >= decay_iters else 1.0
    ratio = min(1.0, (step - cfg.warmup_iters) / (decay_iters - cfg.warmup_iters))
    return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - floor)


def set_lr(optimizers, multiplier):
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * multiplier
