"""AdamW and Muon as torch.optim has them (their settings, state and checkpoints), each in fewer, larger kernels:
what model.py's configure_optimizers builds. torch.optim's own work as well (a learner's SGD trains): these start
faster and step faster on a CPU (docs/speed.md#what-was-tried)."""

import collections
import math

import torch


class Optimizer:
    """What this project uses of torch.optim.Optimizer, without it: building a torch.optim optimizer the first
    time imports torch's compiler, which delays every run's first step (docs/speed.md#what-was-tried). Parameter
    groups over defaults, state per parameter, and state dicts in torch's format, so that either loads the other's."""

    def __init__(self, params, defaults):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.defaults = defaults
        self.param_groups = [{**defaults, **group, "params": list(group["params"])} for group in groups]
        self.state = collections.defaultdict(dict)

    def zero_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def state_dict(self):
        index = {}
        groups = [{**{k: v for k, v in group.items() if k != "params"},
                   "params": [index.setdefault(id(p), len(index)) for p in group["params"]]}
                  for group in self.param_groups]
        return {"state": {index[id(p)]: state for p, state in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """As torch loads one: ValueError unless the groups and their sizes match; each state tensor copied to its
        parameter's device, the floating ones but the step count in its dtype; the saved groups' settings."""
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the saved parameter groups differ from this optimizer's")
        params = {i: p for old, group in zip(saved, self.param_groups) for i, p in zip(old["params"], group["params"])}
        self.state = collections.defaultdict(dict)
        for i, state in state_dict["state"].items():
            p = params[i]
            self.state[p] = {k: v.to(p.device, p.dtype if v.is_floating_point() and k != "step" else v.dtype,
                                     copy=True) if torch.is_tensor(v) else v for k, v in state.items()}
        for old, group in zip(saved, self.param_groups):
            group.update({k: v for k, v in old.items() if k != "params"})


class AdamW(Optimizer):
    """torch's AdamW (its defaults, state and results) in one fused kernel on every device: torch's own default on
    a CPU loops over the parameters, a slower step for a model of many small tensors."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p] = {"step": torch.zeros((), device=p.device), "exp_avg": torch.zeros_like(p),
                                     "exp_avg_sq": torch.zeros_like(p)}
            states = [self.state[p] for p in params]
            steps = [state["step"] for state in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adamw_(params, [p.grad for p in params], [state["exp_avg"] for state in states],
                                [state["exp_avg_sq"] for state in states], [], steps, amsgrad=False, lr=group["lr"],
                                beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                maximize=False)


def orthogonalize(updates, coefficients, steps, eps, dtype):
    """Muon's Newton-Schulz iterations on a stack of same-shaped matrices at once, in dtype: each comes out
    near the nearest semi-orthogonal matrix (torch's Muon does one matrix at a time, always in bfloat16)."""
    x = updates.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    a, b, c = coefficients
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class Muon(Optimizer):
    """torch's Muon (its settings, state and checkpoints), with the Newton-Schulz iterations run in the
    precision the run trains in and over every same-shaped matrix together: in bfloat16 they run slower than in
    float32 on CPUs without fast bf16, and one matrix at a time they are many small multiplies
    (docs/speed.md#what-was-tried)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5, ns_dtype=torch.bfloat16):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                                  "ns_coefficients": ns_coefficients, "eps": eps, "ns_steps": ns_steps,
                                  "adjust_lr_fn": None})
        if any(p.ndim != 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("Muon orthogonalizes matrices: every parameter must be 2-D")
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            if group["adjust_lr_fn"] not in (None, "original"):  # a torch Muon's checkpoint may ask for another
                raise ValueError("this Muon scales the learning rate as torch's 'original' does, and only so")
            shapes = collections.defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - group["momentum"])
                shapes[p.shape].append((p, p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf))
            for shape, pairs in shapes.items():
                updates = orthogonalize(torch.stack([u for _, u in pairs]), group["ns_coefficients"],
                                        group["ns_steps"], group["eps"], self.ns_dtype)
                lr = group["lr"] * math.sqrt(max(1, shape[0] / shape[1]))
                for (p, _), update in zip(pairs, updates):
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(update, alpha=-lr)
