"""Experiments on a trained model through its hook points, under TransformerLens's names and conventions so that
its tutorials carry over: open a run, run a text with every activation cached or with hook functions of your own,
switch heads and MLPs off (zero or mean ablation), score what each head does, patch activations from one prompt
into another, and attribute a logit to the parts that wrote it. Layers and heads count from 0; a head is written
L0H3 (layer 0, head 3), an MLP MLP1. docs/analysis.md shows each at work and defines each score."""

import math
import numbers
import os
import re
import reprlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from gptkit.base.errors import UserError
from gptkit.base.progress import progress
from gptkit.data.conversations import typed
from gptkit.interp.hooks import forward_from, hook_points, hooked, names_in, piece, run_with_cache
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.run.metrics import KINDS
from gptkit.run.run_folder import check_checkpoint, model_of

LOCAL_WINDOW = 4  # the local score: attention on the current token and the 3 before it
REPEAT_LENGTH = 32  # the longest random sequence the induction and duplicate-token scores repeat
REPEAT_ROWS = 32  # how many such sequences
LABEL_AT_LEAST = 0.15  # a head is labelled with a kind whose score is this share of the way from chance to 1
PASS_TOKENS = 4096  # tokens in one batched pass of the ablation deltas: its activations stay in the caches
PASS_FLOATS = 1 << 26  # and a bound on a pass's widest activation (4 x n_embd or the vocabulary), 256 MB


# ----------------------------------------------------------------------------- a run, its tokens and hooks


@dataclass(frozen=True)
class Hook:
    """What a hook function gets as its second argument, as TransformerLens's HookPoint: its name."""

    name: str

    def layer(self):
        """The layer the hook point sits in (blocks.{layer}....)."""
        found = re.match(r"blocks\.(\d+)\.", self.name)
        if not found:
            raise UserError(f"hook point {self.name!r} is in no layer")
        return int(found.group(1))


class Run:
    """A trained model (in eval mode) and its tokenizer, opened from a run folder: what the experiments take."""

    def __init__(self, model, tok, out_dir, trained_on=None, checkpoint="best", iteration=None):
        self.model, self.tok, self.out_dir = model, tok, Path(out_dir)
        self.trained_on = trained_on or {}  # the training config's dataset and data_dir, where its val split is
        # which of the run's checkpoints the weights are ('best', 'latest', 'iter:N'), and the step they are of:
        # an SAE belongs to the weights it was trained on (gptkit/interp/features.py)
        self.checkpoint, self.iteration = checkpoint, iteration

    @property
    def config(self):
        return self.model.config

    @property
    def hook_names(self):
        return list(hook_points(self.model))

    def tokens(self, text):
        """The text's token ids (a chat model's markers by their names) as a (1, T) LongTensor on the model's
        device."""
        if not isinstance(text, str):
            raise UserError(f"expected a text (a str), got {shown_value(text)}")
        if not text:
            raise UserError("the text is empty: give the model at least one token")
        return checked_tokens(self.model, torch.tensor([self.tok.encode(typed(self.tok, text))]))

    def to_tokens(self, text_or_tokens):
        """A text's tokens, or token ids (T,) or (B, T) checked and moved to the model's device: (B, T)."""
        if isinstance(text_or_tokens, str):
            return self.tokens(text_or_tokens)
        if not isinstance(text_or_tokens, (torch.Tensor, list, tuple)) and not hasattr(text_or_tokens, "__array__"):
            raise UserError(f"expected a text (a str) or token ids (a tensor, or a list of whole numbers), got "
                            f"{shown_value(text_or_tokens)}")
        return checked_tokens(self.model, text_or_tokens)

    def run_with_cache(self, text_or_tokens, names_filter=None):
        return run_with_cache(self.model, self.to_tokens(text_or_tokens), checked_filter(names_filter))

    def run_with_hooks(self, text_or_tokens, fwd_hooks=()):
        return run_with_hooks(self.model, self.to_tokens(text_or_tokens), fwd_hooks)

    def features(self, hook):
        """The features of the SAE `analyze.py features` trained on this run at hook (e.g.
        'blocks.2.hook_resid_post'): encode, decode, and what each one fires on (gptkit/interp/features.py)."""
        from gptkit.interp.features import Features

        return Features.of(self, hook)

    def ablated(self, heads=(), mlps=(), how="zero", means=None, features=None):
        """The heads and MLPs off (see `ablated`), and features ({hook: [index, ...]}, each hook's SAE trained
        on this run) off too: their decoded contribution subtracted from the activation at their hook."""
        from gptkit.interp.features import feature_hooks

        return ablated(self.model, heads, mlps, how, None if means is None else self.to_tokens(means),
                       feature_hooks(self, features))


def open_run(out_dir, checkpoint="best", device="cpu"):
    """The Run in out_dir: its best.pt (with checkpoint='latest', latest.pt; with 'iter:N' the snapshot of iteration
    N), loaded on device ('cpu', 'cuda',
    'cuda:N', 'mps', or 'auto': the first of those this machine has)."""
    if not isinstance(out_dir, (str, os.PathLike)) or "\0" in str(out_dir):
        raise UserError(f"out_dir must be the path of a run folder, e.g. 'out'; got {shown_value(out_dir)}")
    try:
        check_checkpoint(checkpoint)
    except ValueError as e:
        raise UserError(str(e)) from None
    device = device_here(device)
    try:
        model, tok, ckpt = model_of(out_dir, checkpoint, device, watched=True)
    except OSError as e:  # a name too long for the file system, a folder this user may not read
        raise UserError(f"cannot read {out_dir} ({e.strerror or e})") from None
    trained = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    return Run(model, tok, out_dir,
               {key: trained[key] for key in ("dataset", "data_dir") if isinstance(trained.get(key), str)},
               checkpoint, ckpt["iter_num"] if type(ckpt.get("iter_num")) is int else None)


def device_here(device):
    """device ('cpu', 'cuda', 'cuda:N', 'mps' or 'auto'; a torch.device too) when this machine has it, 'auto' as
    the first of cuda, mps and cpu it has; one line otherwise."""
    name = str(device) if isinstance(device, torch.device) else device
    try:
        check_device_name(name)
    except ValueError:  # in a Python call's words, not a command line's
        raise UserError(f"device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto', got {shown_value(device)}") from None
    if name == "auto":
        return pick_device(name)
    gpus = torch.cuda.device_count() if name.startswith("cuda") else 0
    if name.startswith("cuda") and gpus <= number_in(name.partition(":")[2] or "0"):
        has = f"{gpus} CUDA GPU{'s' * (gpus > 1)} (cuda:0 to cuda:{gpus - 1})" if gpus else "no CUDA GPU torch can use"
        raise UserError(f"device {shown_value(name)} asked for, but this machine has {has}; use device='cpu'")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("device 'mps' asked for, but MPS is not available here; use device='cpu'")
    return name


class Shown(reprlib.Repr):
    """A value as a message echoes it: its repr cut short, a huge number by its length (Python will not write
    an int of more than 4300 digits, and a message should not hold thousands)."""

    def __init__(self):
        super().__init__()
        self.maxstring = self.maxother = 40
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 4

    def repr_int(self, x, level):
        return shown_number(x)


def shown_value(value):
    """repr(value) as a one-line message echoes it: cut short (see Shown), and with its type's name where that is
    not plain from it."""
    text = Shown().repr(value).replace("\n", " ")
    plain = isinstance(value, (str, int, float, tuple, list, type(None)))
    return text if plain else f"{text} ({type(value).__name__})"


def shown_number(n):
    """An int as a message writes it: a number of more than 15 digits by how many it has."""
    if -10 ** 15 < n < 10 ** 15:
        return str(int(n))
    digits = int((abs(n).bit_length() - 1) * math.log10(2)) + 1  # those of 2 ** (bits - 1): n's, or one fewer
    digits += abs(n) >= 10 ** digits
    return f"{'-' if n < 0 else ''}<a {digits:,}-digit number>"


def whole(value):
    """value as an int when it is a whole number (an int, a NumPy integer, a tensor of one integer), else None;
    never a bool, which Python counts as an int but no layer, head or token is called True."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point and \
            not value.dtype.is_complex and value.dtype != torch.bool:
        return int(value.item())
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


def outside_vocabulary(bad, vocab):
    return f"token id {shown_number(bad)} is outside the vocabulary (0 to {vocab - 1})"


def checked_tokens(model, idx, vocab=None):
    """idx as (B, T) token ids on the model's device, or one line saying why the model cannot read it: ids below
    `vocab` (the tokenizer's, where it has fewer than the model's padded rows). idx: a tensor, a NumPy array, or
    a list (of lists) of whole numbers."""
    vocab = vocab or model.config.vocab_size
    idx = ids_tensor(idx, vocab)
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool or idx.dim() not in (1, 2):
        raise UserError(f"token ids must be whole numbers of shape (T,) or (batch, T), got {idx.dtype} "
                        f"{tuple(idx.shape)}")
    idx = idx.long()[None] if idx.dim() == 1 else idx.long()
    if idx.numel() == 0:
        raise UserError("the text is empty: give the model at least one token")
    if idx.size(1) > model.config.block_size:
        raise UserError(f"the text is {idx.size(1)} tokens, longer than the model's block_size "
                        f"{model.config.block_size}")
    if idx.min() < 0 or idx.max() >= vocab:
        raise UserError(outside_vocabulary(idx[(idx < 0) | (idx >= vocab)][0].item(), vocab))
    return idx.to(next(model.parameters()).device)


def ids_tensor(ids, vocab):
    """Token ids as a tensor: a tensor as it is, a NumPy array's, or a list's (list_ids); one line for anything
    else (None, bytes, a text: Run.to_tokens takes texts)."""
    if isinstance(ids, torch.Tensor):
        return ids
    if isinstance(ids, (list, tuple)):
        return list_ids(ids, vocab)
    if hasattr(ids, "__array__") and not isinstance(ids, (str, bytes)):
        try:
            return torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):  # an array of objects, or of a dtype torch has not
            pass
    raise UserError(f"token ids must be a tensor, or a list (T) or a list of lists (batch, T) of whole numbers; "
                    f"got {shown_value(ids)}")


def list_ids(ids, vocab):
    """A list (T) or a list of lists (B, T) of token ids as a (B, T) tensor, each checked a whole number below
    vocab before the tensor is made: a tensor holds no number of more than 64 bits."""
    rows = ids if ids and all(isinstance(row, (list, tuple)) for row in ids) else [ids]
    if len({len(row) for row in rows}) > 1:
        lengths = ", ".join(str(len(row)) for row in rows[:4]) + (", ..." if len(rows) > 4 else "")
        raise UserError(f"the rows of token ids are of different lengths ({lengths}): give every row as many")
    for i in (i for row in rows for i in row):
        if whole(i) is None:
            raise UserError(f"token ids must be whole numbers, in a list (T) or a list of lists (batch, T); got "
                            f"{shown_value(i)} among them")
        if not 0 <= i < vocab:
            raise UserError(outside_vocabulary(i, vocab))
    return torch.tensor([[int(i) for i in row] for row in rows], dtype=torch.long)


def one_row(model, idx, what):
    """idx checked (checked_tokens) and one row, (1, T): what the call names it, for its one line."""
    idx = checked_tokens(model, idx)
    if idx.size(0) != 1:
        raise UserError(f"{what} must be one row of tokens, (1, T) or (T,); got {idx.size(0)} rows")
    return idx


def token_of(model, token, what):
    """token when it is a token id the model has; one line naming what otherwise."""
    vocab = model.config.vocab_size
    if whole(token) is None or not 0 <= whole(token) < vocab:
        raise UserError(f"{what} must be a token id, a whole number from 0 to {vocab - 1}; got {shown_value(token)}")
    return whole(token)


def checked_filter(names_filter):
    """A names_filter as run_with_cache takes it: None (every hook point), a name, a list of names or a function
    of a name; one line for anything else."""
    if names_filter is None or callable(names_filter) or isinstance(names_filter, str):
        return names_filter
    if isinstance(names_filter, (list, tuple, set, frozenset)) and all(isinstance(n, str) for n in names_filter):
        return names_filter
    raise UserError(f"names_filter must be None (every hook point), a hook point's name, a list of names or a "
                    f"function of a name; got {shown_value(names_filter)}")


def is_hook(pair):
    """Whether pair is a fwd_hooks entry: (a hook point's name or a function of a name, a function)."""
    return isinstance(pair, (list, tuple)) and len(pair) == 2 and callable(pair[1]) and \
        (isinstance(pair[0], str) or callable(pair[0]))


def run_with_hooks(model, idx, fwd_hooks=()):
    """Every position's logits (B, T, V) of a forward pass of idx in which each hook in fwd_hooks, a pair (hook
    point name, or a function of a name that picks the points, as TransformerLens takes it; function), calls
    function(activation, hook) with hook.name its point's name; a function that returns a tensor replaces the
    activation with it. The hooks are gone afterwards, as TransformerLens's run_with_hooks."""
    if not isinstance(fwd_hooks, (list, tuple)) or not all(is_hook(pair) for pair in fwd_hooks):
        raise UserError(f"fwd_hooks must be a list of (hook point name, function) pairs; got "
                        f"{shown_value(fwd_hooks)}")
    pairs = []
    for picks, fn in fwd_hooks:
        for name in names_in(model, picks if callable(picks) else [picks]):
            pairs.append((name, lambda x, name, fn=fn: fn(x, Hook(name))))
    with hooked(model, pairs):
        return model(idx, idx)[0]


# ----------------------------------------------------------------------------- ablation


@dataclass(frozen=True)
class Ablation:
    """What an `ablated` block switched off: heads as (layer, head), MLPs by layer, how, and a note (or None)."""

    heads: tuple
    mlps: tuple
    how: str
    note: str | None
    features: tuple = ()  # 'blocks.2.hook_resid_post F12': each feature switched off

    @property
    def label(self):
        """'L0H3, MLP1, blocks.2.hook_resid_post F12': the parts switched off, for a banner or a title."""
        return ", ".join([*part_names(self.heads, self.mlps), *self.features])


def no_attention(model):
    if model.config.n_layer == 0:
        raise UserError("this model has no attention (n_layer=0, a bigram model): it has no heads or layers to "
                        "look into")


HEAD_NAME = re.compile(r"\s*L([0-9]+)H([0-9]+)\s*", re.IGNORECASE)  # 'L0H3': head 3 of layer 0
MLP_NAME = re.compile(r"\s*MLP([0-9]+)\s*", re.IGNORECASE)  # 'MLP1': the MLP of layer 1
NOT_A_HEAD = "write L0H3 (layer 0, head 3) or (0, 3), or a list of them"
NOT_AN_MLP = "write MLP1 or the layer number, 1, or a list of them"


def part_names(heads, mlps):
    """The names of (layer, head) pairs and MLP layers: ['L0H3', 'MLP1']."""
    return [*(f"L{layer}H{head}" for layer, head in heads), *(f"MLP{m}" for m in mlps)]


def number_in(digits):
    """The number a run of digits writes; past 15 digits, out of every range here, one of as many digits (Python's
    int() refuses more than 4300)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 15 else 10 ** (len(digits) - 1)


def listed(parts, one, what, kind, how):
    """parts (the argument named what) as a list: one part (one(parts) says whether it is), a list, tuple or set
    of them, or None (none); one line for anything else, such as a number alone, which names no head: taken as
    no parts, it would switch nothing off without a word."""
    if parts is None:
        return []
    if one(parts):
        return [parts]
    if isinstance(parts, (list, tuple, set, frozenset, range)):
        return list(parts)
    raise UserError(f"{what}={shown_value(parts)} is not {kind} or a list of them: {how}")


def head_at(head):
    """(layer, head) of 'L0H3' or (0, 3), or None for anything else."""
    if isinstance(head, str):
        m = HEAD_NAME.fullmatch(head)
        return (number_in(m.group(1)), number_in(m.group(2))) if m else None
    if isinstance(head, (tuple, list)) and len(head) == 2 and None not in (whole(head[0]), whole(head[1])):
        return whole(head[0]), whole(head[1])
    return None


def parse_heads(model, heads):
    """Heads given as 'L0H3' or (layer, head), one, a list of them, or None (none), as sorted (layer, head)
    pairs; one line for anything else, or a head the model does not have."""
    heads = listed(heads, lambda h: isinstance(h, str) or isinstance(h, tuple) and head_at(h) is not None, "heads",
                   "a head", NOT_A_HEAD)
    if heads:
        no_attention(model)
    n_layer, n_head = model.config.n_layer, model.config.n_head
    found = set()
    for head in heads:
        at = head_at(head)
        if at is None:
            raise UserError(f"{shown_value(head)} is not a head: {NOT_A_HEAD}")
        layer, index = at
        if not (0 <= layer < n_layer and 0 <= index < n_head):
            raise UserError(f"head L{shown_number(layer)}H{shown_number(index)} is out of range: this model has "
                            f"layers 0-{n_layer - 1} and heads 0-{n_head - 1} in each")
        found.add(at)
    return tuple(sorted(found))


def mlp_at(mlp):
    """The layer of 'MLP1' or 1, or None for anything else."""
    if isinstance(mlp, str):
        m = MLP_NAME.fullmatch(mlp)
        return number_in(m.group(1)) if m else None
    return whole(mlp)


def parse_mlps(model, mlps):
    """MLPs given as a layer number or 'MLP1', one, a list of them, or None (none), as sorted layers; one line for
    anything else, or an MLP the model lacks."""
    mlps = listed(mlps, lambda m: isinstance(m, str) or whole(m) is not None, "mlps", "an MLP", NOT_AN_MLP)
    if mlps and model.config.n_layer == 0:
        no_attention(model)
    if mlps and not model.config.mlp:
        raise UserError("this model has no MLPs (mlp=False: its blocks are attention only)")
    found = set()
    for mlp in mlps:
        layer = mlp_at(mlp)
        if layer is None:
            raise UserError(f"{shown_value(mlp)} is not an MLP: {NOT_AN_MLP}")
        if not 0 <= layer < model.config.n_layer:
            raise UserError(f"MLP{shown_number(layer)} is out of range: this model has "
                            f"MLP0-MLP{model.config.n_layer - 1}")
        found.add(layer)
    return tuple(sorted(found))


def checked_how(how):
    if not isinstance(how, str) or how not in ("zero", "mean"):
        raise UserError(f"ablation must be 'zero' or 'mean' (got {shown_value(how)})")


def everything_note(model, heads, mlps=()):
    """A note when the heads switched off are all of them (allowed: a valid experiment), else None."""
    c = model.config
    if c.n_layer == 0 or len(heads) < c.n_layer * c.n_head:
        return None
    rest = "the embeddings alone" if not c.mlp or len(mlps) == c.n_layer else "the embeddings and the MLPs"
    bias = " and their output projections' biases" if c.bias else ""
    return f"every head is off: attention adds nothing{bias}, so what predicts is {rest}"


@torch.no_grad()
def mean_activations(model, idx, names):
    """{name: the activation's mean over every row and position of the tokens idx (B, T)}: for hook_z, (heads,
    d_head), each head's mean output; for hook_mlp_out, (d_model,). Taken in passes of rows, summed in float64."""
    sums, count = {}, 0
    rows = max(1, PASS_TOKENS // idx.size(1))
    for start in range(0, idx.size(0), rows):
        _, cache = run_with_cache(model, idx[start:start + rows], names)
        for name in names:
            sums[name] = sums.get(name, 0) + cache[name].double().sum((0, 1))
        count += idx[start:start + rows].numel()
    dtype = next(model.parameters()).dtype
    return {name: (total / count).to(dtype) for name, total in sums.items()}


def ablation_hooks(model, heads, mlps, fill):
    """[(hook name, function)] that switch the heads and MLPs off: each head's slice of hook_z (the input of the
    attention's output projection) and each MLP's output (hook_mlp_out) set to fill[name] (a mean) or 0."""
    hooks, layers = [], sorted({layer for layer, _ in heads})
    for layer in layers:
        name, off = f"blocks.{layer}.attn.hook_z", [h for l, h in heads if l == layer]

        def heads_off(z, name, off=off):
            z = z.clone()
            z[:, :, off] = fill[name][off].to(z.dtype) if name in fill else 0
            return z
        hooks.append((name, heads_off))
    for layer in mlps:
        name = f"blocks.{layer}.hook_mlp_out"
        hooks.append((name, lambda x, name: (fill[name].to(x.dtype).expand_as(x) if name in fill
                                              else torch.zeros_like(x))))
    return hooks


@contextmanager
def ablated(model, heads=(), mlps=(), how="zero", means=None, features=()):
    """Within the block the heads ('L0H3' or (0, 3)) and MLPs (1 or 'MLP1') are off in every forward pass of model:
    zero ablation sets each head's slice of hook_z, and each MLP's output, to 0; mean ablation to its mean over
    every row and position of the tokens `means` (B, T). features: (hook, function, label) triples that switch
    features off (Run.ablated makes them). Yields an Ablation; switching every head off is allowed, with a note,
    printed and kept in it."""
    heads, mlps = parse_heads(model, heads), parse_mlps(model, mlps)
    checked_how(how)
    fill = {}
    names = [*(f"blocks.{layer}.attn.hook_z" for layer in sorted({l for l, _ in heads})),
             *(f"blocks.{layer}.hook_mlp_out" for layer in mlps)]
    if how == "mean":
        if means is None:
            raise UserError("mean ablation needs means=: the tokens whose mean activation replaces each part's")
        fill = mean_activations(model, checked_tokens(model, means), names)
    note = everything_note(model, heads, mlps)
    if note:
        print(f"note: {note}")
    with hooked(model, [*ablation_hooks(model, heads, mlps, fill), *((h, f) for h, f, _ in features)]):
        yield Ablation(heads, mlps, how, note, tuple(label for _, _, label in features))




def token_losses(logits, targets):
    """Each target's cross-entropy, in float32: (B, T); 0 at a target of -1, which the loss skips (a chat dataset's
    prompt tokens, as train.py's loss does)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none",
                           ignore_index=-1).view(targets.shape)


def checked_targets(model, targets):
    """targets checked as checked_tokens checks ids, but where a tensor, -1 is allowed: a target the loss skips."""
    if not isinstance(targets, torch.Tensor) or not (targets == -1).any():
        return checked_tokens(model, targets)
    skipped = targets == -1
    checked = checked_tokens(model, targets.masked_fill(skipped, 0))
    return checked.masked_fill(skipped.to(checked.device), -1)


def pass_shape(model, T):
    """(heads per batched pass, rows of T tokens per pass) for the ablation deltas: PASS_TOKENS a pass, fewer where
    the vocabulary or the MLP is wide, so a pass's widest activation stays within PASS_FLOATS."""
    c = model.config
    tokens = max(T, min(PASS_TOKENS, PASS_FLOATS // max(4 * c.n_embd, c.vocab_size)))
    group = max(1, min(c.n_head, tokens // T))
    return group, max(1, tokens // (group * T))


def each_head_off(model, layer, heads, cache, targets, rotary, fill):
    """The summed loss of targets with each of heads (of layer) off in turn, in one pass: the batch carries a copy
    of the rows per head, each starting at the layer's input (hook_resid_pre from cache, a pass of the intact
    model), its own head's slice of hook_z set to fill's (n_head, d_head) as the layer runs. The blocks' own
    forward does the rest, as written: a learner's Block.forward (a parallel block, a scaled branch) is what runs."""
    z_name, g = f"blocks.{layer}.attn.hook_z", len(heads)
    pre = cache[f"blocks.{layer}.hook_resid_pre"]  # (R, T, C)
    off = torch.zeros(g, model.config.n_head, dtype=torch.bool, device=pre.device)
    off[torch.arange(g), heads] = True  # copy i: head heads[i] off

    def heads_off(z, name):  # z (g * R, T, n_head, d_head)
        copies = z.view(g, -1, *z.shape[1:])
        return torch.where(off[:, None, None, :, None], fill.to(z.dtype), copies).view_as(z)
    with hooked(model, {z_name: heads_off}):
        logits = forward_from(model, layer, pre.repeat(g, 1, 1), rotary)
    return token_losses(logits, targets.repeat(g, 1)).view(g, -1).double().sum(1)


@torch.no_grad()
def ablation_deltas(model, idx, targets, how="zero"):
    """(the loss of targets after idx, both (B, T); each head's change to it when that head alone is off,
    (n_layer, n_head)). Mean ablation uses each head's mean hook_z over these same tokens. Batched: each pass
    carries a group of heads of one layer, one copy of the rows each, and starts at that layer's input, kept from
    one intact pass: the layers before an ablated head are computed once."""
    no_attention(model)
    checked_how(how)
    idx, targets = checked_tokens(model, idx), checked_targets(model, targets)
    if idx.shape != targets.shape:
        raise UserError(f"idx is {tuple(idx.shape)} and targets {tuple(targets.shape)}: each target is the token "
                        "after its idx, so they must be the same shape")
    n = int((targets != -1).sum())
    if not n:
        raise UserError("every target is -1, which the loss skips: give at least one token to score")
    L, H = model.config.n_layer, model.config.n_head
    z_names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]
    fill = mean_activations(model, idx, z_names) if how == "mean" else None
    kept = [f"blocks.{layer}.{point}" for layer in range(L) for point in ("hook_resid_pre", "attn.hook_z")]
    group, rows = pass_shape(model, idx.size(1))
    total, base = torch.zeros(L, H, dtype=torch.float64), 0.0
    bar = progress(range(0, idx.size(0), rows), desc="ablating heads", unit="pass", leave=False, delay=1.0)
    for start in bar:
        x, y = idx[start:start + rows], targets[start:start + rows]
        logits, cache = run_with_cache(model, x, kept)
        base += token_losses(logits, y).double().sum().item()
        rotary = piece(model, "embed")(x[:1])[1]
        for layer in range(L):
            # a head's width as its hook_z has it: a learner's model.py may size heads other than n_embd // n_head
            values = torch.zeros(H, cache[z_names[layer]].size(-1), device=x.device) if fill is None \
                else fill[z_names[layer]]
            for first in range(0, H, group):
                heads = list(range(first, min(H, first + group)))
                total[layer, heads] += each_head_off(model, layer, heads, cache, y, rotary, values).cpu()
    return base / n, (total / n - base / n).float()


# ----------------------------------------------------------------------------- what each head does


def repeated_tokens(vocab, length, rows=REPEAT_ROWS, seed=0):
    """(rows, 2 * length) token ids, each row ending in a random sequence written twice: L distinct ids drawn from
    vocab (a count, or a 1-D tensor of the ids to draw from), then the same L again, with L from length // 2 to
    length in turn, so that a head attending a fixed distance back scores on few rows; before them, ids drawn
    from the rest of vocab fill the row. The sequences of the induction and duplicate-token scores."""
    pool = torch.arange(vocab) if isinstance(vocab, int) else torch.as_tensor(vocab)
    if not 1 <= length <= len(pool):
        raise UserError(f"cannot draw {length} distinct tokens from {len(pool)}")
    generator = torch.Generator().manual_seed(seed)
    lengths = range(max(1, length // 2), length + 1)
    out = []
    for row in range(rows):
        L, order = lengths[row % len(lengths)], pool[torch.randperm(len(pool), generator=generator)]
        rest = order[L:] if L < len(order) else order
        fill = rest[torch.randint(len(rest), (2 * (length - L),), generator=generator)]
        out.append(torch.cat((fill, order[:L], order[:L])))
    return torch.stack(out)


def induction_tokens(model, vocab, rows=REPEAT_ROWS, seed=0):
    """The repeated sequences head_scores reads for a model, on its device: min(REPEAT_LENGTH, block_size // 2,
    vocab) distinct ids of the first `vocab` drawn at random (vocab: the tokenizer's, which a padded model
    vocabulary may exceed), written twice."""
    length = min(REPEAT_LENGTH, model.config.block_size // 2, vocab)
    return repeated_tokens(vocab, length, rows, seed).to(next(model.parameters()).device)


def patterns(model, idx, rows=None):
    """Every layer's attention weights for idx, of its first `rows` rows (None: all): (n_layer, B, n_head, T, T);
    with the pass's logits (B, T, V) for every row."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.config.n_layer)]
    logits, cache = run_with_cache(model, idx, names)
    return torch.stack([cache[name][:rows].float().cpu() for name in names]), logits


def share_on(P, keys, queries):
    """Each head's attention on its keys (a (T, T) or (B, T, T) mask), averaged over the queries (a (T,) or (B, T)
    mask) of every row, from P, every layer's weights (n_layer, B, n_head, T, T): (n_layer, n_head)."""
    B, T = P.size(1), P.size(-1)
    keys = keys.expand(B, T, T)[:, None].to(P)  # (B, 1, T, T)
    queries = queries.expand(B, T)[:, None].to(P)  # (B, 1, T)
    return ((P * keys).sum(-1) * queries).sum((1, 3)) / queries.sum()


def scores_of(text_weights, repeated_weights, repeated):
    """head_scores from attention weights (n_layer, B, n_head, T, T): on real text, and on the sequences repeated."""
    T = text_weights.size(-1)
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]
    window = min(LOCAL_WINDOW, T - 1)
    scores = {"previous_token": share_on(text_weights, s == t - 1, torch.arange(T) >= 1),
              "first_token": share_on(text_weights, (s == 0).expand(T, T), torch.arange(T) >= 1),
              "local": share_on(text_weights, (s <= t) & (s > t - window), torch.arange(T) >= window)}
    tok = repeated.cpu()
    T = tok.size(1)
    same = tok[:, :, None] == tok[:, None, :]  # (B, query, key): the same token
    duplicate = same & (torch.arange(T)[None, :] < torch.arange(T)[:, None])  # in an earlier key
    # the key just after an earlier copy of the query's token: the duplicate mask moved one key to the right
    after_duplicate = torch.cat((torch.zeros_like(duplicate[:, :, :1]), duplicate[:, :, :-1]), 2)
    seen = duplicate.any(-1)  # the queries whose token came before: the second copy, and chance repeats
    scores["duplicate_token"] = share_on(repeated_weights, duplicate, seen)
    scores["induction"] = share_on(repeated_weights, after_duplicate, seen)
    return {kind: scores[kind] for kind in KINDS}


@torch.no_grad()
def head_scores(model, text, repeated):
    """{kind: (n_layer, n_head) scores in [0, 1]} for each kind in KINDS (docs/analysis.md defines them and names
    their sources): previous_token, first_token and local from the attention on text (B, T), windows of real
    text; duplicate_token and induction from repeated (B, T'), random sequences each written twice
    (repeated_tokens)."""
    no_attention(model)
    text, repeated = checked_tokens(model, text), checked_tokens(model, repeated)
    return scores_of(patterns(model, text)[0], patterns(model, repeated)[0], repeated)


def chance_scores(text, repeated):
    """{kind: the score of a head that attends evenly to every position it sees} on the same tokens: what each
    score is worth by chance (a local window of 4 keys takes a larger share of a short past than one key)."""
    def even(idx):
        T = idx.size(1)
        rows = torch.ones(T, T).tril()
        return (rows / rows.sum(-1, keepdim=True)).expand(1, idx.size(0), 1, T, T)
    return {kind: s.item() for kind, s in scores_of(even(text), even(repeated), repeated).items()}


def head_labels(scores, chance, at_least=LABEL_AT_LEAST):
    """[[label]] a layer, a head: the kind each head does most above chance, by its score's share of the way from
    chance to 1, (s - chance) / (1 - chance), where that reaches at_least; else 'local' where local's does (its
    window holds the previous token, so a previous-token head is local too); else ''."""
    lifted = {k: (scores[k] - chance[k]) / (1 - chance[k]) for k in KINDS}
    specific = [k for k in KINDS if k != "local"]
    best, which = torch.stack([lifted[k] for k in specific]).max(0)
    return [[specific[k] if b >= at_least else "local" if near >= at_least else ""
             for b, k, near in zip(*row)]
            for row in zip(best.tolist(), which.tolist(), lifted["local"].tolist())]


# ----------------------------------------------------------------------------- activation patching


def run_patched(model, corrupt, clean_cache, names, positions=None):
    """Every position's logits for the tokens corrupt with the activations at the named hook points replaced by
    clean_cache's (a run_with_cache of the clean tokens, same shape): at every position, or only at positions
    (the query positions of hook_attn_scores and hook_pattern)."""
    def patch(x, name):
        if positions is None:
            return clean_cache[name].to(x.dtype)
        x, at = x.clone(), [slice(None)] * x.dim()
        at[2 if name.endswith(("hook_attn_scores", "hook_pattern")) else 1] = positions
        x[tuple(at)] = clean_cache[name][tuple(at)].to(x.dtype)
        return x

    with torch.no_grad(), hooked(model, [(name, patch) for name in names]):
        return model(corrupt, corrupt)[0]


def metric_of(target, foil):
    """The patching metric of every row's last position: the log-probability of target, or with a foil the
    logit difference target - foil. (logits (B, T, V)) -> (B,)."""
    if foil is None:
        return lambda logits: torch.log_softmax(logits[:, -1].float(), -1)[:, target]
    return lambda logits: (logits[:, -1, target] - logits[:, -1, foil]).float()


@dataclass
class Patching:
    resid: torch.Tensor  # (n_layer, T): the metric with blocks.{layer}.hook_resid_pre at one position from clean
    heads: torch.Tensor  # (n_layer, n_head): the metric with one head's hook_z from clean, at every position
    clean: float  # the metric of the clean run, and of the corrupt run
    corrupt: float
    target: int  # the token the metric scores (the clean run's top prediction unless given), and the foil or None
    foil: int | None


@torch.no_grad()
def patching(model, clean, corrupt, target=None, foil=None):
    """Activation patching from the clean tokens (1, T) into the corrupt ones (1, T), measured by metric_of(target,
    foil) at the last position; target defaults to the clean run's top prediction there. Each layer's cells
    in one batched pass from that layer's corrupt resid_pre, a row per cell."""
    no_attention(model)
    clean, corrupt = one_row(model, clean, "clean"), one_row(model, corrupt, "corrupt")
    if clean.shape != corrupt.shape:
        raise UserError(f"the clean prompt is {clean.size(-1)} tokens and the corrupt one {corrupt.size(-1)}: "
                        "patching pairs their positions, so they must be the same length")
    L, H, T = model.config.n_layer, model.config.n_head, clean.size(1)
    names = [f"blocks.{layer}.{point}" for layer in range(L) for point in ("hook_resid_pre", "attn.hook_z")]
    clean_logits, clean_cache = run_with_cache(model, clean, names)
    corrupt_logits, corrupt_cache = run_with_cache(model, corrupt, names)
    target = int(clean_logits[0, -1].argmax()) if target is None else token_of(model, target, "target")
    foil = None if foil is None else token_of(model, foil, "foil")
    metric, rotary = metric_of(target, foil), piece(model, "embed")(clean)[1]
    resid, heads = torch.empty(L, T), torch.empty(L, H)
    for layer in range(L):
        pre, z = f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z"
        x = corrupt_cache[pre].repeat(T, 1, 1)
        x[torch.arange(T), torch.arange(T)] = clean_cache[pre][0]  # row p: position p from clean
        resid[layer] = metric(forward_from(model, layer, x, rotary)).cpu()
        one = torch.eye(H, dtype=torch.bool, device=clean.device)[:, None, :, None]  # row h: head h from clean
        with hooked(model, {z: lambda z, name: torch.where(one, clean_cache[name], z)}):
            heads[layer] = metric(forward_from(model, layer, corrupt_cache[pre].repeat(H, 1, 1), rotary)).cpu()
    return Patching(resid, heads, metric(clean_logits).item(), metric(corrupt_logits).item(), target, foil)


# ----------------------------------------------------------------------------- direct logit attribution


@dataclass
class Attribution:
    target: int  # the token whose logit is attributed
    position: int  # the position whose prediction it is
    parts: dict  # {part: its share of the logit}: embed, pos_embed, L0H0, ..., L0 attention bias, MLP0, ...
    norm_bias: float  # what the final norm's bias adds (0 without one)
    raw_logit: float  # the logit before any soft-cap: sum(parts) + norm_bias, exactly up to float rounding
    logit: float  # the logit the model gave (soft-capped where logit_softcap is set)
    adds_up: bool  # the parts give that logit: not where an edited model.py builds the stream or logit otherwise


@torch.no_grad()
def attribute(model, idx, position, target=None):
    """Direct logit attribution of target's logit at position of idx (1, T); target defaults to the token that came
    next, idx[position + 1]. Each part's output into the residual stream, through the final norm with its scale
    frozen at the real pass's (ln_final.hook_scale) and its centring, which is linear, applied to each part,
    dotted with target's unembedding. The final stream is the sum of the parts, so the parts and the norm's bias
    term sum to the logit (before any soft-cap) exactly."""
    idx = one_row(model, idx, "idx")
    c, T, at = model.config, idx.size(1), whole(position)
    if at is None:
        raise UserError(f"position must be a whole number, got {shown_value(position)}")
    if target is None and not 0 <= at < T - 1:
        raise UserError(f"position must be 0 to {T - 2}, a position with a next token in the text (got "
                        f"{shown_number(at)})" if T > 1 else "the text is one token: attribution needs a next token "
                        "to attribute")
    if not 0 <= at < T:
        raise UserError(f"position must be 0 to {T - 1} (got {shown_number(at)})")
    position = at
    target = int(idx[0, position + 1]) if target is None else token_of(model, target, "target")
    logits, cache = run_with_cache(model, idx, None)
    if "ln_final.hook_scale" not in cache:
        raise UserError("attribute splits the logit through the final norm, whose scale (ln_final.hook_scale) "
                        "model.py, as edited, no longer computes: GPT.forward applies transformer.ln_f, and "
                        "Norm.forward passes its divisor through self.hook_scale")
    ln, unembed = model.transformer.ln_f, model.lm_head.weight[target].float()
    direction = unembed * ln.weight.float() / cache["ln_final.hook_scale"][0, position].float()

    def through(v):
        v = v.float()
        return ((v - v.mean(-1, keepdim=True) if ln.centred else v) @ direction).item()

    parts = {"embed": through(cache["hook_embed"][0, position])}
    if "hook_pos_embed" in cache:
        parts["pos_embed"] = through(cache["hook_pos_embed"][0, position])
    for layer, block in enumerate(model.transformer.h):
        z, proj = cache[f"blocks.{layer}.attn.hook_z"][0, position], block.attn.c_proj
        d = z.size(-1)
        for head in range(c.n_head):
            parts[f"L{layer}H{head}"] = through(proj.weight[:, head * d:(head + 1) * d] @ z[head])
        if proj.bias is not None:
            parts[f"L{layer} attention bias"] = through(proj.bias)
        if block.mlp is not None:
            parts[f"MLP{layer}"] = through(cache[f"blocks.{layer}.hook_mlp_out"][0, position])
    final = cache[f"blocks.{c.n_layer - 1}.hook_resid_post"] if c.n_layer else cache["hook_embed"] + \
        cache.get("hook_pos_embed", 0)
    raw = model.lm_head(ln(final[:, position]))[0, target].item()
    norm_bias = 0.0 if ln.bias is None else (unembed @ ln.bias.float()).item()
    logit, summed = logits[0, position, target].item(), sum(parts.values()) + norm_bias
    cap = c.logit_softcap
    expected = cap * math.tanh(summed / cap) if cap > 0 else summed
    # rounding over the parts' sum is a few of the dtype's eps of their size (float32's 1e-7, bfloat16's 8e-3); an
    # edit that scales a branch, the norm or the head is off by a share of the logit itself
    tolerance = max(1e-3, 4 * torch.finfo(logits.dtype).eps) * (1 + sum(abs(v) for v in parts.values()))
    adds_up = abs(expected - logit) <= tolerance
    return Attribution(target, position, parts, norm_bias, raw, logit, adds_up)
