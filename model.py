"""
A decoder-only transformer (GPT) and its sampler.

The defaults are GPT-2's shape and parameter names (learned positions, LayerNorm, tied head),
without biases; `bias=True, mlp_act='gelu_tanh'` is GPT-2 exactly, so its weights load.
Options switch on the modern pieces that train faster on small data: rotary positions,
RMSNorm, QK-norm, ReLU^2, an untied head, logit soft-capping and zero-initialised projections.

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
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width
    dropout: float = 0.0  # dropout on attention weights and residual branches: 0 for pretraining, 0.1+ for small data
    bias: bool = False  # biases in Linear and LayerNorm layers (GPT-2 has them)
    pos_emb: Literal["learned", "rope"] = "learned"  # 'learned' (GPT-2's position table) or 'rope' (rotary)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # 'layernorm' (GPT-2) or 'rmsnorm'
    qk_norm: bool = False  # normalise queries and keys per head, with the kind of norm set by `norm`
    mlp_act: Literal["gelu", "gelu_tanh", "relu2"] = "gelu"  # exact GELU, GPT-2's tanh approximation, or squared ReLU
    tie_weights: bool = True  # share the token embedding with the output head
    logit_softcap: float = 0.0  # >0: logits = c*tanh(logits/c), smoothly capped at +-c
    zero_init_proj: bool = False  # start every residual output projection at zero
    rope_base: float = 10000.0  # rotary frequency base

    def __post_init__(self):
        for f in fields(self):
            choices = get_args(f.type) if get_origin(f.type) is Literal else ()
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {', '.join(choices)} (got {getattr(self, f.name)!r})")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1) (got {self.dropout})")
        if self.logit_softcap < 0 or self.rope_base <= 0:
            raise ValueError(f"need logit_softcap >= 0 and rope_base > 0 (got {self.logit_softcap}, {self.rope_base})")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("pos_emb='rope' needs an even head size (n_embd / n_head)")

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
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    # x: (B, H, T, D); rotate pairs (first half, second half) of each head
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class KVCache:
    """Preallocated keys and values of every layer, so a decode step appends in place."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_head, config.block_size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        # per-layer views made once: a decode step then costs two narrows and a copy, not a chain of
        # select/slice ops (on CPU, per-op overhead is a large part of a 1-token step)
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)
        self.pos = 0  # tokens already cached

    def update(self, layer, k, v):
        t, end = k.size(2), self.pos + k.size(2)
        keys, values = self.k_layers[layer], self.v_layers[layer]
        keys.narrow(2, self.pos, t).copy_(k)
        values.narrow(2, self.pos, t).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.qk_norm = config.qk_norm
        self.qk_norm_fn = F.rms_norm if config.norm == "rmsnorm" else F.layer_norm

    def qkv(self, x, rotary):
        B, T, C = x.size()
        # (B, T, 3C) -> three (B, H, T, D) views in one go (same layout as split + view + transpose)
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)
        if self.qk_norm:
            q, k = self.qk_norm_fn(q, (q.size(-1),)), self.qk_norm_fn(k, (k.size(-1),))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        return q, k, v

    def forward(self, x, rotary=None, cache=None, layer=0):
        B, T, C = x.size()
        q, k, v = self.qkv(x, rotary)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = self.attend(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v):
        """softmax(q k^T / sqrt(d)) v over the keys each query may see, in SDPA's fused kernels."""
        T, S = q.size(2), k.size(2)
        if S == T:
            mask, causal = None, True
        elif T == 1:  # one new query sees every cached key
            mask, causal = None, False
        else:  # new queries after cached keys
            mask, causal = visible_keys(T, S, q.device), False
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              dropout_p=self.attn_dropout if self.training else 0.0)

    def attention_weights(self, x, rotary=None):
        """The (B, H, T, T) weights that attend() applies to the values, written out as a matrix
        (SDPA never materialises them): an inspection helper for pictures and tests."""
        q, k, _ = self.qkv(x, rotary)
        T = q.size(2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return scores.masked_fill(~visible_keys(T, T, x.device), float("-inf")).softmax(dim=-1)


def visible_keys(n_queries, n_keys, device):
    """(n_queries, n_keys) booleans, True where a query may look: the last n_queries positions of a
    sequence of n_keys, each seeing every key up to and including its own position."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(diagonal=n_keys - n_queries)


class ReLUSquared(torch.autograd.Function):
    """relu(x)^2 with one multiply each way: autograd through relu(x).square() runs four more
    element-wise kernels, which is a tenth of an eager CPU step for a small model."""

    @staticmethod
    def forward(ctx, x):
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return grad * (r + r)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
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
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rotary=None, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), rotary, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        modules = dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        )
        if config.pos_emb == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if config.zero_init_proj:
                    nn.init.zeros_(p)
                else:  # GPT-2's scaled init of residual projections
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

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

    def embed(self, idx, start=0):
        T = idx.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size {self.config.block_size}")
        x = self.transformer.wte(idx)
        positions = torch.arange(start, start + T, device=idx.device)
        rotary = None
        if self.config.pos_emb == "learned":
            x = x + self.transformer.wpe(positions)
        else:
            rotary = rotary_tables(self.config.n_embd // self.config.n_head, positions, self.config.rope_base)
        return self.transformer.drop(x), rotary

    def forward(self, idx, targets=None, cache=None):
        """Logits for every position (or the last one, without targets); loss when targets are given."""
        start = cache.pos if cache is not None else 0
        x, rotary = self.embed(idx, start)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rotary, cache, i)
        if cache is not None:
            cache.pos += idx.size(1)
        x = self.transformer.ln_f(x)
        if targets is None:
            x = x[:, -1:, :]  # a view; [-1] as a list would gather a copy
        logits = self.lm_head(x)
        if self.config.logit_softcap > 0:
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits.float() / c)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx):
        """Inspection: every layer's attention weights for idx, a list of (B, H, T, T) tensors."""
        x, rotary = self.embed(idx)
        maps = []
        for block in self.transformer.h:
            maps.append(block.attn.attention_weights(block.ln_1(x), rotary))
            x = block(x, rotary)
        return maps

    def crop_block_size(self, block_size):
        """Shrink the context length, e.g. to finetune a pretrained model on shorter windows."""
        if block_size > self.config.block_size:
            raise ValueError(f"block_size {block_size} exceeds the model's {self.config.block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def flops_per_token(self, seq_len):
        """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B)."""
        cfg = self.config
        n = sum(p.numel() for name, p in self.named_parameters() if not name.startswith("transformer.w"))
        n += self.lm_head.weight.numel() if cfg.tie_weights else 0
        return 6 * n + 12 * cfg.n_layer * cfg.n_embd * seq_len

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                        kv_cache=True, generator=None, vocab_size=None):
        """Yield each new (B, 1) column of tokens as it is sampled, from the first vocab_size
        logits (a vocabulary padded for speed has rows no tokenizer can decode).

        When the context outgrows block_size the window slides forward by half a block and is
        recomputed once, so cached and uncached decoding see the same context at every step."""
        window = self.config.block_size
        start = max(0, idx.size(1) - window)
        cache = None
        for _ in range(max_new_tokens):
            if idx.size(1) - start > window:
                start = idx.size(1) - max(1, window // 2)  # block_size 1 keeps 1 token
                cache = None
            if not kv_cache:
                logits, _ = self(idx[:, start:])
            elif cache is None:
                cache = KVCache(self.config, idx.size(0), idx.device, self.lm_head.weight.dtype)
                logits, _ = self(idx[:, start:], cache=cache)
            else:
                logits, _ = self(idx[:, -1:], cache=cache)
            next_token = sample_next(logits[:, -1, :vocab_size], temperature, top_k, top_p, generator)
            idx = torch.cat((idx, next_token), dim=1)
            yield next_token

    def generate(self, idx, max_new_tokens, **kwargs):
        """Return idx extended by max_new_tokens sampled tokens (see generate_stream)."""
        new = list(self.generate_stream(idx, max_new_tokens, **kwargs))
        return torch.cat([idx] + new, dim=1)


def sample_next(logits, temperature=1.0, top_k=0, top_p=1.0, generator=None):
    """One token per row from (B, V) logits; temperature 0 is greedy, top_k 0 and top_p 1 are off."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
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
    return torch.multinomial(probs, num_samples=1, generator=generator)
