"""Optimizers (AdamW, or Muon for hidden matrices plus AdamW), the learning-rate schedule, and the EMA of
the weights that evaluations score."""

import collections
import math
from contextlib import contextmanager

import torch


def is_hidden_matrix(name, p):
    """Muon's domain: the weight matrices of the transformer blocks' linear layers, not embeddings, the head,
    or additive attention's score vectors (one per head, stacked: 2-D, but not a map from one space to another)."""
    return p.ndim == 2 and ".h." in f".{name}" and name.endswith(".weight")


def is_embedding(name):
    """Token and learned-position tables (a tied head shares the token table)."""
    return name.startswith(("transformer.wte.", "transformer.wpe."))


class Optimizer:
    """What this project uses of torch.optim.Optimizer, without it: building a torch.optim optimizer the first
    time imports torch's compiler, which delays every run's first step (docs/speed.md#what-was-tried). Parameter
    groups over defaults, state per parameter, and state dicts in torch's format, so that either loads the other's."""

    def __init__(self, params, defaults):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
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


def build_optimizers(model, cfg, dtype="float32"):
    """AdamW over everything, or Muon over hidden matrices and AdamW over the rest; Muon orthogonalizes in
    bfloat16 when the run trains in it, else in float32.

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
    optimizers = [AdamW([g for g in groups if g["params"]], lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))]
    if muon:
        optimizers.append(Muon(muon, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay,
                               ns_dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32))
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def update_for(cfg):
    """For timing a whole step before a run starts: a function of (model, dtype) returning one that takes an
    optimizer step of that model, and of its weights' average, after a backward."""
    def update_of(model, dtype):
        optimizers = build_optimizers(model, cfg, dtype)
        ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        scaler = torch.amp.GradScaler(next(model.parameters()).device.type, enabled=False)

        def update():
            step_optimizers(model, optimizers, scaler, cfg.grad_clip)
            if ema is not None:
                ema.update(1.0)

        return update

    return update_of


def lr_factor_at(cfg, iter_num, time_progress=0.0):
    """Fraction of the peak learning rate for this step; never divides by zero.

    Warmup counts optimizer steps. With a budget by the clock (wall_clock) the decay follows whichever is further
    along, iterations or time (time_progress, the fraction of the training time spent), so a timed run still
    ends cooled down; a budget planned in steps has its max_iters, and follows them."""
    if not cfg.decay_lr:  # as nanoGPT: a constant learning rate, no warmup either
        return 1.0
    if iter_num < cfg.warmup_iters:
        return (iter_num + 1) / cfg.warmup_iters
    step = iter_num
    if cfg.wall_clock and cfg.max_time > 0:
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


def set_lr(optimizers, lr_factor):
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * lr_factor


class EMA:
    """The exponential moving average (EMA) of a model's parameters: what evaluations score and checkpoints keep
    as the model.

    Each step moves it 1 - decay * (1 - lr) of the way to the weights, lr being the step's fraction of the peak
    learning rate. At the peak it is the weights themselves (an average of a model still learning fast lags
    behind it); as the rate decays it averages over more steps, about 1 / (1 - decay) at the end, smoothing
    out the noise of the last updates."""

    def __init__(self, model, decay):
        self.model, self.decay = model, decay
        self.params = list(model.parameters())
        self.values = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self, lr_factor):
        torch._foreach_lerp_(self.values, self.params, 1 - self.decay * (1 - min(1.0, lr_factor)))

    def state_dict(self):
        """The model's state dict with the EMA in place of its parameters (under every name a tied one has)."""
        averages = {id(p): a for p, a in zip(self.params, self.values)}
        return {name: averages.get(id(t), t).detach() for name, t in self.model.state_dict(keep_vars=True).items()}

    @contextmanager
    def swapped_in(self):
        """The model holds the EMA inside the block and its own weights again after it."""
        trained = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, a in zip(self.params, self.values):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, t in zip(self.params, trained):
                    p.copy_(t)


def step_optimizers(model, optimizers, scaler, grad_clip):
    """Clip the accumulated gradients, step every optimizer and clear the gradients."""
    if grad_clip > 0:
        for opt in optimizers:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    for opt in optimizers:
        opt.zero_grad()


