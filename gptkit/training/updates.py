"""What a step does to the weights, whatever optimizers model.configure_optimizers returns: their peak rates
kept and named, the learning-rate schedule, clipping and stepping, and the EMA of the weights that evaluations
score."""

import math
from contextlib import contextmanager
from pathlib import Path

import torch

from gptkit.base.errors import UserError
from gptkit.machine.stand_ins import changed_since


OPTIMIZER_METHODS = ("param_groups", "step", "zero_grad", "state_dict", "load_state_dict")


def schedulable(optimizers):
    """What model.configure_optimizers returned (one optimizer, or several) as a list, each group keeping its
    peak learning rate (base_lr), which the schedule scales. Anything else is one line: a learner's edit there
    would otherwise fail inside the loop, or, returning none, train nothing without a word."""
    optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
    # torch's optimizers and those of gptkit/optim, which step as torch's do
    wrong = [o for o in optimizers if not all(hasattr(o, a) for a in OPTIMIZER_METHODS)]
    if wrong or not optimizers:
        got = ("None" if wrong[0] is None else f"a {type(wrong[0]).__name__}") if wrong else "an empty list"
        raise UserError(f"model.py's GPT.configure_optimizers returned {got}: it must return a torch optimizer, or "
                        "a list of them, over the weights to train")
    for opt in optimizers:
        for group in opt.param_groups:
            group.setdefault("base_lr", group["lr"])
    return optimizers


def restore_optimizers(optimizers, states, ckpt=None, path=None):
    """Load a checkpoint's optimizer states into this run's optimizers, which keep this run's settings (learning
    rates, betas, weight decay): the checkpoint's unless given again. ckpt (read from path): where its states do
    not fit and model.py's configure_optimizers was edited since it was saved, the line says that edit is why."""
    try:
        load_optimizers(optimizers, states)
    except UserError:
        if "GPT.configure_optimizers" not in changed_since((ckpt or {}).get("model_code")):
            raise
        raise UserError(f"{path}'s optimizer state does not fit the optimizers model.py's GPT.configure_optimizers "
                        "builds now, edited since it was saved: continue the run with the code it trained with, or "
                        f"start a new one from its weights in another folder (--init_from={Path(path).parent} "
                        "--out_dir=ANOTHER)") from None


def load_optimizers(optimizers, states):
    if len(states) != len(optimizers):
        raise UserError("the checkpoint was trained with a different optimizer; resume with the same one")
    for opt, state in zip(optimizers, states):
        settings = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
        try:
            misfit(opt, state)
            opt.load_state_dict(state)
        except ValueError:  # its parameter groups differ from this version's
            raise UserError("the checkpoint's optimizer state does not fit this run's parameter groups; "
                            "resume with the settings it was trained with") from None
        for group, own in zip(opt.param_groups, settings):
            group.update(own)


MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")  # AdamW's and Muon's, each a weight's shape


def misfit(opt, state):
    """One line where a saved state names a weight its groups do not hold, or keeps a moment of another shape than
    its weight's (a damaged or edited file): the fused AdamW step reads such a one out of bounds, a crash with no
    line at all. Groups of other sizes are left to load_state_dict, which says so."""
    ids = [i for group in state["param_groups"] for i in group["params"]]
    params = [p for group in opt.param_groups for p in group["params"]]
    if len(ids) != len(params):
        return
    by_id = dict(zip(ids, params))
    for i, moments in state["state"].items():
        if i not in by_id or any(torch.is_tensor(moments.get(k)) and moments[k].shape != by_id[i].shape
                                 for k in MOMENTS):
            raise UserError(f"the checkpoint's optimizer state is damaged: its state of weight {i!r} fits no weight "
                            "of the model; resume from another saved state, or start over")


def rates(optimizers):
    """{'adamw_lr': rate, ...}: each optimizer's learning rate now, named for its class (a second of one class
    numbered): its default rate (a group may set its own, as AdamW's embeddings do; an optimizer without
    defaults, its first group's) times the schedule's factor."""
    out = {}
    for opt in optimizers:
        kind = type(opt).__name__.lower()
        name, n = f"{kind}_lr", 2
        while name in out:
            name, n = f"{kind}{n}_lr", n + 1
        group = opt.param_groups[0]
        peak = getattr(opt, "defaults", {}).get("lr", group["base_lr"])
        out[name] = peak * (group["lr"] / group["base_lr"] if group["base_lr"] else 1.0)
    return out


def described(optimizers):
    """The optimizers in words: 'optimizers: Muon (lr 0.02) over 589,824 parameters, AdamW (lr 0.003) over ...'."""
    parts = [f"{type(opt).__name__} (lr {rate:.3g}) over "
             f"{sum(p.numel() for g in opt.param_groups for p in g['params']):,} parameters"
             for opt, rate in zip(optimizers, rates(optimizers).values())]
    return "optimizers: " + ", ".join(parts)


def group_has(key, index=None):
    """Whether a parameter group holds a value at key (at index of the tuple there, for betas)."""
    def has(group, value):
        held = group.get(key)
        return (held if index is None else (held or (None, None))[index]) == value
    return has


# where each optimizer setting shows in the optimizers configure_optimizers built from it, as written
TAKEN = {**dict.fromkeys(("learning_rate", "embedding_lr", "muon_lr"), group_has("base_lr")),
         **dict.fromkeys(("weight_decay", "muon_weight_decay"), group_has("weight_decay")),
         "beta1": group_has("betas", 0), "beta2": group_has("betas", 1), "muon_momentum": group_has("momentum")}


def settings_untaken(optimizers, cfg, asked):
    """A note naming the optimizer settings given on the command line that no group of the optimizers holds (and
    an optimizer= none of them is), where model.py's GPT.configure_optimizers was written to build its own (SGD at
    lr 0.1, say): they change nothing, which the learner should hear. None where every one shows."""
    groups = [g for opt in optimizers for g in opt.param_groups]
    # embedding_lr 0 is learning_rate's, which is checked as itself
    untaken = [key for key in sorted(asked) if key in TAKEN and not (key == "embedding_lr" and not cfg.embedding_lr)
               and not any(TAKEN[key](g, getattr(cfg, key)) for g in groups)]
    kinds = {type(opt).__name__.lower() for opt in optimizers}
    if "optimizer" in asked and cfg.optimizer not in kinds:
        untaken.insert(0, "optimizer")
    if not untaken:
        return None
    given = ", ".join(f"{key}={getattr(cfg, key)!r}" for key in untaken)
    return (f"note: {given}, given for this run, {'is' if len(untaken) == 1 else 'are'} in none of the optimizers "
            f"model.py's GPT.configure_optimizers builds ({described(optimizers).removeprefix('optimizers: ')}): "
            "it trains as that function is written")


def update_for(cfg):
    """For timing a whole step before a run starts: a function of (model, dtype) returning one that takes an
    optimizer step of that model, and of its weights' average, after a backward."""
    def update_of(model, dtype):
        optimizers = schedulable(model.configure_optimizers(cfg, dtype))
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


