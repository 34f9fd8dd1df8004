"""The attention variants a learner trains side by side (scaled, dot, uniform, additive; causal or not;
no positions; no MLP; no blocks), each against a reference written out plainly here."""

import math

import pytest
import torch

from gptkit.decoding import generate
from gptkit.inspection import attention_maps
from model import ATTENTION_PATHS, GPT, GPTConfig, SelfAttention

BASE = dict(block_size=12, vocab_size=29, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)
CAUSAL_VARIANTS = {
    "scaled": {},
    "dot": dict(attention="dot"),
    "uniform": dict(attention="uniform"),
    "additive": dict(attention="additive"),
    "no_positions": dict(pos_emb="none"),
    "attention_only": dict(mlp=False),
    "bigram": dict(n_layer=0, pos_emb="none"),
    "rope_qknorm_no_mlp": dict(pos_emb="rope", qk_norm=True, mlp=False),
    "token_shift": dict(pos_emb="rope", qk_norm=True, token_shift=True),
}


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**dict(BASE, **overrides))).eval()
    with torch.no_grad():  # weights far from zero, so attention is far from uniform and every term matters
        for name, p in model.named_parameters():
            if "attn" in name:
                p.normal_(0, 0.5)
    return model


def tokens(shape, seed=1):
    return torch.randint(BASE["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def naive_attention(attn, x, kind, causal=True):
    """Per batch row, head and position: the scores against every visible key, a softmax, a weighted sum."""
    B, T, C = x.shape
    H, D = attn.n_head, C // attn.n_head
    proj = x @ attn.c_attn.weight.T + attn.c_attn.bias
    if kind == "uniform":
        v = proj.reshape(B, T, H, D)
    else:
        q, k, v = (t.reshape(B, T, H, D) for t in proj.split(C, dim=-1))
    out = torch.zeros(B, T, H, D)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                seen = range(t + 1) if causal else range(T)
                if kind == "uniform":
                    weights = torch.full((len(seen),), 1 / len(seen))
                elif kind == "additive":
                    weights = torch.stack([(attn.score_v[h] * torch.tanh(q[b, t, h] + k[b, s, h])).sum()
                                           for s in seen]).softmax(0)
                else:
                    scale = math.sqrt(D) if kind == "scaled" else 1.0
                    weights = torch.stack([(q[b, t, h] * k[b, s, h]).sum() / scale for s in seen]).softmax(0)
                out[b, t, h] = sum(w * v[b, s, h] for w, s in zip(weights, seen))
    return out.reshape(B, T, C) @ attn.c_proj.weight.T + attn.c_proj.bias


def attention_module(kind, causal=True):
    model = make_model(attention=kind, causal=causal)
    return model.transformer.h[0].attn


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize("kind", ["scaled", "dot", "uniform", "additive"])
def test_attention_matches_the_naive_loop(kind, causal):
    attn = attention_module(kind, causal)
    x = torch.randn(2, 7, BASE["n_embd"])
    with torch.no_grad():
        torch.testing.assert_close(attn(x), naive_attention(attn, x, kind, causal), atol=1e-5, rtol=1e-5)


def test_uniform_weights_are_tril_over_the_row_count_and_average_the_past():
    attn = attention_module("uniform")
    T = 9
    tril = torch.tril(torch.ones(T, T))
    assert torch.equal(attn.attention_weights(None, None, T, T), tril / tril.sum(1, keepdim=True))
    # the notes' double loop over batch and time, on the values
    x = torch.randn(3, T, BASE["n_embd"])
    with torch.no_grad():
        _, _, v = attn.qkv(x, None)
        v = v.transpose(1, 2).reshape(3, T, -1)  # (B, T, C), heads side by side
        x_avg = torch.zeros_like(v)
        for b in range(3):
            for t in range(T):
                x_avg[b, t] = torch.mean(v[b, :t + 1], 0)
        got = attn.attend(*attn.qkv(x, None), T).transpose(1, 2).reshape(3, T, -1)
    torch.testing.assert_close(got, x_avg, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["scaled", "dot", "additive", "uniform"])
def test_the_naive_loop_catches_a_mask_on_the_allowed_positions(kind):
    """One learner's note masks with masked_fill(tril, -inf), hiding the positions a query may see instead of
    the future. Planted in the weights the model writes out (the only path for uniform and additive, the
    inspected one for scaled and dot), the comparison with the naive loop fails; without it, it holds."""
    attn = attention_module(kind)
    x = torch.randn(1, 6, BASE["n_embd"])

    def explicit_output():
        q, k, v = attn.qkv(x, None)
        y = (attn.attention_weights(q, k, 6, 6) @ v).transpose(1, 2).reshape(1, 6, -1)
        return y @ attn.c_proj.weight.T + attn.c_proj.bias

    with torch.no_grad():
        want = naive_attention(attn, x, kind)
        torch.testing.assert_close(explicit_output(), want, atol=1e-5, rtol=1e-5)
        attn.tril.logical_not_()  # the note's mask: True on the future, so the past is what gets hidden
        assert not torch.allclose(explicit_output().nan_to_num(), want, atol=1e-3)


@pytest.mark.parametrize("variant", CAUSAL_VARIANTS, ids=list(CAUSAL_VARIANTS))
def test_causal_variants_never_see_the_future(variant):
    model = make_model(**CAUSAL_VARIANTS[variant])
    idx = tokens((2, BASE["block_size"]))
    with torch.no_grad():
        ref, _ = model(idx, idx)
        for t in [0, 4, 9]:
            changed = idx.clone()
            changed[:, t + 1:] = tokens((2, BASE["block_size"] - t - 1), seed=100 + t)
            logits, _ = model(changed, changed)
            torch.testing.assert_close(logits[:, :t + 1], ref[:, :t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(logits[:, t + 1:], ref[:, t + 1:], atol=1e-4)  # the future was read later


def test_the_encoder_sees_the_future():
    model = make_model(causal=False)
    idx = tokens((1, 10))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % BASE["vocab_size"]
    with torch.no_grad():
        assert not torch.allclose(model(idx, idx)[0][:, 0], model(changed, changed)[0][:, 0], atol=1e-4)


def test_bigram_logits_depend_only_on_the_current_token():
    model = make_model(n_layer=0, pos_emb="none")
    idx = tokens((3, BASE["block_size"]))
    with torch.no_grad():
        logits, _ = model(idx, idx)
        table, _ = model(torch.arange(BASE["vocab_size"])[:, None], torch.zeros(BASE["vocab_size"], 1).long())
    torch.testing.assert_close(logits, table[:, 0][idx])  # one row of a table per token, wherever it stands


@pytest.mark.parametrize("variant", CAUSAL_VARIANTS, ids=list(CAUSAL_VARIANTS))
def test_kv_cache_generation_equals_full_context_generation(variant):
    model = make_model(**CAUSAL_VARIANTS[variant])
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)  # confident predictions, so a wrong context shows in the tokens
    idx = tokens((2, 3))
    runs = [generate(model, idx, 30, temperature=1.0, kv_cache=kv, generator=torch.Generator().manual_seed(3))
            for kv in (True, False)]  # 30 new tokens: the 12-token window slides several times
    assert torch.equal(runs[0], runs[1])


def test_an_encoder_generates_from_the_whole_context_every_step():
    model = make_model(causal=False)
    idx = tokens((1, 3))
    a = generate(model, idx, 15, temperature=0.0, kv_cache=True)
    assert torch.equal(a, generate(model, idx, 15, temperature=0.0, kv_cache=False))


@pytest.mark.parametrize("kind,shift", [("scaled", False), ("dot", False), ("uniform", False), ("additive", False),
                                        ("scaled", True)], ids=["scaled", "dot", "uniform", "additive", "token_shift"])
def test_attention_maps_are_the_weights_the_forward_pass_applies(kind, shift):
    model = make_model(attention=kind, token_shift=shift)
    idx = tokens((1, 8))
    maps = attention_maps(model, idx)
    attn, block = model.transformer.h[0].attn, model.transformer.h[0]
    with torch.no_grad():
        x, rotary = model.embed(idx)
        q, k, v = attn.qkv(block.attention_input(x), rotary)
        torch.testing.assert_close(maps[0] @ v, attn.attend(q, k, v, 8), atol=1e-5, rtol=1e-5)
    assert torch.equal(maps[0][..., torch.ones(8, 8, dtype=torch.bool).triu(1)], torch.zeros(1, 2, 28))


def test_variants_refuse_what_they_cannot_do():
    for bad, message in [(dict(attention="uniform", qk_norm=True), "no queries or keys"),
                         (dict(attention="uniform", pos_emb="rope"), "no queries or keys"),
                         (dict(attention="additive", pos_emb="rope"), "adds them")]:
        with pytest.raises(ValueError, match=message):
            GPTConfig(**bad)
    assert SelfAttention(GPTConfig(**BASE, attention="uniform")).c_attn.out_features == BASE["n_embd"]


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize("kind", ["scaled", "dot"])
def test_the_three_attention_paths_agree(kind, causal):
    """SDPA's kernels, the softmax written out as the notes write it, and the same folded into one matmul:
    the same outputs and the same gradients, also when new queries follow cached keys."""
    model = make_model(attention=kind, causal=causal, pos_emb="rope", qk_norm=True)
    idx = tokens((2, 10))
    results = []
    for path in ATTENTION_PATHS:
        model.set_attention_path(path)
        model.zero_grad()
        logits, loss = model(idx, idx)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((logits.detach(), grads))
    for other in results[1:]:
        torch.testing.assert_close(other[0], results[0][0], atol=1e-5, rtol=1e-5)
        for a, b in zip(other[1], results[0][1]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    if causal:
        runs = []
        for path in ATTENTION_PATHS:
            model.set_attention_path(path)
            runs.append(generate(model, idx[:, :3], 20, temperature=0.0))
        assert all(torch.equal(run, runs[0]) for run in runs)


@pytest.mark.parametrize("variant", CAUSAL_VARIANTS, ids=list(CAUSAL_VARIANTS))
def test_every_variant_decodes_with_bfloat16_weights(variant):
    """sample.py and the explorer may decode in bfloat16: every path's weights must meet the values' dtype."""
    model = make_model(**CAUSAL_VARIANTS[variant]).to(torch.bfloat16)
    for path in ATTENTION_PATHS:
        model.set_attention_path(path)
        assert generate(model, tokens((1, 3)), 15, temperature=0.0).shape == (1, 18)
