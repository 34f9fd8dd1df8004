"""Looking inside a model through its hook points: every layer's attention weights and residual stream as the real
forward pass computes them, what each layer's stream would predict next (the logit lens), how surprised the model
is by each token, and tokens as labels. Hook points are named as TransformerLens names them: hook_embed,
blocks.0.hook_resid_pre, blocks.0.attn.hook_pattern, ..., ln_final.hook_scale; layers and heads count from 0."""

import math
from contextlib import contextmanager

import torch

from gptkit.base.errors import UserError
from gptkit.base.modes import evaluating
from gptkit.data.conversations import marker_name, typed
from gptkit.data.tokenizer import visible
from model import HookPoint

# the model's module paths (nanoGPT's, which checkpoints and GPT-2's weights use) as TransformerLens names them
RENAMED = (("transformer.h.", "blocks."), ("transformer.ln_f.", "ln_final."), ("ln_1.", "ln1."), ("ln_2.", "ln2."))


def hook_points(model):
    """{name: HookPoint} of every hook point in the model, under TransformerLens's names."""
    points = {}
    for name, module in model.named_modules():
        if isinstance(module, HookPoint):
            for old, new in RENAMED:
                name = name.replace(old, new)
            points[name] = module
    return points


class MissingHookPoint(UserError):
    """An analysis asked for a hook point the model's forward does not have, or never passed through."""


@contextmanager
def hooked(model, hooks):
    """Within the block, each hook point named in hooks ({name: function}, or (name, function) pairs, which may
    name a point more than once: its functions run in turn) calls its function with (activation, name) in the
    forward pass; a function that returns a tensor replaces the activation with it."""
    points = hook_points(model)
    pairs = list(hooks.items() if isinstance(hooks, dict) else hooks)
    unknown = [name for name, _ in pairs if name not in points]
    if unknown:
        raise MissingHookPoint(f"no hook point {unknown[0]!r} in this model (it has {', '.join(points)})")
    handles = [points[name].register_forward_hook(lambda module, args, out, name=name, fn=fn: fn(out, name))
               for name, fn in pairs]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def first_nan(model, idx):
    """Where a forward pass of idx first computes nan: (the first hook point, in the order the pass reaches them,
    whose activation holds one, and whether that is an attention pattern whose scores had a row of -inf alone, a
    query with every key masked), or None where none does."""
    found, scores = [], {}

    def look(x, name):
        if name.endswith("hook_attn_scores"):
            scores["masked_row"] = bool(torch.isneginf(x).all(-1).any())
        if not found and torch.isnan(x).any():
            found.append((name, name.endswith("hook_pattern") and scores.get("masked_row", False)))
    with evaluating(model), hooked(model, [(name, look) for name in hook_points(model)]):
        model(idx)
    return found[0] if found else None


def names_in(model, names_filter):
    """The hook points a filter picks, as TransformerLens's names_filter: None (every one), a name, a list of
    names, or a function of a name that says whether to keep it."""
    if names_filter is None or callable(names_filter):
        return [name for name in hook_points(model) if names_filter is None or names_filter(name)]
    return [names_filter] if isinstance(names_filter, str) else list(names_filter)


class Activations(dict):
    """{hook point: activation} of a forward pass. A point the pass never reached is one line naming it: a
    learner's forward written without its hook points (Block.forward as nanoGPT writes it) still has them, unused."""

    def __missing__(self, name):
        call = name.rpartition(".")[2]
        raise MissingHookPoint(f"model.py's forward never passes through the hook point {name}, which this analysis "
                               f"reads: an edit left out its self.{call}(...) call; put it back where model.py had it "
                               "(training and sampling run without it)")


@contextmanager
def caching(model, names_filter=None):
    """Within the block, every forward pass keeps the activation at each hook point names_filter picks in the
    dict it yields, {name: activation} (a later pass's replacing an earlier one's; one it never reached, asked
    for, is one line)."""
    cache = Activations()
    with hooked(model, {name: lambda x, name: cache.__setitem__(name, x) for name in names_in(model, names_filter)}):
        yield cache


@torch.no_grad()
def run_with_cache(model, idx, names_filter=None):
    """Run the model's forward pass on idx (B, T), keeping the activation at each hook point names_filter picks
    (see names_in; None: every one): (every position's logits (B, T, V), {name: activation}), as
    TransformerLens's run_with_cache."""
    with caching(model, names_filter) as cache:
        logits, _ = model(idx, idx)  # given targets, the forward keeps every position's logits; the loss is unused
    return logits, cache


PIECES = {"embed": "tokens to vectors, with their positions", "head": "the final stream to logits"}


def piece(model, name):
    """The learner's GPT.<name> (a piece of GPT.forward, PIECES, that an analysis calls on its own), or one line
    where an edit renamed it."""
    try:
        return getattr(model, name)
    except AttributeError:
        raise UserError(f"model.py's GPT has no {name} method ({PIECES[name]}), which this analysis calls on its own "
                        f"to start or end partway through the model: an edit renamed it; keep the name {name}") \
            from None


def forward_from(model, layer, x, rotary=None):
    """Every position's logits from blocks.{layer}.hook_resid_pre = x (B, T, C): the blocks' own forward from that
    layer on, then GPT.forward's final norm and head. rotary: the tables model.embed gave the same positions (None
    without rotary positions)."""
    for block in model.transformer.h[layer:]:
        x = block(x, rotary)
    return piece(model, "head")(model.transformer.ln_f(x))


def stream_names(model):
    """The hook points holding the residual stream after the embeddings and after each block."""
    return ["blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(model.config.n_layer))]


def pattern_names(model):
    """The hook points holding each layer's attention weights."""
    return [f"blocks.{i}.attn.hook_pattern" for i in range(model.config.n_layer)]


@torch.no_grad()
def look_inside(model, idx):
    """One forward pass of idx: (the residual stream after the embeddings and after each block, n_layer + 1
    tensors of (B, T, C); every layer's attention weights, n_layer tensors of (B, H, T, T))."""
    if model.config.n_layer == 0:  # a bigram: no block to watch, its stream is the embeddings
        return [piece(model, "embed")(idx)[0]], []
    with caching(model, stream_names(model) + pattern_names(model)) as cache:
        model(idx)
    return [cache[name] for name in stream_names(model)], [cache[name] for name in pattern_names(model)]


def attention_maps(model, idx):
    """Every layer's attention weights for idx, a list of (B, H, T, T) tensors, as the forward pass applies them."""
    return look_inside(model, idx)[1]


def residual_streams(model, idx):
    """The residual stream after the embeddings and after each block: n_layer + 1 tensors of (B, T, C). The pass
    watches the streams alone: an attention without self.hook_pattern (the learner's own module, or the notes'
    averaging loop) still has its text read."""
    if model.config.n_layer == 0:
        return look_inside(model, idx)[0]
    with caching(model, stream_names(model)) as cache:
        model(idx)
    return [cache[name] for name in stream_names(model)]


@torch.no_grad()
def read_out(model, x):
    """What residual-stream vectors x predict next: logits through the final norm and the head."""
    return piece(model, "head")(model.transformer.ln_f(x))


@torch.no_grad()
def logits_everywhere(model, idx):
    """(B, T, V) logits at every position, as the forward pass computes them with targets."""
    return read_out(model, residual_streams(model, idx)[-1])


@torch.no_grad()
def surprise_bits(model, idx, targets):
    """(B, T) surprise of each target, in bits: -log2 of the probability the model gave it after reading idx up
    to its position (targets is idx shifted by one). Their mean, in nats, is the model's loss on them."""
    logp = torch.log_softmax(logits_everywhere(model, idx).float(), dim=-1)
    return -logp.gather(-1, targets[..., None])[..., 0] / math.log(2)


@torch.no_grad()
def logit_lens(model, streams, position):
    """What each residual stream (from residual_streams) at `position` of the first row would predict next:
    n_layer + 1 distributions, each through the final norm and the head; the last is the model's own prediction."""
    return [torch.softmax(read_out(model, s[0, position]).float(), dim=-1) for s in streams]


def token_label(tok, token):
    """A token as a short label a person can read: whitespace drawn as symbols, the bytes of part of a character
    in hex (a byte-level BPE may cut one), a chat model's marker by its name (<|assistant|>)."""
    text = tok.token_label(token)
    name = marker_name(tok, text)
    if name:
        return name
    shown = visible(text)
    return shown if len(shown) <= 12 else shown[:11] + "\u2026"


def attention_of(model, tok, prompt):
    """Every layer's attention weights for prompt (a chat model's markers by their names), as numpy (H, T, T)
    arrays, and a label per token."""
    if model.config.n_layer == 0:
        raise UserError("this model has no attention layers (n_layer=0, a bigram model): there is nothing to draw")
    ids = tok.encode(typed(tok, prompt))
    if not ids:
        raise UserError("the prompt is empty: pass some text with --start")
    if len(ids) > model.config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the model's block_size "
                        f"{model.config.block_size}")
    device = next(model.parameters()).device
    maps = attention_maps(model, torch.tensor([ids], dtype=torch.long, device=device))
    return [m[0].float().cpu().numpy() for m in maps], [token_label(tok, t) for t in ids]
