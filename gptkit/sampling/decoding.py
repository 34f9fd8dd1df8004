"""Decoding: turning a trained GPT into text one token at a time, with a cache of every layer's keys and
values so that each new token costs one position of work, sampling with temperature, top-k and top-p, and
ending at a stop string."""

import inspect
import sys
import weakref

import torch
import torch.nn as nn
from torch.nn import functional as F

from gptkit.base.errors import UserError, first_line
from gptkit.base.modes import evaluating


class KVCache:
    """Every layer's keys and values, preallocated for block_size positions at the first step, so a decode step
    appends in place. Each layer's are shaped as its first keys and values come (heads, and their width), not as
    n_embd // n_head would have them: a learner's model.py may size its heads otherwise, and uniform attention's
    keys have no width."""

    def __init__(self, config, batch_size, device, dtype):
        self.positions, self.dtype = config.block_size, dtype
        self.k_layers, self.v_layers = [None] * config.n_layer, [None] * config.n_layer
        self.pos = 0  # tokens already cached
        # token_shift: each block's last normed inputs (attention's and the MLP's), the next position's predecessors
        start = torch.zeros(batch_size, 1, config.n_embd, device=device, dtype=dtype)
        self.last = [[start, start] for _ in range(config.n_layer)] if config.token_shift else None

    def previous(self, layer, branch, h):
        """The position before h's first in that layer's branch (zeros before the first token), keeping h's last
        for the next call: a view, not a copy, as nothing writes to h after its branch has read it."""
        before, self.last[layer][branch] = self.last[layer][branch], h[:, -1:]
        return before

    def update(self, layer, k, v):
        """Append this step's keys and values; all so far."""
        if self.v_layers[layer] is None:
            self.k_layers[layer], self.v_layers[layer] = (
                torch.zeros((*t.shape[:2], self.positions, t.size(-1)), device=t.device, dtype=self.dtype)
                for t in (k, v))
        t, end = v.size(2), self.pos + v.size(2)
        keys, values = self.k_layers[layer], self.v_layers[layer]
        values.narrow(2, self.pos, t).copy_(v)
        keys.narrow(2, self.pos, t).copy_(k)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)


def weights_dtype(model):
    """The precision the model's weights hold, which the cached keys and values take: read off its parameters, not
    off one named layer, which a learner may rename."""
    return next(model.parameters()).dtype


@torch.no_grad()
def decode_steps(model, idx, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, kv_cache=True, generator=None,
                 vocab_size=None):
    """Yield, for each new token, its (B, 1) column, the (B, V) logits it was sampled from (the first vocab_size
    of them: a vocabulary padded for speed has rows no tokenizer can decode) and the (B, V) distribution
    sampling drew it from (None for greedy decoding, temperature 0).

    When the context outgrows block_size the window slides forward by half a block and is recomputed
    once, so cached and uncached decoding see the same context at every step. A model without the causal
    mask (sees_ahead) recomputes the whole window every step whatever kv_cache says: each new token changes
    what the earlier positions see; so does a model whose cached steps compute other logits than its full pass
    (cache_agrees)."""
    window = model.config.block_size
    kv_cache = kv_cache and not sees_ahead(model) and cache_agrees(model)
    start = max(0, idx.size(1) - window)
    cache = None
    for _ in range(max_new_tokens):
        if idx.size(1) - start > window:
            start = idx.size(1) - max(1, window // 2)  # block_size 1 keeps 1 token
            cache = None
        if start:  # tokens before the window are never read again: kept, each step's cat would copy them all
            idx, start = idx[:, start:], 0
        if not kv_cache:
            logits, _ = model(idx[:, start:])
        elif cache is None:
            cache = KVCache(model.config, idx.size(0), idx.device, weights_dtype(model))
            logits, _ = model(idx[:, start:], cache=cache)
        else:
            logits, _ = model(idx[:, -1:], cache=cache)
        logits = logits[:, -1, :vocab_size]
        next_token, probs = draw_next(logits, temperature, top_k, top_p, generator)
        idx = torch.cat((idx, next_token), dim=1)
        yield next_token, logits, probs


PROBE_TOKENS = 8  # sees_ahead's sequences: one first half, two second halves


@torch.no_grad()
def sees_ahead(model):
    """Whether a position's logits change with the tokens after it: causal=False says so, and a model whose
    settings say causal is asked once (a learner's model.py may have lost its mask by hand): two sequences that
    share their first half, each in a pass of its own of one shape, give that half the same logits bit for bit
    in a causal model, in any precision. Kept for the model's life; asked in eval mode, without dropout's draws."""
    if not model.config.causal:
        return True
    if model not in ASKED:
        T = min(PROBE_TOKENS, model.config.block_size)
        device = next(model.parameters()).device
        one = torch.randint(model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(0)).to(device)
        other = one.clone()
        other[:, T // 2:] = (one[:, T // 2:] + 1) % model.config.vocab_size
        with evaluating(model):
            firsts = [model(idx, idx)[0][:, :T // 2] for idx in (one, other)]
        ASKED[model] = not torch.equal(*firsts)
    return ASKED[model]


ASKED = weakref.WeakKeyDictionary()  # each model's answer to sees_ahead


def why_it_sees_ahead(model):
    """Why a model's positions see the tokens after them, in words for a warning (causal=False, or a model.py whose
    mask an edit took out while the settings say causal); None where they do not."""
    if not sees_ahead(model):
        return None
    if not model.config.causal:
        return "this model was trained without the causal mask (causal=False)"
    return ("model.py's attention lets each position see the tokens after it, though this model's settings say "
            "causal=True (an edit took out or changed the mask)")


@torch.no_grad()
def cache_agrees(model):
    """Whether decoding with the KV cache gives the logits of the model's full pass: a sequence's first half fed at
    once, then each token alone, against one pass over all of it, in the model's own precision (autocast off),
    within what that precision rounds. A learner's edit can part them while training runs as written: ALiBi's
    distances taken from the lengths of q and k, or a mean over the positions a block is given, see one position
    where the cache feeds one; and a GPT.forward written as nanoGPT's takes no cache. Then decoding recomputes the
    window each step, and one note a process says why. Asked once a model, in eval mode."""
    T = min(PROBE_TOKENS, model.config.block_size)
    if model not in AGREES and T >= 2:
        why = None if takes_cache(model) else "model.py's GPT.forward takes no cache"
        why = why or cached_apart(model, T)
        AGREES[model] = why is None
        if why and not NOTED:
            NOTED.append(why)
            print(f"note: {why}: each token is decoded from the whole window instead, as training computes it",
                  file=sys.stderr, flush=True)
    return AGREES.get(model, True)


def takes_cache(model):
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.name == "cache" or p.kind is p.VAR_KEYWORD for p in parameters)


def cached_apart(model, T):
    """Why the cached steps of T tokens part from the full pass, or None where they agree."""
    device = next(model.parameters()).device
    idx = torch.randint(model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(1)).to(device)
    with evaluating(model), torch.autocast(device.type, enabled=False):
        full = model(idx, idx)[0][:, T // 2 - 1:].float()
        cache = KVCache(model.config, 1, device, weights_dtype(model))
        try:
            steps = [model(idx[:, :T // 2], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0]
                                                                 for t in range(T // 2, T)]
        except (RuntimeError, IndexError) as e:  # an edit that takes the keys' length for the queries', say
            return f"model.py's forward fails on the KV cache's one-token steps ({first_line(e)})"
    # float32's rounding, unless its matmuls run in TF32 (a GPU's, as the runtime allows) or the weights are 16-bit
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    rounding = 1e-4 if weights_dtype(model) == torch.float32 and not tf32 else 3e-2
    if (torch.cat(steps, 1).float() - full).abs().max().item() <= rounding * max(1.0, full.abs().max().item()):
        return None
    return "decoding with the KV cache gives other logits than model.py's full pass (an edit that reads positions " \
        "from the tensors' lengths, say)"


AGREES = weakref.WeakKeyDictionary()  # each model's answer to cache_agrees
NOTED = []  # cache_agrees has said its note (a tool's trial copies of a model are asked each)


def generate_stream(model, idx, max_new_tokens, **kwargs):
    """Yield each new (B, 1) column of tokens as it is sampled (the options as for decode_steps)."""
    for next_token, _, _ in decode_steps(model, idx, max_new_tokens, **kwargs):
        yield next_token


def generate(model, idx, max_new_tokens, **kwargs):
    """idx extended by max_new_tokens sampled tokens (the options as for generate_stream)."""
    new = list(generate_stream(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx] + new, dim=1)


# a temperature this small is 0 to float32 (dividing by it gives 0/0): its limit, greedy decoding, is what it means
GREEDY_BELOW = torch.finfo(torch.float32).tiny


def sample_next(logits, temperature=1.0, top_k=0, top_p=1.0, generator=None):
    """One token per row from (B, V) logits; temperature 0 is greedy, top_k 0 and top_p 1 are off."""
    return draw_next(logits, temperature, top_k, top_p, generator)[0]


def draw_next(logits, temperature, top_k, top_p, generator):
    """sample_next's (B, 1) tokens, and the (B, V) distribution they were drawn from (None when greedy)."""
    if temperature < GREEDY_BELOW:
        return logits.argmax(dim=-1, keepdim=True), None
    probs = shaped_probs(logits, temperature, top_k, top_p)
    try:
        return torch.multinomial(probs, num_samples=1, generator=generator), probs
    except RuntimeError:  # checked only when drawing fails: a check each token would cost a wait each token
        if torch.isfinite(logits).all():
            raise
        raise UserError("the model's logits hold NaN or infinity, which no token can be drawn from: model.py "
                        "computes them so (an edit?), or the checkpoint's weights are damaged") from None


def shaped_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    """The (B, V) distribution sampling draws from: the softmax of logits / temperature, kept to the top_k
    likeliest tokens and to the smallest set of them whose probability reaches top_p. Temperature 0 puts all
    of it on the likeliest token."""
    if temperature < GREEDY_BELOW:
        return F.one_hot(logits.argmax(dim=-1), logits.size(-1)).float()
    logits = logits.float()
    if temperature < 1e-3:  # dividing would overflow to inf (and the softmax to nan); the likeliest token is 0
        logits = logits - logits.amax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token when the more likely ones already cover top_p; the first always stays
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        drop[:, 0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return probs


class StopFilter:
    """Pass text through until the stop string appears, holding back what might be its beginning."""

    def __init__(self, stop):
        self.stop, self.pending, self.done = stop, "", False

    def feed(self, text):
        if self.done:
            return ""
        if not self.stop:
            return text
        self.pending += text
        at = self.pending.find(self.stop)
        if at >= 0:
            self.done = True
            out, self.pending = self.pending[:at], ""
            return out
        keep = next((n for n in range(len(self.stop) - 1, 0, -1) if self.pending.endswith(self.stop[:n])), 0)
        out, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        return out

    def flush(self):
        out, self.pending = ("" if self.done else self.pending), ""
        return out


@torch.no_grad()
def lay_out_for_decoding(model):
    """Store every linear weight of model transposed in memory (the same values and shapes): a one-token
    decode step multiplies a row vector by each weight, which CPU kernels stream faster from an (in, out)
    layout. For inference; training prefers the usual layout. Tied weights stay tied: the data moves, the
    parameter stays. Returns the model."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.data = module.weight.data.t().contiguous().t()
    return model
