"""The transformer: attention against a naive loop, causality, rotary positions, KV cache and generation."""

import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from gptkit.decoding import KVCache, generate, sample_next
from gptkit.flops import flops_per_token
from gptkit.optim import build_optimizers
from gptkit.train_config import TrainConfig
from model import GPT, GPTConfig, ReLUSquared, SelfAttention, apply_rotary, dropout, rotary_tables

BASE = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
MODERN = dict(pos_emb="rope", norm="rmsnorm", qk_norm=True, mlp_act="relu2", tie_weights=False,
              logit_softcap=15.0, zero_init_proj=False)
ARCHS = {"gpt2": {}, "modern": MODERN, "token_shift": dict(MODERN, token_shift=True)}


def make_model(seed=0, sharpen=1.0, **overrides):
    """A tiny GPT in eval mode; sharpen > 1 scales the head so sampling is far from uniform."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**dict(BASE, **overrides))).eval()
    if sharpen != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
    return model


def random_tokens(shape, vocab=BASE["vocab_size"], seed=1):
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(seed))


def naive_rms(x):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def naive_layer_norm(x):
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)


def naive_attention(attn, x, rotary=None, qk_norm=None):
    """Per position t: softmax over keys 0..t of q.k/sqrt(d), weighted sum of values, then c_proj."""
    B, T, C = x.shape
    H = attn.n_head
    D = C // H
    qkv = x @ attn.c_attn.weight.T + attn.c_attn.bias
    q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
    if qk_norm:
        q, k = qk_norm(q), qk_norm(k)
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    y = torch.zeros(B, H, T, D)
    for t in range(T):
        scores = (q[:, :, t:t + 1, :] * k[:, :, :t + 1, :]).sum(-1) / math.sqrt(D)  # (B, H, t+1)
        weights = torch.softmax(scores, dim=-1)
        y[:, :, t, :] = (weights[..., None] * v[:, :, :t + 1, :]).sum(2)
    y = y.transpose(1, 2).reshape(B, T, C)
    return y @ attn.c_proj.weight.T + attn.c_proj.bias



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_zeroes_a_share_p_and_scales_the_rest_as_f_dropout_does(dtype):
    """The CPU mask, a window of a table of random masks: over 2M elements the zeroed share is p to within
    0.2%, what is kept is scaled by exactly 1/(1-p), the gradient flows through the same mask, each call takes
    a new mask from torch's generator (so a seed repeats it), and outside training, or with p = 0, it is the
    identity."""
    x = torch.ones(2_000_000, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, 0.25, True)
    assert abs((y == 0).float().mean().item() - 0.25) < 0.002
    assert torch.equal(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75)) and y.dtype == dtype
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.25, True), y) and not torch.equal(dropout(x, 0.25, True), y)
    assert dropout(x, 0.25, False) is x and dropout(x, 0.0, True) is x


def test_dropout_masks_change_from_call_to_call_and_never_depend_on_the_past():
    """An element dropped in one call is dropped in the next with probability p, as with fresh masks (a
    table reused at one offset would drop it again); and a seed gives the same masks in a process whose
    table grew for bigger tensors first, as a resumed run's must."""
    x = torch.ones(1_000_000)
    torch.manual_seed(3)
    first = [dropout(x, 0.2, True) == 0 for _ in range(4)]
    for a, b in zip(first, first[1:]):
        assert abs((a & b).float().mean().item() - 0.2 * 0.2) < 0.002
    dropout(torch.ones(5_000_000), 0.2, True)  # grows the table beyond what the calls above used
    torch.manual_seed(3)
    assert all(torch.equal(dropout(x, 0.2, True) == 0, mask) for mask in first)


def test_with_dropout_every_attention_path_trains_alike():
    """With dropout, every attention path draws the same masks from the same seed, so which path a run's
    start-up measured fastest does not change its losses or gradients."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50, dropout=0.1)
    torch.manual_seed(1)
    model = GPT(config)
    x = torch.randint(50, (4, 16))
    seen = []
    for path in ("fused", "written", "folded"):
        model.set_attention_path(path)
        model.zero_grad()
        torch.manual_seed(2)
        loss = model(x, x)[1]
        loss.backward()
        seen.append((loss.item(), model.lm_head.weight.grad.clone()))
    for loss, grad in seen[1:]:
        assert abs(loss - seen[0][0]) < 1e-5 and torch.allclose(grad, seen[0][1], atol=1e-6)


def test_relu_squared_matches_autograd_of_the_plain_formula():
    x = torch.randn(64, 48, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    grad = torch.randn(64, 48, dtype=torch.float64)
    ReLUSquared.apply(x).backward(grad)
    F.relu(x_ref).square().backward(grad)
    torch.testing.assert_close(ReLUSquared.apply(x), F.relu(x_ref).square())
    torch.testing.assert_close(x.grad, x_ref.grad)

@pytest.mark.parametrize("rope,norm", [(False, "layernorm"), (True, "rmsnorm"), (True, "layernorm")],
                         ids=["learned", "rope_qk_rmsnorm", "rope_qk_layernorm"])
def test_attention_matches_naive_loop(rope, norm):
    cfg = GPTConfig(**dict(BASE, pos_emb="rope" if rope else "learned", qk_norm=rope, norm=norm))
    torch.manual_seed(0)
    attn = SelfAttention(cfg).eval()
    with torch.no_grad():  # non-trivial biases and projection, so every term matters
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 11, cfg.n_embd)
    rotary = rotary_tables(cfg.n_embd // cfg.n_head, torch.arange(11), cfg.rope_base) if rope else None
    with torch.no_grad():
        got = attn(x, rotary)
        qk = {"rmsnorm": naive_rms, "layernorm": naive_layer_norm}[norm] if rope else None
        want = naive_attention(attn, x, rotary, qk_norm=qk)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rotary_rotates_pairs_by_position_angle():
    D, base = 8, 10000.0
    positions = torch.tensor([0, 1, 5, 13])
    cos, sin = rotary_tables(D, positions, base)
    x = torch.randn(1, 1, len(positions), D)
    y = apply_rotary(x, cos, sin)
    for p_i, p in enumerate(positions.tolist()):
        for i in range(D // 2):
            theta = p * base ** (-2 * i / D)
            a, b = x[0, 0, p_i, i], x[0, 0, p_i, i + D // 2]
            torch.testing.assert_close(y[0, 0, p_i, i], a * math.cos(theta) - b * math.sin(theta))
            torch.testing.assert_close(y[0, 0, p_i, i + D // 2], a * math.sin(theta) + b * math.cos(theta))
    # position 0 is the identity, and a rotation keeps the norm
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_rotary_scores_depend_only_on_relative_position():
    D = 16
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def score(m, n):
        cq, sq = rotary_tables(D, torch.tensor([m]), 10000.0)
        ck, sk = rotary_tables(D, torch.tensor([n]), 10000.0)
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    torch.testing.assert_close(score(7, 3), score(24, 20), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 4), atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS, ids=list(ARCHS))
def test_causality(arch):
    model = make_model(**ARCHS[arch])
    T = BASE["block_size"]
    idx = random_tokens((2, T))
    with torch.no_grad():
        ref, _ = model(idx, idx)
        for t in [0, 3, 9, T - 2]:
            changed = idx.clone()
            changed[:, t + 1:] = random_tokens((2, T - t - 1), seed=100 + t)
            assert not torch.equal(changed, idx)
            logits, _ = model(changed, changed)
            torch.testing.assert_close(logits[:, :t + 1], ref[:, :t + 1], atol=1e-6, rtol=0)
            # and the future did change something later on, so the check is not vacuous
            assert not torch.allclose(logits[:, t + 1:], ref[:, t + 1:], atol=1e-4)


def test_logits_without_targets_are_the_last_position():
    model = make_model(**MODERN)
    idx = random_tokens((3, 10))
    with torch.no_grad():
        full, loss = model(idx, idx)
        last, none = model(idx)
    assert none is None and loss.ndim == 0
    assert last.shape == (3, 1, BASE["vocab_size"])
    torch.testing.assert_close(last[:, 0], full[:, -1])


def test_softcap_is_scaled_tanh_of_raw_logits():
    capped = make_model(sharpen=300.0, **MODERN)
    raw = make_model(sharpen=300.0, **dict(MODERN, logit_softcap=0.0))
    idx = random_tokens((2, 8))
    with torch.no_grad():
        want = 15.0 * torch.tanh(raw(idx, idx)[0] / 15.0)
        got = capped(idx, idx)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_softcap_bounds_logits():
    model = make_model(sharpen=500.0, **MODERN)
    with torch.no_grad():
        logits, _ = model(random_tokens((2, 8)), random_tokens((2, 8)))
    assert logits.abs().max() <= 15.0 + 1e-4
    assert logits.abs().max() > 10.0  # the cap was actually exercised


@pytest.mark.parametrize("arch", ARCHS, ids=list(ARCHS))
def test_kv_cache_step_by_step_matches_full_forward(arch):
    model = make_model(**ARCHS[arch])
    B, T = 2, BASE["block_size"]
    idx = random_tokens((B, T))
    with torch.no_grad():
        full, _ = model(idx, idx)
        cache = KVCache(model.config, B, "cpu", torch.float32)
        for t in range(T):
            step, _ = model(idx[:, t:t + 1], cache=cache)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
        assert cache.pos == T


@pytest.mark.parametrize("arch", ARCHS, ids=list(ARCHS))
def test_kv_cache_chunked_prefill_matches_full_forward(arch):
    """Several new tokens after cached ones (the masked branch of attention)."""
    model = make_model(**ARCHS[arch])
    idx = random_tokens((2, 14))
    with torch.no_grad():
        full, _ = model(idx, idx)
        cache = KVCache(model.config, 2, "cpu", torch.float32)
        for a, b in [(0, 5), (5, 9), (9, 10), (10, 14)]:
            out, _ = model(idx[:, a:b], cache=cache)
            torch.testing.assert_close(out[:, -1], full[:, b - 1], atol=1e-5, rtol=1e-5)


def test_forward_rejects_sequences_longer_than_block():
    model = make_model()
    with pytest.raises(ValueError, match="block_size"):
        model(random_tokens((1, BASE["block_size"] + 1)))


@pytest.mark.parametrize("kv_cache", [True, False])
def test_generation_reads_only_the_last_block_of_context(kv_cache):
    """Tokens further back than block_size never reach the model: changing them changes nothing,
    while changing one inside the window does."""
    model = make_model(sharpen=20.0, block_size=8)
    prompt = random_tokens((1, 30))
    out = generate(model, prompt, 1, temperature=0.0, kv_cache=kv_cache)
    far = prompt.clone()
    far[:, :22] = random_tokens((1, 22), seed=5)  # all but the last 8 tokens
    assert torch.equal(generate(model, far, 1, temperature=0.0, kv_cache=kv_cache)[:, -1], out[:, -1])
    with torch.no_grad():
        logits, _ = model(prompt[:, -8:])
        near = prompt.clone()
        near[:, -8] = (near[:, -8] + 1) % BASE["vocab_size"]
        moved, _ = model(near[:, -8:])
    assert not torch.allclose(logits, moved)  # the first token of the window does matter


def test_sample_next_filters():
    logits = torch.tensor([[5.0, 4.0, 1.0, 0.0, -1.0]])
    assert sample_next(logits, temperature=0).item() == 0
    g = torch.Generator().manual_seed(0)
    picks = {sample_next(logits, temperature=1.0, top_k=2, generator=g).item() for _ in range(200)}
    assert picks == {0, 1}
    # p(0) = 0.72, p(1) = 0.27: top_p=0.5 keeps only the first, top_p=0.9 the first two
    picks = {sample_next(logits, temperature=1.0, top_p=0.5, generator=g).item() for _ in range(100)}
    assert picks == {0}
    picks = {sample_next(logits, temperature=1.0, top_p=0.9, generator=g).item() for _ in range(300)}
    assert picks == {0, 1}


def test_loss_ignores_minus_one_targets():
    model = make_model()
    idx = random_tokens((2, 8))
    targets = idx.clone()
    targets[:, :4] = -1
    with torch.no_grad():
        logits, loss = model(idx, targets)
    want = F.cross_entropy(logits[:, 4:].reshape(-1, logits.size(-1)), idx[:, 4:].reshape(-1))
    torch.testing.assert_close(loss, want)


def test_tied_and_untied_heads():
    tied = make_model()
    assert tied.lm_head.weight is tied.transformer.wte.weight
    untied = make_model(tie_weights=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert "wpe" not in make_model(pos_emb="rope").transformer


def test_token_shift_mixes_each_position_with_the_one_before():
    """What each branch reads, against a loop: h[t] + share * (h[t-1] - h[t]) of the normed stream h, zeros before
    the first position, a share per channel; the shares train under AdamW without weight decay, not Muon."""
    model = make_model(token_shift=True, bias=False)
    block = model.transformer.h[0]
    with torch.no_grad():
        for share in block.shares:
            share.uniform_(0, 1)
    x = torch.randn(2, 7, BASE["n_embd"])
    with torch.no_grad():
        for i, norm in enumerate((block.ln_1, block.ln_2)):
            h, share = norm(x), block.shares[i]
            want = torch.stack([h[:, t] + share * ((h[:, t - 1] if t else 0) - h[:, t]) for t in range(7)], dim=1)
            torch.testing.assert_close(block.branch_input(x, i), want)
        torch.testing.assert_close(block.attention_input(x), block.branch_input(x, 0))
    cfg = TrainConfig(optimizer="muon", weight_decay=0.1)
    adamw, muon = build_optimizers(model, cfg)
    shares = {id(p) for b in model.transformer.h for p in b.shares}
    assert len(shares) == 2 * BASE["n_layer"] and not shares & {id(p) for g in muon.param_groups for p in g["params"]}
    assert all(g["weight_decay"] == 0 for g in adamw.param_groups if shares & {id(p) for p in g["params"]})
    assert not make_model().transformer.h[0].shares  # off by default: GPT-2's blocks


def test_zero_init_proj():
    model = make_model(zero_init_proj=True)
    projs = [p for n, p in model.named_parameters() if n.endswith("c_proj.weight")]
    assert len(projs) == 2 * BASE["n_layer"]
    assert all(torch.count_nonzero(p) == 0 for p in projs)


@pytest.mark.parametrize("bad,message", [
    (dict(n_embd=30, n_head=4), "divisible"),
    (dict(n_embd=36, n_head=4, pos_emb="rope"), "even head size"),  # head size 9 cannot rotate in pairs
    (dict(pos_emb="alibi"), "pos_emb must be one of learned, rope"),
    (dict(n_layer=-1), "n_layer must be at least 0"),
    (dict(attention="uniform", qk_norm=True), "uniform.*no queries or keys"),
    (dict(dropout=1.0), "dropout"),
])
def test_config_refuses_what_cannot_be_built(bad, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**bad)
    GPTConfig(n_embd=32, n_head=4)  # a valid one is fine


def test_from_dict_refuses_unknown_settings():
    saved = asdict(GPTConfig(n_layer=3))
    assert GPTConfig.from_dict(saved) == GPTConfig(n_layer=3)
    with pytest.raises(ValueError, match="unknown model settings: flash"):
        GPTConfig.from_dict(dict(saved, flash=True))


def test_rope_base_sets_the_rotary_frequencies():
    slow, fast = make_model(pos_emb="rope", rope_base=10000.0), make_model(pos_emb="rope", rope_base=10.0)
    idx = random_tokens((1, 12))
    with torch.no_grad():
        assert not torch.allclose(slow(idx, idx)[0], fast(idx, idx)[0])  # same weights, other angles


def test_flops_per_token_by_hand():
    """PaLM's count (appendix B): 6 FLOPs per token for each parameter but the embedding tables (2 forward,
    4 backward; norm gains included, the head counted even when tied), plus attention's QK^T and AV:
    2 matmuls x 2 FLOPs x T keys x C per layer, times 3 for the backward pass."""
    L, C, V, T = 2, 32, 37, 16
    per_layer = C + 3 * C * C + C * C + C + 4 * C * C + 4 * C * C  # ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
    n = L * per_layer + C + V * C  # the blocks, ln_f and the head
    model = make_model(bias=False)
    assert flops_per_token(model, T) == 6 * n + L * 2 * 2 * T * C * 3
    assert flops_per_token(make_model(bias=False, tie_weights=False), T) == flops_per_token(model, T)
