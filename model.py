"""
A decoder-only transformer (GPT): embeddings, blocks of masked multi-head self-attention and an MLP,
and the loss.

The defaults are GPT-2's shape and parameter names; `bias=True, mlp_act='gelu_tanh'` is GPT-2
exactly, so its weights load. Options switch on modern pieces (rotary positions, RMSNorm, QK-norm,
ReLU^2, an untied head, logit soft-capping, zero-initialised projections, RWKV's token shift) or
take the model apart: how attention scores (scaled or plain dot products, Bahdanau's additive
scoring, a plain average of the past), a decoder or an encoder (causal), no positions, no MLP, no
blocks at all (n_layer=0: a bigram model). lora_rank > 0 fine-tunes low-rank adapters (LoRA) on
frozen matrices: attention's q, k, v, the MLP's first, the token table and the head; merge_lora
folds them back into plain weights.

Hook points sit where a learner looks (gptkit/interp/hooks.py names them as TransformerLens does).
Decoding lives in gptkit/sampling/decoding.py; speed kernels stand in for some pieces here while
unedited: gptkit/machine/stand_ins.py.
"""

import math
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Literal, get_args, get_origin

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024  # context length: the longest sequence the model sees, in tokens
    vocab_size: int = 50304  # token ids the model knows (GPT-2's 50257 padded to a multiple of 64)
    n_layer: int = 12  # transformer blocks (0: a bigram model that sees only the current token)
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width
    dropout: float = 0.0  # attention and residual dropout: 0 to pretrain, 0.1+ on small data
    bias: bool = False  # biases in Linear and LayerNorm layers (GPT-2 has them)
    pos_emb: Literal["learned", "rope", "none"] = "learned"  # GPT-2's position table, rotary, or no positions
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # 'layernorm' (GPT-2) or 'rmsnorm'
    qk_norm: bool = False  # normalise queries and keys per head (the kind of norm `norm` sets)
    mlp_act: Literal["gelu", "gelu_tanh", "relu2"] = "gelu"  # exact GELU, GPT-2's tanh approximation, or squared ReLU
    tie_weights: bool = True  # share the token embedding with the output head
    logit_softcap: float = 0.0  # >0: logits = c*tanh(logits/c), smoothly capped at +-c
    zero_init_proj: bool = False  # start every residual output projection at zero
    rope_base: float = 10000.0  # rotary frequency base
    attention: Literal["scaled", "dot", "uniform", "additive"] = "scaled"  # q.k/sqrt(d), q.k, all equal, or v.tanh(q+k)
    causal: bool = True  # mask the future (a decoder); False: each position sees all (an encoder)
    mlp: bool = True  # a feed-forward MLP after attention in each block; False: attention alone
    token_shift: bool = False  # mix each block's normed inputs with the previous position's, a learned share each
    lora_rank: int = 0  # >0: LoRA, low-rank adapters of this rank on frozen matrices (LoRALinear)
    lora_alpha: float = 16.0  # LoRA's adapters are scaled by lora_alpha / lora_rank

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            choices = get_args(f.type) if get_origin(f.type) is Literal else ()
            if choices and value not in choices:
                raise ValueError(f"{f.name} must be one of {', '.join(choices)} (got {value!r})")
            if f.type is float and not math.isfinite(value):  # a config file cannot give inf; an edited checkpoint can
                raise ValueError(f"{f.name} must be a finite number (got {value})")
        for name in ("block_size", "vocab_size", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.n_layer < 0:
            raise ValueError(f"n_layer must be at least 0 (got {self.n_layer})")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be at least 0 (got {self.lora_rank})")
        if self.lora_rank > self.n_embd:
            raise ValueError(f"lora_rank {self.lora_rank} is larger than the width "
                             f"n_embd={self.n_embd}: an adapter of full rank is the matrix itself")
        if self.lora_rank and self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be above 0 (got {self.lora_alpha})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        if self.logit_softcap < 0 or self.rope_base <= 0:
            raise ValueError(f"need logit_softcap >= 0 and rope_base > 0 (got {self.logit_softcap}, {self.rope_base})")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("pos_emb='rope' needs an even head size (n_embd / n_head)")
        if self.attention == "uniform" and (self.qk_norm or self.pos_emb == "rope"):
            raise ValueError(
                "attention='uniform' has no queries or keys: it cannot take qk_norm=True or "
                "pos_emb='rope' (use pos_emb='learned' or 'none')")
        if self.attention == "additive" and self.pos_emb == "rope":
            raise ValueError(
                "pos_emb='rope' rotates queries and keys for a dot product; attention='additive' "
                "adds them (use pos_emb='learned' or 'none')")

    def describe(self):
        """The model in words, as the explorer lists a run: '4 layers, 4 heads, width 128, scaled
        dot-product attention, causal (a decoder), rotary positions, context 256'. A value these
        words lack is named as it is set (pos_emb='sinusoidal')."""
        if self.n_layer == 0:
            return f"a bigram table: no attention, width {self.n_embd}"
        words = [f"{self.n_layer} layer{'s' * (self.n_layer > 1)}",
                 f"{self.n_head} head{'s' * (self.n_head > 1)}", f"width {self.n_embd}",
                 *(WORDS[name].get(getattr(self, name), f"{name}={getattr(self, name)!r}")
                   for name in WORDS),
                 f"context {self.block_size}"]
        # a setting added since (a learner's new option) is named where it is not at its default
        added = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name not in WORDS
                 and f.name not in UNWORDED and getattr(self, f.name) != f.default]
        return ", ".join(words + ([] if self.mlp else ["no MLP"]) + added)


WORDS = {  # GPTConfig.describe's words for the choices a learner compares
    "attention": {"scaled": "scaled dot-product attention",
                  "dot": "dot-product attention without the 1/√d scale",
                  "uniform": "uniform attention (an average of the past)",
                  "additive": "additive (Bahdanau) attention"},
    "causal": {True: "causal (a decoder)", False: "not causal (an encoder)"},
    "pos_emb": {"learned": "learned positions", "rope": "rotary positions", "none": "no positions"},
}


# the settings describe() leaves to a run's details: its shape above, and the modern pieces
UNWORDED = {"block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "norm",
            "qk_norm", "mlp_act", "tie_weights", "logit_softcap", "zero_init_proj", "rope_base", "mlp",
            "token_shift", "lora_rank", "lora_alpha"}


def count_params(weights, config, non_embedding=True):
    """The parameters among weights ({name: tensor}: a model's, or a checkpoint's state dict), each
    once: a tied head is the token table; without the learned position table where non_embedding."""
    n = sum(t.numel() for t in weights.values())
    if config.tie_weights and "lm_head.weight" in weights:
        n -= weights["lm_head.weight"].numel()
    if non_embedding and "transformer.wpe.weight" in weights:
        n -= weights["transformer.wpe.weight"].numel()
    return n


class HookPoint(nn.Module):
    """An identity: it hands back what it is given, so that a forward hook on it
    (register_forward_hook) sees the activation there, and may return a replacement
    (TransformerLens's HookPoint)."""

    def __call__(self, x):
        # nn.Module's call costs microseconds, and decoding passes about 40 of these a token;
        # the test is `hooked`, inlined
        return super().__call__(x) if self._forward_hooks or self._forward_pre_hooks else x

    def forward(self, x):
        return x

    @property
    def hooked(self):
        return bool(self._forward_hooks or self._forward_pre_hooks)


def layer_norm(x, norm):
    # nn.LayerNorm's default eps. The gain (and bias) applied apart from torch's fused kernel, which sums their
    # gradients in an order that depends on the CPU threads: a run whose thread count follows the machine's load
    # then ends with the weights of one that never changed (docs/reliability.md#the-promises)
    x = F.layer_norm(x, norm.weight.shape, eps=1e-5) * norm.weight
    return x if norm.bias is None else x + norm.bias


def rms_norm(x, norm):
    # nn.RMSNorm's default eps: the dtype's own
    return F.rms_norm(x, norm.weight.shape, norm.weight)


class Norm(nn.Module):
    """LayerNorm (centre each position's vector, divide by its spread, then a learned gain) or
    RMSNorm (no centring, no bias). hook_scale sees the divisor, [batch, pos, 1]; hooked, the norm
    is written out to compute it."""

    def __init__(self, config):
        super().__init__()
        self.centred = config.norm == "layernorm"
        self.weight = nn.Parameter(torch.ones(config.n_embd))
        self.bias = nn.Parameter(torch.zeros(config.n_embd)) if self.centred and config.bias \
            else None
        self.normalize = layer_norm if self.centred else rms_norm
        self.hook_scale = HookPoint()

    def forward(self, x):
        if not self.hook_scale.hooked:
            return self.normalize(x, self)
        if self.centred:
            x = x - x.mean(-1, keepdim=True)
        eps = 1e-5 if self.centred else torch.finfo(x.dtype).eps
        x = x / self.hook_scale((x.pow(2).mean(-1, keepdim=True) + eps).sqrt()) * self.weight
        return x if self.bias is None else x + self.bias


def dropout(p):
    """nn.Dropout, or an identity where p is 0: nn.Dropout's call costs microseconds even when it
    drops nothing, and decoding passes about a dozen a token."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def rotary_tables(head_dim, positions, base):
    """(T, head_dim) cos and sin of each position's angles, repeated for both halves of the pairs
    they rotate, sin negated on the first half: apply_rotary is then two multiplies and an add."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                            device=positions.device) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x, cos, sin):
    """Rotate each pair (x[i], x[i + D/2]) of the last dimension by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((x2, x1), dim=-1) * sin.to(x.dtype)


def dot_scores(attn, q, k):
    """q.k for every query and key: (B, H, T, S). Uniform attention's queries and keys have no
    width: all 0."""
    return q @ k.transpose(-2, -1)


def scaled_scores(attn, q, k):
    """q.k / sqrt(d): the scale keeps the scores' spread near 1 however wide a head is, a softer
    softmax."""
    return dot_scores(attn, q, k) * (1.0 / math.sqrt(k.size(-1)))


def additive_scores(attn, q, k):
    """Bahdanau's v . tanh(q + k), for every pair of a query and a key, a v per head."""
    return (torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))
            @ attn.score_v[:, None, :, None].to(q.dtype)).squeeze(-1)


SCORES = {"scaled": scaled_scores, "dot": dot_scores, "uniform": dot_scores,
          "additive": additive_scores}


class LoRALinear(nn.Linear):
    """nn.Linear plus a low-rank update it learns while its own weight stays frozen (LoRA, Hu et
    al. 2021): a fine-tune trains r * (in + out) numbers per matrix instead of in * out."""

    def __init__(self, in_features, out_features, bias, rank, alpha):
        super().__init__(in_features, out_features, bias=bias)
        # α/r: the update's size does not change with the rank chosen, so neither does a good rate
        self.scale = alpha / rank
        # A as nn.Linear draws its weights (Hu et al.'s code does too): x Aᵀ keeps about the
        # spread of x whatever the width. B at zero: the update is 0, so step 0 is the base model
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))

    def forward(self, x):
        # y = x (W + (α/r)·B A)ᵀ + b: the update folded into the matrix, one product over the
        # tokens. (Through the narrow r, x Aᵀ Bᵀ, B's gradient is a sum over every token into r
        # columns, which bfloat16's CPU kernels sum in another order on 2 threads than on 1, and
        # a run would follow the machine's load.) With B zero the matrix is W exactly
        return F.linear(x, self.weight + self.scale * (self.lora_B @ self.lora_A), self.bias)

    @torch.no_grad()
    def merged(self):
        """The plain matrix this layer computes, read off forward: a linear map's matrix is what
        it does to each basis vector (the identity's rows), so an edit to forward merges as
        written. A forward no matrix and bias compute is refused (ValueError)."""
        n, like = self.in_features, dict(dtype=self.weight.dtype, device=self.weight.device)
        # one pass: the basis vectors, 0 (whose output is the bias) and random inputs to check, drawn
        # from a generator of their own (loading a model leaves torch's seeded draws as they were)
        draws = torch.Generator(device=self.weight.device).manual_seed(0)
        x = torch.cat([torch.eye(n, **like), torch.zeros(1, n, **like),
                       torch.randn(4, n, generator=draws, **like)])
        y = self(x)
        offset, matrix = y[n], (y[:n] - y[n]).T
        bias = self.bias if self.bias is not None else torch.zeros_like(offset)
        if not (torch.allclose(y[n + 1:], x[n + 1:] @ matrix.T + offset, rtol=1e-4, atol=1e-5)
                and torch.allclose(offset, bias, atol=1e-6)):
            raise ValueError("LoRALinear.forward is not a matrix times its input plus the bias, "
                             "so no plain matrix computes it")
        return matrix

    def extra_repr(self):
        return f"{super().extra_repr()}, rank={self.lora_A.size(0)}, scale={self.scale:g}"


class LoRAEmbedding(nn.Embedding):
    """nn.Embedding plus a low-rank update of its table, W + (α/r)·B A, as LoRALinear's: token t's
    row moves by (α/r)·B[t] A, r numbers of its own (B's row) times r directions all rows share
    (A's rows). A chat fine-tune adds tokens (its markers, digits) whose rows start untrained:
    this is how they learn while the table stays frozen."""

    def __init__(self, num_embeddings, embedding_dim, rank, alpha):
        super().__init__(num_embeddings, embedding_dim)
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, embedding_dim))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(num_embeddings, rank))  # zero: step 0 is the base

    def forward(self, idx):
        # the update folded into the table, as LoRALinear folds it into its matrix
        return F.embedding(idx, self.weight + self.scale * (self.lora_B @ self.lora_A))

    @torch.no_grad()
    def merged(self):
        """The plain table this layer looks up: its forward on every token, as written."""
        return self(torch.arange(self.num_embeddings, device=self.weight.device))

    def extra_repr(self):
        return f"{super().extra_repr()}, rank={self.lora_A.size(0)}, scale={self.scale:g}"


def linear(config, in_features, out_features, adapted=True):
    """One of a block's weight matrices: nn.Linear, or with lora_rank > 0 and adapted a
    LoRALinear. The matrices that read the residual stream (attention's q, k, v, the MLP's first)
    are adapted, and those that write back into it are not: a rank-8 fine-tune of the 128-wide
    default then trains under 5% of it (docs/chat.md#lora)."""
    if config.lora_rank > 0 and adapted:
        return LoRALinear(in_features, out_features, config.bias, config.lora_rank,
                          config.lora_alpha)
    return nn.Linear(in_features, out_features, bias=config.bias)


def merge_lora(weights, config):
    """(weights, config) with LoRA's adapters folded into the matrices they adapt: each W becomes
    what its layer computes, W + (α/r)·B A as written above (in float32, then W's dtype), the
    adapters' keys go and lora_rank becomes 0. A plain model then computes what the adapted one
    did. Without adapters: the inputs, unchanged."""
    if config.lora_rank == 0:
        return weights, config
    lora = (config.lora_rank, config.lora_alpha)
    merged = {name: t for name, t in weights.items() if not name.endswith((".lora_A", ".lora_B"))}
    for name in [n.removesuffix(".lora_A") for n in weights if n.endswith(".lora_A")]:
        own = {key.removeprefix(f"{name}."): t.float() for key, t in weights.items() if key.startswith(f"{name}.")}
        rows, cols = own["weight"].shape
        layer = (LoRAEmbedding(rows, cols, *lora) if name == "transformer.wte" else  # as GPT builds them
                 LoRALinear(cols, rows, "bias" in own, *lora))
        layer.load_state_dict(own, assign=True)
        # read off in eval mode, as a trained model runs: a dropout on the adapter's input is off
        merged[f"{name}.weight"] = layer.eval().merged().to(weights[f"{name}.weight"].dtype)
    return merged, replace(config, lora_rank=0)


class SelfAttention(nn.Module):
    """Multi-head self-attention: each position takes a weighted average of the values of the
    positions it sees (the earlier ones and itself when causal, all of them when not), weighted by a
    softmax over scores.

    Scaled and dot scores run through SDPA's fused kernel, which computes the same function without
    writing the weights out; a hook on the scores or the pattern makes this pass write them out
    (`written`)."""

    def __init__(self, config):
        super().__init__()
        self.kind, self.causal, self.n_head = config.attention, config.causal, config.n_head
        # values only: no queries or keys, so every score is 0
        uniform = config.attention == "uniform"
        self.c_attn = linear(config, config.n_embd, (1 if uniform else 3) * config.n_embd)
        self.c_proj = linear(config, config.n_embd, config.n_embd, adapted=False)
        if config.attention == "additive":  # Bahdanau's v, one per head
            self.score_v = nn.Parameter(
                torch.randn(config.n_head, config.n_embd // config.n_head) * 0.02)
        self.score = SCORES[config.attention]
        self.attend = self.sdpa if config.attention in ("scaled", "dot") else self.written
        # SDPA's scale (None: its 1/sqrt(d)), what the score function gives; the written path reads the score
        # function's own
        self.scale = None if config.attention == "scaled" else 1.0
        head_norm = F.rms_norm if config.norm == "rmsnorm" else F.layer_norm
        self.qk_norm = (lambda x: head_norm(x, (x.size(-1),))) if config.qk_norm else (lambda x: x)
        # which key each query may see: row t is True up to and including position t
        # (not saved: it is derived)
        self.register_buffer(
            "tril", torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril(),
            persistent=False)
        self.dropout_p = config.dropout
        self.attn_dropout, self.resid_dropout = dropout(config.dropout), dropout(config.dropout)
        for name in ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"):
            setattr(self, name, HookPoint())

    def forward(self, x, rotary=None, cache=None, layer=0):
        """cache: anything with update(layer, k, v) that appends this step's keys and values and
        returns all of them so far (gptkit.sampling.decoding.KVCache); the queries are the last T
        positions of those keys."""
        B, T, C = x.size()
        q, k, v = self.project(x, rotary)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        watched = self.hook_attn_scores.hooked or self.hook_pattern.hooked
        y = self.written(q, k, v) if watched else self.attend(q, k, v)
        z = self.hook_z(y.transpose(1, 2))  # (B, T, H, D): each head's output
        return self.resid_dropout(self.c_proj(z.reshape(B, T, C)))

    def project(self, x, rotary):
        """Queries, keys and values, each (B, H, T, D); the hooks see them as
        [batch, pos, head, d_head]."""
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, -1, self.n_head, C // self.n_head)
        qk, v = qkv[:, :, :-1], qkv[:, :, -1]
        # queries and keys normed and rotated together: one op each on a CPU, not two
        qk = self.qk_norm(qk)
        if rotary is not None:
            cos, sin = rotary
            # (T, 1, 1, D) against (B, T, 2, H, D)
            qk = apply_rotary(qk, cos[:, None, None, :], sin[:, None, None, :])
        if qk.size(2) == 0:  # uniform attention: queries and keys of no width
            qk = v[:, :, None, :, :0].expand(B, T, 2, -1, -1)
        q, k, v = self.hook_q(qk[:, :, 0]), self.hook_k(qk[:, :, 1]), self.hook_v(v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def sdpa(self, q, k, v):
        """The written-out attention below in one fused kernel (the weights are never
        materialised)."""
        n_queries, n_keys = q.size(2), k.size(2)
        mask = self.visible(n_queries, n_keys) if self.causal and 1 < n_queries < n_keys else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                              dropout_p=self.dropout_p if self.training else 0.0,
                                              is_causal=self.causal and n_queries == n_keys)

    def written(self, q, k, v):
        """softmax(scores, with the future masked) . v, as the notes write it: (B, H, T, D)."""
        return self.attn_dropout(self.pattern(q, k)) @ v

    def pattern(self, q, k):
        """How much each query attends to each key: (B, H, T, S) weights after the softmax."""
        scores = self.score(self, q, k)
        if self.causal:  # the future gets -inf, which the softmax turns into a weight of 0
            scores = scores.masked_fill(~self.visible(q.size(2), k.size(2)), float("-inf"))
        return self.hook_pattern(F.softmax(self.hook_attn_scores(scores), dim=-1))

    def visible(self, n_queries, n_keys):
        """(n_queries, n_keys) booleans, True where a query may look: the queries are the last
        n_queries positions of n_keys, each seeing every key up to and including its own
        position."""
        return self.tril[n_keys - n_queries:n_keys, :n_keys]


def relu_squared(x):
    return F.relu(x).square()


# functions, not modules: a module's call costs microseconds, which decoding pays every layer of
# every token
ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": partial(F.gelu, approximate="tanh"),
               "relu2": relu_squared}


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = linear(config, config.n_embd, 4 * config.n_embd)
        # GPT-2's weights were trained with the tanh approximation
        self.act = ACTIVATIONS[config.mlp_act]
        self.c_proj = linear(config, 4 * config.n_embd, config.n_embd, adapted=False)
        self.dropout = dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


def token_shift(h, share, before=None):
    """RWKV's token shift: each position of h (B, T, C) mixed with the one before,
    h[t] + share * (h[t-1] - h[t]), a learned share per channel; the first position's predecessor
    is `before` (the KV cache's) or zeros. A character-level model learns most from the character
    just before, which attention must learn to find."""
    previous = F.pad(h[:, :-1], (0, 0, 1, 0)) if before is None \
        else torch.cat((before.to(h.dtype), h[:, :-1]), 1)
    return torch.lerp(h, previous, share.to(h.dtype))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hook_resid_pre, self.ln_1, self.attn = HookPoint(), Norm(config), SelfAttention(config)
        # an attention-only block has no MLP, nor what goes with it
        self.hook_attn_out, self.mlp = HookPoint(), None
        if config.mlp:
            self.hook_resid_mid, self.ln_2, self.mlp = HookPoint(), Norm(config), MLP(config)
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()
        self.shift = token_shift if config.token_shift else None
        # token_shift's shares start at half and half, not at 0 (no shift); why:
        # docs/speed.md#what-was-tried
        self.shares = nn.ParameterList(
            nn.Parameter(torch.full((config.n_embd,), 0.5))
            for _ in range((1 + config.mlp) if config.token_shift else 0))

    def forward(self, x, rotary=None, cache=None, layer=0):
        x = self.hook_resid_pre(x)
        x = x + self.hook_attn_out(self.attn(self.branch_input(x, 0, cache, layer),
                                             rotary, cache, layer))
        if self.mlp is not None:
            x = self.hook_resid_mid(x)
            x = x + self.hook_mlp_out(self.mlp(self.branch_input(x, 1, cache, layer)))
        return self.hook_resid_post(x)

    def branch_input(self, x, branch, cache=None, layer=0):
        """What a branch (0: attention, 1: the MLP) reads: the normed stream, token-shifted when the
        model is."""
        h = (self.ln_2 if branch else self.ln_1)(x)
        if self.shift is None:
            return h
        return self.shift(h, self.shares[branch],
                          cache.previous(layer, branch, h) if cache is not None else None)


class TokenLoss(nn.Module):
    """The mean cross-entropy of logits against targets (-1: not scored), in float32; a module so
    that it can be compiled alone (on a GPU the float32 copy of a large vocabulary's logits then
    never reaches memory)."""

    def forward(self, logits, targets):
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-1)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hook_embed = HookPoint()
        if config.lora_rank and config.tie_weights:  # checked here: a fine-tune's shape is its base's
            raise ValueError("lora_rank needs an untied head (tie_weights=False): the token table and "
                             "the head each learn their own adapter")
        lora = config.lora_rank, config.lora_alpha
        wte = (LoRAEmbedding(config.vocab_size, config.n_embd, *lora) if config.lora_rank
               else nn.Embedding(config.vocab_size, config.n_embd))
        modules = dict(wte=wte,
                       drop=dropout(config.dropout),
                       h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                       ln_f=Norm(config))
        if config.pos_emb == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
            self.hook_pos_embed = HookPoint()
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = (LoRALinear(config.n_embd, config.vocab_size, False, *lora) if config.lora_rank
                        else nn.Linear(config.n_embd, config.vocab_size, bias=False))
        if config.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight
        self.token_loss = TokenLoss()
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if config.zero_init_proj:
                    nn.init.zeros_(p)
                else:  # GPT-2's scaled init of residual projections
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * max(1, config.n_layer)))
        if config.lora_rank > 0:
            self.freeze_all_but_adapters()

    def _init_weights(self, module):
        # a LoRALinear's weight and bias are drawn here as a plain one's; its adapters keep their
        # own init (B must stay zero)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def configure_optimizers(self, cfg, dtype="float32"):
        """The optimizers that train this model (one, or a list), from the training config: AdamW
        over everything, or with optimizer='muon' Muon over the blocks' weight matrices and AdamW
        over the rest. Parameters are grouped by what they are: embedding tables get their own rate
        (embedding_lr: a step moves only the rows of the tokens it saw); matrices decay, biases and
        gains do not. train.py's schedule, clipping and EMA work with whatever this returns:
        `return torch.optim.SGD(self.parameters(), lr=0.1)` trains with SGD (torch.optim's
        optimizers are slower to start than these, docs/speed.md)."""
        from gptkit.optim.optimizers import AdamW, Muon  # torch.optim's, faster (see there)

        params = [p for p in self.parameters() if p.requires_grad]
        embeddings = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        # with LoRA these weights are frozen, so none reaches Muon: the adapters are no full
        # matrices of the model and go to AdamW's decayed matrices (decay pulls the update towards
        # the base model)
        block_matrices = {id(m.weight) for m in self.transformer.h.modules()
                          if isinstance(m, nn.Linear)}
        muon = [p for p in params if cfg.optimizer == "muon" and id(p) in block_matrices]
        rest = [p for p in params if not (cfg.optimizer == "muon" and id(p) in block_matrices)]
        groups = [{"params": [p for p in rest if id(p) in embeddings],
                   "weight_decay": cfg.weight_decay, "lr": cfg.embedding_lr or cfg.learning_rate},
                  {"params": [p for p in rest if p.ndim >= 2 and id(p) not in embeddings],
                   "weight_decay": cfg.weight_decay},
                  {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        optimizers = [AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))]
        if muon:  # Newton-Schulz in bfloat16 where the run trains in it, else in float32
            optimizers.append(Muon(
                muon, lr=cfg.muon_lr, momentum=cfg.muon_momentum,
                weight_decay=cfg.muon_weight_decay,
                ns_dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32))
        return optimizers

    def freeze_all_but_adapters(self):
        """LoRA's freeze: only the adapters train; every weight of the base model stays as it was."""
        for name, p in self.named_parameters():
            p.requires_grad_(name.endswith((".lora_A", ".lora_B")))

    def trainable_params(self):
        """How many parameters a step trains (those with requires_grad, a tied head once): all of
        them, or with LoRA the adapters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def num_params(self, non_embedding=True):
        return count_params(dict(self.named_parameters(remove_duplicate=False)), self.config,
                            non_embedding)

    def flops_per_token(self, seq_len):
        """Training FLOPs per token, for MFU (PaLM appendix B, as nanoGPT's estimate_mfu): 6 for
        each weight a token is multiplied by (2 forward, 4 backward), the head's included and the
        embedding tables' not (they are looked up), plus attention's products over seq_len keys in
        each of n_embd channels: two (scores and values), one for uniform attention (values only),
        about three for additive (the sum and tanh of q+k, the product with v, the values)."""
        c = self.config
        tables = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))
        head = self.lm_head.weight.numel() if c.tie_weights else 0  # a tied head is a table too
        products = {"uniform": 1, "additive": 3}.get(c.attention, 2)
        return 6 * (sum(p.numel() for p in self.parameters()) - tables + head) + \
            6 * products * c.n_layer * c.n_embd * seq_len

    def embed(self, idx, first_position=0):
        """Token (and learned position) embeddings of idx, whose first token sits at first_position;
        and the rotary tables for those positions (None without rotary positions)."""
        B, T = idx.size()
        if first_position + T > self.config.block_size:
            raise ValueError(f"sequence of {first_position + T} tokens is longer than block_size "
                             f"{self.config.block_size}")
        x = self.hook_embed(self.transformer.wte(idx))
        positions = torch.arange(first_position, first_position + T, device=idx.device)
        rotary = None
        if self.config.pos_emb == "learned":
            x = x + self.hook_pos_embed(self.transformer.wpe(positions).expand(B, T, -1))
        elif self.config.pos_emb == "rope":
            rotary = rotary_tables(self.config.n_embd // self.config.n_head, positions,
                                   self.config.rope_base)
        return self.transformer.drop(x), rotary

    def forward(self, idx, targets=None, cache=None):
        """Logits for every position (or the last one, without targets); loss when targets are
        given. With a cache (see SelfAttention.forward), idx continues the tokens already cached."""
        first_position = cache.pos if cache is not None else 0
        x, rotary = self.embed(idx, first_position)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rotary, cache, i)
        if cache is not None:
            cache.pos += idx.size(1)
        x = self.transformer.ln_f(x)
        if targets is None:
            x = x[:, -1:, :]  # a view; [-1] as a list would gather a copy
        logits = self.head(x)
        if targets is None:
            return logits, None
        return logits, self.token_loss(logits, targets)

    def head(self, x):
        """Logits from the final-normed residual stream (soft-capped when logit_softcap is set)."""
        logits = self.lm_head(x)
        if self.config.logit_softcap > 0:
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits.float() / c)
        return logits
