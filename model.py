"""
A decoder-only transformer (GPT) and its sampler.

The defaults are GPT-2's shape and parameter names (learned positions, LayerNorm, tied head),
without biases; `bias=True, mlp_act='gelu_tanh'` is GPT-2 exactly, so its weights load.
Options switch on the modern pieces that train faster on small data: rotary positions,
RMSNorm, QK-norm, ReLU^2, an untied head, logit soft-capping and zero-initialised projections.

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


class KVCache:
    """Preallocated keys and values of every layer, so a decode step appends in place."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_head, config.block_size, head_dim)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k = torch.zeros(shape, device=device, dtype=dtype) if config.attention != "uniform" else None
        # per-layer views made once: a decode step then costs two narrows and a copy, not a chain of
        # select/slice ops (on CPU, per-op overhead is a large part of a 1-token step)
        self.v_layers = self.v.unbind(0)
        self.k_layers = self.k.unbind(0) if self.k is not None else [None] * config.n_layer
        self.pos = 0  # tokens already cached

    def update(self, layer, k, v):
        """Append this step's keys and values (k is None where attention has no keys); all so far."""
        t, end = v.size(2), self.pos + v.size(2)
        keys, values = self.k_layers[layer], self.v_layers[layer]
        values.narrow(2, self.pos, t).copy_(v)
        if keys is None:
            return None, values.narrow(2, 0, end)
        keys.narrow(2, self.pos, t).copy_(k)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)


class SelfAttention(nn.Module):
    """Multi-head self-attention: each position takes a weighted average of the values of the positions it
    sees (the earlier ones and itself when causal, all of them when not), with weights from a softmax over
    scores. `attention` sets the scores: q.k/sqrt(d) (scaled), q.k (dot), Bahdanau's v.tanh(q+k) (additive),
    or none at all, every visible position weighted equally (uniform)."""

    def __init__(self, config):
        super().__init__()
        self.kind, self.causal, self.n_head = config.attention, config.causal, config.n_head
        projections = 1 if self.kind == "uniform" else 3  # values only, or queries, keys and values
        self.c_attn = nn.Linear(config.n_embd, projections * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.fused = True  # scaled and dot scores in SDPA's kernels, or written out (GPT.use_fused_attention)
        if self.kind == "additive":  # Bahdanau's v, one per head
            self.score_v = nn.Parameter(torch.randn(config.n_head, config.n_embd // config.n_head) * 0.02)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.qk_norm = config.qk_norm
        self.qk_norm_fn = F.rms_norm if config.norm == "rmsnorm" else F.layer_norm

    def qkv(self, x, rotary):
        """(B, H, T, D) queries, keys and values (queries and keys None for uniform attention)."""
        B, T, C = x.size()
        if self.kind == "uniform":
            return None, None, self.c_attn(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        qk, v = qkv[:, :, :2], qkv[:, :, 2]
        # queries and keys normalised and rotated together: on a CPU each small op costs more than its arithmetic
        if self.qk_norm:
            qk = self.qk_norm_fn(qk, (qk.size(-1),))
        if rotary is not None:
            cos, sin = rotary
            qk = apply_rotary(qk, cos[:, None, None, :], sin[:, None, None, :])  # (T, 1, 1, D) against (B, T, 2, H, D)
        q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v.transpose(1, 2)

    def forward(self, x, rotary=None, cache=None, layer=0):
        B, T, C = x.size()
        q, k, v = self.qkv(x, rotary)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = self.attend(q, k, v, T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v, n_queries):
        """Each query's weighted average of the values it sees: (B, H, T, D)."""
        dropout = self.attn_dropout if self.training else 0.0
        if self.kind in ("scaled", "dot") and self.fused:  # SDPA's kernels, which never materialise the weights
            S = k.size(2)
            causal, mask = self.causal and S == n_queries, None
            if self.causal and S != n_queries and n_queries > 1:  # new queries after cached keys
                mask = visible_keys(n_queries, S, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout,
                                                  scale=None if self.kind == "scaled" else 1.0)
        weights = F.dropout(self.weights(q, k, n_queries, v.size(2)), dropout, self.training)
        return weights @ v

    def weights(self, q, k, n_queries, n_keys):
        """Softmax over each query's visible keys of its scores: (B, H, T, S), or (T, S) for uniform."""
        device = self.c_attn.weight.device
        # -inf on the future: added to the scores, it leaves the softmax nothing there
        hidden = torch.zeros(n_queries, n_keys, device=device)
        if self.causal:
            hidden = hidden.masked_fill(~visible_keys(n_queries, n_keys, device), float("-inf"))
        if self.kind == "uniform":  # all scores equal: the softmax is 1/count over what is visible
            scores = hidden
        elif self.kind == "additive":
            scores = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2)) @ self.score_v[:, None, :, None].to(q.dtype)
            scores = scores.squeeze(-1) + hidden
        else:  # the scale and the mask folded into the matmul: one pass over the (T, S) scores, not three
            B, H, T, D = q.shape
            scale = 1 / math.sqrt(D) if self.kind == "scaled" else 1.0
            scores = torch.baddbmm(hidden.to(q.dtype).expand(B * H, T, n_keys), q.reshape(B * H, T, D),
                                   k.reshape(B * H, n_keys, D).transpose(1, 2), alpha=scale).view(B, H, T, n_keys)
        return scores.softmax(dim=-1)

    def attention_weights(self, x, rotary=None):
        """The (B, H, T, T) weights attend() applies to the values, as a matrix (SDPA never materialises
        them): an inspection helper for pictures and tests."""
        q, k, v = self.qkv(x, rotary)
        T = x.size(1)
        return self.weights(q, k, T, T).expand(x.size(0), self.n_head, T, T)


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
        self.attn = SelfAttention(config)
        if config.mlp:
            self.ln_2 = make_norm(config)
            self.mlp = MLP(config)

    def forward(self, x, rotary=None, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), rotary, cache, layer)
        if hasattr(self, "mlp"):
            x = x + self.mlp(self.ln_2(x))
        return x


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

    def embed(self, idx, start=0):
        T = idx.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size {self.config.block_size}")
        x = self.transformer.wte(idx)
        positions = torch.arange(start, start + T, device=idx.device)
        rotary = None
        if self.config.pos_emb == "learned":
            x = x + self.transformer.wpe(positions)
        elif self.config.pos_emb == "rope":
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
    def lay_out_for_decoding(self):
        """Store every linear weight transposed in memory (the same values and shapes): a one-token decode step
        multiplies a row vector by each weight, which CPU kernels stream faster from an (in, out) layout
        (1.1-1.2x tokens/s measured on a 2-core EPYC). For inference; training prefers the usual layout.
        Tied weights stay tied: the data moves, the parameter stays."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.data = module.weight.data.t().contiguous().t()
        return self

    def use_fused_attention(self, fused):
        """Scaled and dot attention through SDPA's fused kernels (the default), or as the masked softmax of
        q.k written out, which can be faster for short contexts on a CPU; both compute the same function."""
        for block in self.transformer.h:
            block.attn.fused = fused

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
        """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B): 2 FLOPs forward
        and 4 backward per multiply-add, over seq_len keys for each of n_embd channels. Dot-product
        attention has two such products (scores and values), uniform only the values, and additive
        about three (the sum and tanh of q+k, the product with v, the values)."""
        cfg = self.config
        n = sum(p.numel() for name, p in self.named_parameters() if not name.startswith("transformer.w"))
        n += self.lm_head.weight.numel() if cfg.tie_weights else 0
        products = {"scaled": 2, "dot": 2, "uniform": 1, "additive": 3}[cfg.attention]
        return 6 * n + 6 * products * cfg.n_layer * cfg.n_embd * seq_len

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                        kv_cache=True, generator=None, vocab_size=None):
        """Yield each new (B, 1) column of tokens as it is sampled, from the first vocab_size
        logits (a vocabulary padded for speed has rows no tokenizer can decode).

        When the context outgrows block_size the window slides forward by half a block and is
        recomputed once, so cached and uncached decoding see the same context at every step.
        A model without the causal mask recomputes the whole window every step whatever kv_cache
        says: each new token changes what the earlier positions see."""
        window = self.config.block_size
        kv_cache = kv_cache and self.config.causal
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
