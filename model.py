"""
A decoder-only transformer (GPT): embeddings, blocks of masked multi-head self-attention and an MLP,
and the loss. Decoding (the KV cache and sampling) lives in gptkit/decoding.py.

The defaults are GPT-2's shape and parameter names (learned positions, LayerNorm, tied head),
without biases; `bias=True, mlp_act='gelu_tanh'` is GPT-2 exactly, so its weights load.
Options switch on the modern pieces that train faster on small data: rotary positions,
RMSNorm, QK-norm, ReLU^2, an untied head, logit soft-capping, zero-initialised projections, and
RWKV's token shift (each block's inputs mixed with the previous position's).

Other options take the model apart, for learning what each piece buys: how attention scores
(scaled or unscaled dot products, Bahdanau's additive scoring, or a plain average of the past),
whether the future is masked (a decoder) or not (an encoder), no positions at all, blocks
without their MLP, and no blocks at all (n_layer=0: a bigram model).

GPTConfig is the one place a model setting is defined: train.py's command line, its --help,
the config parser, checkpoints and validation all read the fields below.
"""

import math
from dataclasses import dataclass, fields
from typing import Literal, get_args, get_origin

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024  # context length: the longest sequence the model sees, in tokens
    vocab_size: int = 50304  # token ids the model knows (GPT-2's 50257 padded to a multiple of 64)
    n_layer: int = 12  # transformer blocks (0: none, a bigram model that sees only the current token)
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width
    dropout: float = 0.0  # dropout on attention weights and residual branches: 0 for pretraining, 0.1+ for small data
    bias: bool = False  # biases in Linear and LayerNorm layers (GPT-2 has them)
    pos_emb: Literal["learned", "rope", "none"] = "learned"  # GPT-2's position table, rotary, or no positions
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # 'layernorm' (GPT-2) or 'rmsnorm'
    qk_norm: bool = False  # normalise queries and keys per head, with the kind of norm set by `norm`
    mlp_act: Literal["gelu", "gelu_tanh", "relu2"] = "gelu"  # exact GELU, GPT-2's tanh approximation, or squared ReLU
    tie_weights: bool = True  # share the token embedding with the output head
    logit_softcap: float = 0.0  # >0: logits = c*tanh(logits/c), smoothly capped at +-c
    zero_init_proj: bool = False  # start every residual output projection at zero
    rope_base: float = 10000.0  # rotary frequency base
    attention: Literal["scaled", "dot", "uniform", "additive"] = "scaled"  # q.k/sqrt(d), q.k, all equal, or v.tanh(q+k)
    causal: bool = True  # mask the future (a decoder); False lets every position see every other (an encoder)
    mlp: bool = True  # a feed-forward MLP after attention in each block; False leaves attention alone
    token_shift: bool = False  # mix each block's normed inputs with the previous position's, a learned share per channel

    def __post_init__(self):
        for f in fields(self):
            choices = get_args(f.type) if get_origin(f.type) is Literal else ()
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {', '.join(choices)} (got {getattr(self, f.name)!r})")
        for name in ("block_size", "vocab_size", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.n_layer < 0:
            raise ValueError(f"n_layer must be at least 0 (got {self.n_layer})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        if self.logit_softcap < 0 or self.rope_base <= 0:
            raise ValueError(f"need logit_softcap >= 0 and rope_base > 0 (got {self.logit_softcap}, {self.rope_base})")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("pos_emb='rope' needs an even head size (n_embd / n_head)")
        if self.attention == "uniform" and (self.qk_norm or self.pos_emb == "rope"):
            raise ValueError("attention='uniform' has no queries or keys: it cannot take qk_norm=True or "
                             "pos_emb='rope' (use pos_emb='learned' or 'none')")
        if self.attention == "additive" and self.pos_emb == "rope":
            raise ValueError("pos_emb='rope' rotates queries and keys for a dot product; attention='additive' "
                             "adds them (use pos_emb='learned' or 'none')")

    @classmethod
    def from_dict(cls, d):
        """The config saved as a dict (e.g. a checkpoint's model_args); keys it does not know are refused,
        since a setting dropped silently would build a different model."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown model settings: {', '.join(unknown)}")
        return cls(**d)


def make_norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


def rotary_tables(head_dim, positions, base):
    """(T, head_dim) cos and sin of each position's angles, each angle repeated for both halves of the pairs
    it rotates and sin negated on the first half, so that apply_rotary costs two multiplies and an add."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x, cos, sin):
    """Rotate each pair (x[i], x[i + D/2]) of the last dimension by its position's angle (cos and sin from
    rotary_tables, broadcast against x)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((x2, x1), dim=-1) * sin.to(x.dtype)


ATTENTION_PATHS = ("fused", "written", "folded")


class SelfAttention(nn.Module):
    """Multi-head self-attention: each position takes a weighted average of the values of the positions it
    sees (the earlier ones and itself when causal, all of them when not), with weights from a softmax over
    scores. `attention` sets the scores: q.k/sqrt(d) (scaled), q.k (dot), Bahdanau's v.tanh(q+k) (additive),
    or none at all, every visible position weighted equally (uniform).

    Scaled and dot scores can take three paths that compute the same function (GPT.set_attention_path):
    SDPA's fused kernels ('fused', never materialising the weights), the weights written out as the notes
    write them ('written', attention_weights) or the same with the scale and mask folded into one matmul
    ('folded', folded_weights); train.py picks the fastest by measuring. The other kinds are always written."""

    def __init__(self, config):
        super().__init__()
        self.kind, self.causal, self.n_head = config.attention, config.causal, config.n_head
        projections = 1 if self.kind == "uniform" else 3  # values only, or queries, keys and values
        self.c_attn = nn.Linear(config.n_embd, projections * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        if self.kind == "additive":  # Bahdanau's v, one per head
            self.score_v = nn.Parameter(torch.randn(config.n_head, config.n_embd // config.n_head) * 0.02)
        # which key each query may see: row t is True up to and including position t (not saved: it is derived)
        self.register_buffer("tril", torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril(),
                             persistent=False)
        self.path = "fused"
        self.attn_dropout = config.dropout
        self.resid_dropout = Dropout(config.dropout)
        self.qk_norm = config.qk_norm
        self.qk_norm_fn = F.rms_norm if config.norm == "rmsnorm" else F.layer_norm

    def qkv(self, x, rotary):
        """(B, H, T, D) queries, keys and values (queries and keys None for uniform attention)."""
        B, T, C = x.size()
        if self.kind == "uniform":
            return None, None, self.c_attn(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        qk, v = qkv.split((2, 1), dim=2)
        # queries and keys normalised and rotated together: on a CPU each small op costs more than its arithmetic
        if self.qk_norm:
            qk = self.qk_norm_fn(qk, (qk.size(-1),))
        if rotary is not None:
            cos, sin = rotary
            qk = apply_rotary(qk, cos[:, None, None, :], sin[:, None, None, :])  # (T, 1, 1, D) against (B, T, 2, H, D)
        q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v.squeeze(2).transpose(1, 2)

    def forward(self, x, rotary=None, cache=None, layer=0):
        """cache: anything with update(layer, k, v) that appends this step's keys and values and returns all
        of them so far (gptkit.decoding.KVCache); the queries are the last T positions of those keys."""
        B, T, C = x.size()
        q, k, v = self.qkv(x, rotary)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = self.attend(q, k, v, T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v, n_queries):
        """Each query's weighted average of the values it sees: (B, H, T, D)."""
        p = self.attn_dropout if self.training else 0.0
        n_keys = v.size(2)
        # SDPA would draw its dropout mask its own way: on a CPU every path draws it with dropout(), so a run's
        # masks do not depend on the path its start-up measured fastest
        fused = self.path == "fused" and not (p and v.device.type == "cpu")
        if self.kind in ("scaled", "dot") and fused:
            mask = None
            if self.causal and 1 < n_queries < n_keys:  # new queries after cached keys (one alone sees them all)
                mask = self.visible(n_queries, n_keys)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                  is_causal=self.causal and n_queries == n_keys,
                                                  scale=None if self.kind == "scaled" else 1.0)
        if self.kind in ("scaled", "dot") and self.path in ("folded", "fused"):
            weights = self.folded_weights(q, k)
        else:
            weights = self.attention_weights(q, k, n_queries, n_keys)
        return dropout(weights, p, self.training) @ v

    def visible(self, n_queries, n_keys):
        """(n_queries, n_keys) booleans, True where a query may look: the queries are the last n_queries
        positions of n_keys, each seeing every key up to and including its own position."""
        return self.tril[n_keys - n_queries:n_keys, :n_keys]

    def attention_weights(self, q, k, n_queries, n_keys):
        """How much each query attends to each key, written out: (B, H, T, S), or (T, S) for uniform."""
        if self.kind == "uniform":  # no scores at all: every visible position counts the same
            scores = torch.zeros(n_queries, n_keys, device=self.tril.device, dtype=self.c_attn.weight.dtype)
        elif self.kind == "additive":  # Bahdanau: v . tanh(q + k), for every pair of a query and a key
            scores = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2)) @ self.score_v[:, None, :, None].to(q.dtype)
            scores = scores.squeeze(-1)
        else:
            scores = q @ k.transpose(-2, -1)
            if self.kind == "scaled":  # keeps the scores' spread near 1 however wide a head is: a softer softmax
                scores = scores * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:  # the future gets -inf, which the softmax turns into a weight of 0
            scores = scores.masked_fill(self.visible(n_queries, n_keys) == 0, float("-inf"))
        return F.softmax(scores, dim=-1)

    def folded_weights(self, q, k):
        """attention_weights for scaled and dot scores, with the scale and the mask folded into one batched
        matmul (the mask as -inf added to the scores): one pass over the (T, S) scores instead of three."""
        B, H, T, D = q.shape
        S = k.size(2)
        mask = torch.zeros(T, S, dtype=q.dtype, device=q.device)
        if self.causal:
            mask = mask.masked_fill(self.visible(T, S) == 0, float("-inf"))
        scale = 1 / math.sqrt(D) if self.kind == "scaled" else 1.0
        scores = torch.baddbmm(mask.expand(B * H, T, S), q.reshape(B * H, T, D), k.reshape(B * H, S, D).transpose(1, 2),
                               alpha=scale)
        return scores.view(B, H, T, S).softmax(dim=-1)


MASK_CHUNK = 1 << 20  # elements of the mask table drawn from one fixed seed
_mask_tables = {}  # (p, dtype) -> the CPU mask table for that dropout rate and precision


def mask_table(p, dtype, size):
    """At least `size` elements, each 0 with probability p (to within 1/32768) or else 1/(1-p), built chunk by
    chunk from fixed seeds: its first elements are the same however large it has grown, and whatever torch's
    generator drew before."""
    table = _mask_tables.get((p, dtype))
    have = 0 if table is None else table.numel()
    if have < size:
        kept, dropped = torch.tensor(1 / (1 - p), dtype=dtype), torch.zeros((), dtype=dtype)
        chunks = [] if table is None else [table]
        for seed in range(have // MASK_CHUNK, -(-size // MASK_CHUNK)):
            seeded = torch.Generator().manual_seed(seed)
            draws = torch.empty(MASK_CHUNK // 4, dtype=torch.int64).random_(generator=seeded)
            bits = draws.view(torch.int16) & 0x7FFF  # four 15-bit draws from each 63 random bits
            chunks.append(torch.where(bits >= round(p * 32768), kept, dropped))
        table = _mask_tables[p, dtype] = torch.cat(chunks)
    return table


def dropout(x, p, training):
    """F.dropout: in training, zero each element with probability p and scale the rest by 1/(1-p).

    On a CPU, drawing a fresh mask (torch's generator runs serially, several ns an element) cost a small model
    as much as its matmuls. Here a mask is a window of a table of random masks at an offset drawn from torch's
    generator: within a window the elements are independent draws, and from one call to the next the window
    moves by a random amount among at least 4M places, so an element dropped in one call is dropped in the
    next with probability p, as with fresh masks. The offset comes from torch's generator (in a compiled
    block, from inductor's, seeded from torch's), so a seed (and a resumed run's restored state) repeats the
    masks."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    n = x.numel()
    span = max(2 * n, 1 << 22)  # the offsets a window can start at: a function of n alone, never of the past
    offset = int(torch.randint(span, ()))
    return x * mask_table(p, x.dtype, span + n)[offset:offset + n].view(x.shape)


class Dropout(nn.Module):
    """nn.Dropout, through dropout() above."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return dropout(x, self.p, self.training)


def token_shift(h, share, before=None):
    """RWKV's token shift: each position of h (B, T, C) mixed with the position before it, h[t] + share * (h[t-1]
    - h[t]), a learned share per channel. The first position's predecessor is `before` (B, 1, C), the last one
    of the chunk before (gptkit.decoding.KVCache), or zeros at the start of a window, as in training.

    A character-level model learns most from the character just before: attention has to learn to look one
    position back; the shift hands every block that position directly, for a few element-wise operations."""
    if before is None:
        previous = F.pad(h[:, :-1], (0, 0, 1, 0))
    else:
        previous = torch.cat((before.to(h.dtype), h[:, :-1]), dim=1)
    return torch.lerp(h, previous, share.to(h.dtype))


class ReLUSquared(torch.autograd.Function):
    """relu(x)^2 with one kernel each way past the relu: autograd through relu(x).square() runs four more
    element-wise kernels, a noticeable share of an eager CPU step for a small model. The backward's
    2 * grad * r is one addcmul onto a zero: grad * (r + r) took two passes (0.41 against 0.24 ms
    on the default's MLP activations in bf16 on a 2-core EPYC)."""

    @staticmethod
    def forward(ctx, x):
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return torch.addcmul(grad.new_zeros(()), grad, r, value=2)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)
        self.act = config.mlp_act

    def forward(self, x):
        x = self.c_fc(x)
        if self.act == "relu2":
            x = ReLUSquared.apply(x)
        else:  # GPT-2's weights were trained with the tanh approximation
            x = F.gelu(x, approximate="tanh" if self.act == "gelu_tanh" else "none")
        return self.dropout(self.c_proj(x))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = SelfAttention(config)
        if config.mlp:
            self.ln_2 = make_norm(config)
            self.mlp = MLP(config)
        # token_shift's shares start at half and half: paired at equal steps, a start at 0 (no shift) ended higher
        self.shares = nn.ParameterList(nn.Parameter(torch.full((config.n_embd,), 0.5))
                                       for _ in range((1 + config.mlp) if config.token_shift else 0))

    def branch_input(self, x, branch, cache=None, layer=0):
        """What a branch (0: attention, 1: the MLP) reads: the normed stream, token-shifted when the model is."""
        h = (self.ln_2 if branch else self.ln_1)(x)
        if not self.shares:
            return h
        if torch.is_autocast_enabled(h.device.type):
            # autocast leaves the norm's output in fp32 and casts it at the branch's first matmul anyway: cast first
            # and the shift moves half the bytes each way: the default's eager bf16 CPU step 0.6-3.6% faster, loss level
            h = h.to(torch.get_autocast_dtype(h.device.type))
        return token_shift(h, self.shares[branch], cache.previous(layer, branch, h) if cache is not None else None)

    def attention_input(self, x, cache=None, layer=0):
        return self.branch_input(x, 0, cache, layer)

    def forward(self, x, rotary=None, cache=None, layer=0):
        x = x + self.attn(self.attention_input(x, cache, layer), rotary, cache, layer)
        if hasattr(self, "mlp"):
            x = x + self.mlp(self.branch_input(x, 1, cache, layer))
        return x


class TokenLoss(nn.Module):
    """The mean cross-entropy of logits against targets (-1: not scored), in float32. A module of its own so
    that it can be compiled alone (runtime.compile_blocks): compiled on a GPU, the float32 copy of a large
    vocabulary's logits never reaches memory."""

    def forward(self, logits, targets):
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        modules = dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        )
        if config.pos_emb == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
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

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def embed(self, idx, first_position=0):
        """Token (and learned position) embeddings of idx, whose first token sits at first_position;
        and the rotary tables for those positions (None without rotary positions)."""
        T = idx.size(1)
        if first_position + T > self.config.block_size:
            raise ValueError(f"sequence of {first_position + T} tokens is longer than block_size "
                             f"{self.config.block_size}")
        x = self.transformer.wte(idx)
        positions = torch.arange(first_position, first_position + T, device=idx.device)
        rotary = None
        if self.config.pos_emb == "learned":
            x = x + self.transformer.wpe(positions)
        elif self.config.pos_emb == "rope":
            rotary = rotary_tables(self.config.n_embd // self.config.n_head, positions, self.config.rope_base)
        return self.transformer.drop(x), rotary

    def forward(self, idx, targets=None, cache=None):
        """Logits for every position (or the last one, without targets); loss when targets are given.
        With a cache (see SelfAttention.forward), idx continues the tokens already cached."""
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

    def set_attention_path(self, path):
        """How scaled and dot attention is computed: 'fused', 'written' or 'folded' (see SelfAttention);
        all three compute the same function."""
        if path not in ATTENTION_PATHS:
            raise ValueError(f"attention path must be one of {', '.join(ATTENTION_PATHS)} (got {path!r})")
        for block in self.transformer.h:
            block.attn.path = path

    def crop_block_size(self, block_size):
        """Shrink the context length, e.g. to finetune a pretrained model on shorter windows."""
        if block_size > self.config.block_size:
            raise ValueError(f"block_size {block_size} exceeds the model's {self.config.block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
