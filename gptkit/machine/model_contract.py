"""What the tools need of the learner's model.py that its code does not say: GPT.forward(idx, targets) returns
(logits, loss), and merge_lora(weights, config) (weights, config). Checked where a tool calls them, so that an edit
that returns otherwise is one line naming it."""

import torch

from gptkit.base.errors import UserError
from gptkit.base.modes import evaluating
import model as model_py  # the module, read at each call: the learner's merge_lora as it is


@torch.no_grad()
def check_forward(model):
    """model.py's GPT.forward as the tools call it, on a few tokens (in eval mode: no dropout draws): (logits,
    loss), the loss one number. A learner's edit that returns otherwise is one line before any work: in training,
    not an error deep inside the loop after the first evaluation, or in the measuring that times it first; in
    the tools that read a run, before the analysis that unpacks it."""
    idx = torch.zeros((1, min(4, model.config.block_size)), dtype=torch.long, device=next(model.parameters()).device)
    with evaluating(model):
        out = model(idx, idx)
    if not (isinstance(out, tuple) and len(out) == 2):
        got = f"{len(out)} values" if isinstance(out, tuple) else type(out).__name__
        raise UserError(f"model.py's GPT.forward(idx, targets) returned {got}: the tools read (logits, loss)")
    if not (torch.is_tensor(out[1]) and out[1].numel() == 1):
        got = f"a loss of shape {tuple(out[1].shape)}" if torch.is_tensor(out[1]) else f"{type(out[1]).__name__}"
        raise UserError(f"model.py's GPT.forward(idx, targets) returned {got} as its loss: train.py steps on one "
                        "number, the mean over the tokens")
    check_logits(model, out[0], idx, "idx, targets", "every position's", last=False)
    with evaluating(model):
        out = model(idx)
    check_logits(model, out[0] if isinstance(out, tuple) and len(out) == 2 else None, idx, "idx",
                 "the last position's (or every position's)", last=True)


def check_logits(model, logits, idx, called, which, last):
    """One line where GPT.forward(called) gave no logits of the shape the tools read: (B, T, vocab_size), or with
    last (no targets, as sampling calls it) (B, 1 or T, vocab_size)."""
    B, T, V = *idx.shape, model.config.vocab_size
    if torch.is_tensor(logits) and logits.dim() == 3 and logits.shape[0] == B and logits.shape[2] == V and \
            logits.shape[1] in ((1, T) if last else (T,)):
        return
    got = f"logits of shape {tuple(logits.shape)}" if torch.is_tensor(logits) else \
        f"{type(logits).__name__}, not (logits, loss)"
    rows, count = ("1 or T", f"1 or {T}") if last else ("T", T)
    raise UserError(f"model.py's GPT.forward({called}) returned {got} for {B} × {T} tokens: the tools read {which} "
                    f"logits, (B, {rows}, vocab_size) = ({B}, {count}, {V})")


def merged_lora(weights, config):
    """model.py's merge_lora(weights, config): (weights with LoRA's adapters folded in, config), or one line where
    an edit returns otherwise. Its own ValueError (an adapter no matrix computes) passes on to the caller."""
    out = model_py.merge_lora(weights, config)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict)):
        got = f"{len(out)} values" if isinstance(out, tuple) else type(out).__name__
        raise UserError(f"model.py's merge_lora(weights, config) returned {got}: the tools read (weights, config), "
                        "the weights a dict")
    return out
