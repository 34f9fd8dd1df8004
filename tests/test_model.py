"""model.py: every attention kind against the naive loop, causality, rotary positions, the KV cache, the variants a
learner trains side by side, the hook points, and what the config refuses."""

import json
import math
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import (MODERN, REPO, TINY, check_ok, naive_attention, random_tokens, sum_tolerance, tiny_model,
                      train_args, train_config)
from gptkit.interp.hooks import hook_points, hooked
from gptkit.sampling.decoding import KVCache, generate
from gptkit.training.updates import schedulable, set_lr
from gptkit.training.train_config import TrainConfig
from model import GPT, GPTConfig, Norm, SelfAttention, apply_rotary, merge_lora, rotary_tables

# the variants a learner trains side by side, every one causal
VARIANTS = {
    "scaled": {},
    "dot": dict(attention="dot"),
    "uniform": dict(attention="uniform"),
    "additive": dict(attention="additive"),
    "no_positions": dict(pos_emb="none"),
    "attention_only": dict(mlp=False),
    "bigram": dict(n_layer=0, pos_emb="none"),
    "modern": MODERN,
    "rope_qknorm_no_mlp": dict(pos_emb="rope", qk_norm=True, mlp=False),
    "token_shift": dict(MODERN, token_shift=True),
}


def naive_rms(x):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def naive_layer_norm(x):
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
@pytest.mark.parametrize("kind", ["scaled", "dot", "uniform", "additive"])
def test_attention_matches_the_naive_loop(kind, causal):
    attn = tiny_model(attention=kind, causal=causal, attention_weights=0.5).transformer.h[0].attn
    x = torch.randn(2, 7, TINY["n_embd"])
    with torch.no_grad():
        want = naive_attention(attn, x)
        torch.testing.assert_close(attn(x), want, **sum_tolerance(want, terms=7 * TINY["n_embd"]))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_rotated_and_normed_queries_and_keys_match_the_naive_loop(norm):
    attn = tiny_model(pos_emb="rope", qk_norm=True, norm=norm, attention_weights=0.3).transformer.h[0].attn
    x = torch.randn(2, 11, TINY["n_embd"])
    rotary = rotary_tables(TINY["n_embd"] // TINY["n_head"], torch.arange(11), 10000.0)
    qk_norm = {"rmsnorm": naive_rms, "layernorm": naive_layer_norm}[norm]
    with torch.no_grad():
        torch.testing.assert_close(attn(x, rotary), naive_attention(attn, x, rotary, qk_norm), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["scaled", "dot", "additive", "uniform"])
def test_the_naive_loop_catches_a_mask_on_the_allowed_positions(kind):
    """One learner's note masks with masked_fill(tril, -inf), hiding the positions a query may see instead of the
    future. Planted in the model's mask, the comparison with the naive loop fails; without it, it holds."""
    attn = tiny_model(attention=kind, attention_weights=0.5).transformer.h[0].attn
    x = torch.randn(1, 6, TINY["n_embd"])

    def written_out():  # the weights as the model writes them out (SDPA's kernel keeps its own mask)
        return attn.c_proj(attn.written(*attn.project(x, None)).transpose(1, 2).reshape(1, 6, -1))

    with torch.no_grad():
        want = naive_attention(attn, x)
        torch.testing.assert_close(written_out(), want, atol=1e-5, rtol=1e-5)
        attn.tril.logical_not_()  # the note's mask: True on the future, so the past is what gets hidden
        assert not torch.allclose(written_out().nan_to_num(), want, atol=1e-3)


def test_uniform_attention_averages_the_past_as_the_notes_double_loop_does():
    attn = tiny_model(attention="uniform").transformer.h[0].attn
    T, x = 9, torch.randn(3, 9, TINY["n_embd"])
    with torch.no_grad():
        q, k, v = attn.project(x, None)
        tril = torch.tril(torch.ones(T, T))
        assert q.size(-1) == k.size(-1) == 0  # no queries or keys: every score is 0
        assert torch.equal(attn.pattern(q, k), (tril / tril.sum(1, keepdim=True)).expand(3, TINY["n_head"], T, T))
        v = v.transpose(1, 2).reshape(3, T, -1)  # (B, T, C), heads side by side
        x_avg = torch.stack([torch.stack([v[b, :t + 1].mean(0) for t in range(T)]) for b in range(3)])
        got = attn.attend(q, k, attn.project(x, None)[2]).transpose(1, 2).reshape(3, T, -1)
    torch.testing.assert_close(got, x_avg, atol=1e-6, rtol=1e-6)


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


def test_rope_base_sets_the_rotary_frequencies():
    slow, fast = tiny_model(pos_emb="rope", rope_base=10000.0), tiny_model(pos_emb="rope", rope_base=10.0)
    idx = random_tokens((1, 12))
    with torch.no_grad():
        assert not torch.allclose(slow(idx, idx)[0], fast(idx, idx)[0])  # same weights, other angles


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_causal_variants_never_see_the_future(variant):
    model = tiny_model(attention_weights=0.5, **VARIANTS[variant])
    T = TINY["block_size"]
    idx = random_tokens((2, T))
    with torch.no_grad():
        ref, _ = model(idx, idx)
        for t in [0, 3, 9, T - 2]:
            changed = idx.clone()
            changed[:, t + 1:] = random_tokens((2, T - t - 1), seed=100 + t)
            logits, _ = model(changed, changed)
            torch.testing.assert_close(logits[:, :t + 1], ref[:, :t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(logits[:, t + 1:], ref[:, t + 1:], atol=1e-4)  # the future was read later


def test_the_encoder_sees_the_future():
    model = tiny_model(causal=False, attention_weights=0.5)
    idx = random_tokens((1, 10))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        assert not torch.allclose(model(idx, idx)[0][:, 0], model(changed, changed)[0][:, 0], atol=1e-4)


def test_bigram_logits_depend_only_on_the_current_token():
    model = tiny_model(n_layer=0, pos_emb="none")
    idx = random_tokens((3, TINY["block_size"]))
    with torch.no_grad():
        logits, _ = model(idx, idx)
        table, _ = model(torch.arange(TINY["vocab_size"])[:, None], torch.zeros(TINY["vocab_size"], 1).long())
    torch.testing.assert_close(logits, table[:, 0][idx])  # one row of a table per token, wherever it stands


def test_logits_without_targets_are_the_last_position():
    model = tiny_model(**MODERN)
    idx = random_tokens((3, 10))
    with torch.no_grad():
        full, loss = model(idx, idx)
        last, none = model(idx)
    assert none is None and loss.ndim == 0
    assert last.shape == (3, 1, TINY["vocab_size"])
    torch.testing.assert_close(last[:, 0], full[:, -1])


def test_softcap_is_a_scaled_tanh_of_the_raw_logits_and_bounds_them():
    capped = tiny_model(sharpen=300.0, **MODERN)
    raw = tiny_model(sharpen=300.0, **dict(MODERN, logit_softcap=0.0))
    idx = random_tokens((2, 8))
    with torch.no_grad():
        want = 15.0 * torch.tanh(raw(idx, idx)[0] / 15.0)
        got = capped(idx, idx)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert 10.0 < got.abs().max() <= 15.0 + 1e-4  # the cap was exercised


def test_loss_ignores_minus_one_targets():
    model = tiny_model()
    idx = random_tokens((2, 8))
    targets = idx.clone()
    targets[:, :4] = -1
    with torch.no_grad():
        logits, loss = model(idx, targets)
    want = F.cross_entropy(logits[:, 4:].reshape(-1, logits.size(-1)), idx[:, 4:].reshape(-1))
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_the_kv_cache_step_by_step_and_in_chunks_matches_the_full_forward(variant):
    """One token at a time, and several new tokens after cached ones (the masked branch of attention)."""
    model = tiny_model(attention_weights=0.5, **VARIANTS[variant])
    idx = random_tokens((2, 14))
    with torch.no_grad():
        full, _ = model(idx, idx)
        for chunks in [[(t, t + 1) for t in range(14)], [(0, 5), (5, 9), (9, 10), (10, 14)]]:
            cache = KVCache(model.config, 2, "cpu", torch.float32)
            for a, b in chunks:
                out, _ = model(idx[:, a:b], cache=cache)
                torch.testing.assert_close(out[:, -1], full[:, b - 1], atol=1e-5, rtol=1e-5)
            assert cache.pos == 14


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_kv_cache_generation_equals_full_context_generation(variant):
    model = tiny_model(sharpen=5.0, block_size=12, **VARIANTS[variant])  # confident: a wrong context shows
    idx = random_tokens((2, 3))
    runs = [generate(model, idx, 30, temperature=1.0, kv_cache=kv, generator=torch.Generator().manual_seed(3))
            for kv in (True, False)]  # 30 new tokens: the 12-token window slides several times
    assert torch.equal(runs[0], runs[1])


def test_an_encoder_generates_from_the_whole_context_every_step():
    model = tiny_model(causal=False)
    idx = random_tokens((1, 3))
    a = generate(model, idx, 15, temperature=0.0, kv_cache=True)
    assert torch.equal(a, generate(model, idx, 15, temperature=0.0, kv_cache=False))


@pytest.mark.parametrize("kv_cache", [True, False])
def test_generation_reads_only_the_last_block_of_context(kv_cache):
    """Tokens further back than block_size never reach the model: changing them changes nothing, while changing
    one inside the window does."""
    model = tiny_model(sharpen=20.0, block_size=8)
    prompt = random_tokens((1, 30))
    out = generate(model, prompt, 1, temperature=0.0, kv_cache=kv_cache)
    far = prompt.clone()
    far[:, :22] = random_tokens((1, 22), seed=5)  # all but the last 8 tokens
    assert torch.equal(generate(model, far, 1, temperature=0.0, kv_cache=kv_cache)[:, -1], out[:, -1])
    with torch.no_grad():
        logits, _ = model(prompt[:, -8:])
        near = prompt.clone()
        near[:, -8] = (near[:, -8] + 1) % TINY["vocab_size"]
        moved, _ = model(near[:, -8:])
    assert not torch.allclose(logits, moved)  # the first token of the window does matter


def test_forward_rejects_sequences_longer_than_block():
    with pytest.raises(ValueError, match="block_size"):
        tiny_model()(random_tokens((1, TINY["block_size"] + 1)))


@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_every_variant_decodes_with_bfloat16_weights(variant):
    """sample.py and the explorer may decode in bfloat16: every piece's weights must meet the values' dtype."""
    model = tiny_model(**VARIANTS[variant]).to(torch.bfloat16)
    assert generate(model, random_tokens((1, 3)), 15, temperature=0.0).shape == (1, 18)


def test_tied_and_untied_heads():
    tied = tiny_model()
    assert tied.lm_head.weight is tied.transformer.wte.weight
    untied = tiny_model(tie_weights=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert "wpe" not in tiny_model(pos_emb="rope").transformer


def test_token_shift_mixes_each_position_with_the_one_before():
    """What each branch reads, against a loop: h[t] + share * (h[t-1] - h[t]) of the normed stream h, zeros before
    the first position, a share per channel; the shares train under AdamW without weight decay, not Muon."""
    model = tiny_model(token_shift=True, bias=False)
    block = model.transformer.h[0]
    with torch.no_grad():
        for share in block.shares:
            share.uniform_(0, 1)
    x = torch.randn(2, 7, TINY["n_embd"])
    with torch.no_grad():
        for i, norm in enumerate((block.ln_1, block.ln_2)):
            h, share = norm(x), block.shares[i]
            want = torch.stack([h[:, t] + share * ((h[:, t - 1] if t else 0) - h[:, t]) for t in range(7)], dim=1)
            torch.testing.assert_close(block.branch_input(x, i), want)
    adamw, muon = schedulable(model.configure_optimizers(TrainConfig(optimizer="muon", weight_decay=0.1)))
    shares = {id(p) for b in model.transformer.h for p in b.shares}
    assert len(shares) == 2 * TINY["n_layer"] and not shares & {id(p) for g in muon.param_groups for p in g["params"]}
    assert all(g["weight_decay"] == 0 for g in adamw.param_groups if shares & {id(p) for p in g["params"]})
    plain = tiny_model().transformer.h[0]
    assert not plain.shares and plain.shift is None  # off by default: GPT-2's blocks


@pytest.mark.parametrize("norm,bias", [("layernorm", False), ("layernorm", True), ("rmsnorm", False)])
def test_a_norm_gives_the_same_gradients_on_one_thread_and_on_two(norm, bias):
    """A run that follows the machine's load changes its thread count; its weights stay those of a run that never
    did only where every gradient is summed in one order on any count (torch's fused LayerNorm sums its gain's over
    each thread's rows, then the threads'). A batch of the main job's size, so that torch splits the work."""
    layer = Norm(GPTConfig(n_embd=128, n_head=4, norm=norm, bias=bias))
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p))
    x, grad = torch.randn(32, 128, 128), torch.randn(32, 128, 128)
    before, grads = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            grads.append(torch.autograd.grad(layer(x), list(layer.parameters()), grad))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(one, two) for one, two in zip(*grads))


def test_zero_init_proj():
    projs = [p for n, p in tiny_model(zero_init_proj=True).named_parameters() if n.endswith("c_proj.weight")]
    assert len(projs) == 2 * TINY["n_layer"] and all(torch.count_nonzero(p) == 0 for p in projs)


def test_optional_parts_exist_only_where_configured():
    """A block without its MLP has no MLP, second norm or the hook points that go with them; uniform attention
    projects values only."""
    block = tiny_model(mlp=False).transformer.h[0]
    assert block.mlp is None and not hasattr(block, "ln_2") and not hasattr(block, "hook_mlp_out")
    assert SelfAttention(GPTConfig(**TINY, attention="uniform")).c_attn.out_features == TINY["n_embd"]


@pytest.mark.parametrize("bad,message", [
    (dict(n_embd=30, n_head=4), "divisible"),
    (dict(n_embd=36, n_head=4, pos_emb="rope"), "even head size"),  # head size 9 cannot rotate in pairs
    (dict(pos_emb="alibi"), "pos_emb must be one of learned, rope"),
    (dict(n_layer=-1), "n_layer must be at least 0"),
    (dict(attention="uniform", qk_norm=True), "uniform.*no queries or keys"),
    (dict(attention="uniform", pos_emb="rope"), "no queries or keys"),
    (dict(attention="additive", pos_emb="rope"), "adds them"),
    (dict(dropout=1.0), "dropout"),
    (dict(lora_rank=-1), r"lora_rank must be at least 0 \(got -1\)"),
    (dict(n_embd=32, n_head=4, lora_rank=33), "lora_rank 33 is larger than the width n_embd=32: an adapter of full"),
    (dict(lora_rank=4, lora_alpha=0.0), "lora_alpha must be above 0"),
    (dict(logit_softcap=float("inf")), r"logit_softcap must be a finite number \(got inf\)"),  # a hand-edited file's
    (dict(rope_base=float("nan")), r"rope_base must be a finite number \(got nan\)"),
])
def test_config_refuses_what_cannot_be_built(bad, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**bad)
    GPTConfig(n_embd=32, n_head=4)  # a valid one is fine


def test_flops_per_token_by_hand():
    """PaLM's count (appendix B): 6 FLOPs per token for each parameter but the embedding tables (2 forward,
    4 backward; norm gains included, the head counted even when tied), plus attention's QK^T and AV:
    2 matmuls x 2 FLOPs x T keys x C per layer, times 3 for the backward pass."""
    L, C, V, T = 2, 32, 37, 16
    per_layer = C + 3 * C * C + C * C + C + 4 * C * C + 4 * C * C  # ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
    n = L * per_layer + C + V * C  # the blocks, ln_f and the head
    model = tiny_model(bias=False)
    assert model.flops_per_token(T) == 6 * n + L * 2 * 2 * T * C * 3
    assert tiny_model(bias=False, tie_weights=False).flops_per_token(T) == model.flops_per_token(T)


# ---------------------------------------------------------------------------------------------- hook points

@pytest.mark.parametrize("variant", ["scaled", "modern", "token_shift", "additive", "uniform", "attention_only"])
def test_watched_activations_are_the_ones_the_forward_pass_computes(variant):
    """With every hook point watched (the scores and the pattern written out), the logits are the unwatched
    forward pass's; the pattern holds the weights the values are averaged with, the streams add up, the final
    norm's scale is the spread of the stream it normalizes, and nothing is watched once the block ends."""
    model = tiny_model(attention_weights=0.5, **VARIANTS[variant])
    idx = random_tokens((2, 9))
    with torch.no_grad():
        want = model(idx, idx)[0]
        cache = {}
        with hooked(model, {name: lambda x, name: cache.__setitem__(name, x) for name in hook_points(model)}):
            got = model(idx, idx)[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        z = cache["blocks.0.attn.hook_pattern"] @ cache["blocks.0.attn.hook_v"].transpose(1, 2)
        torch.testing.assert_close(z.transpose(1, 2), cache["blocks.0.attn.hook_z"], atol=1e-6, rtol=1e-5)
        mid = "blocks.0.hook_resid_mid" if "blocks.0.hook_resid_mid" in cache else "blocks.0.hook_resid_post"
        torch.testing.assert_close(cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"], cache[mid])
        final = cache[f"blocks.{model.config.n_layer - 1}.hook_resid_post"]
        spread = (final - final.mean(-1, keepdim=True)) if model.config.norm == "layernorm" else final
        torch.testing.assert_close(cache["ln_final.hook_scale"], (spread.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
                                   if model.config.norm == "layernorm" else
                                   (spread.pow(2).mean(-1, keepdim=True) + torch.finfo(final.dtype).eps).sqrt())
    assert not any(point.hooked for point in hook_points(model).values())


def test_a_hook_that_returns_a_tensor_replaces_the_activation():
    """Zeroing head 1's output of layer 0 by a hook is zeroing its slice of the output projection's input."""
    model = tiny_model(attention_weights=0.5)
    idx = random_tokens((1, 6))

    def zero_head_1(z, name):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    with torch.no_grad(), hooked(model, {"blocks.0.attn.hook_z": zero_head_1}):
        ablated = model(idx, idx)[0]
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight[:, 8:16] = 0  # head 1's columns
        torch.testing.assert_close(ablated, model(idx, idx)[0])


# ----------------------------------------------------------------------------------------------- the optimizers

@pytest.mark.parametrize("tie", [True, False])
def test_muon_gets_only_hidden_matrices(tie):
    cfg = train_config(optimizer="muon", tie_weights=tie)
    model = tiny_model(config=cfg.model, vocab_size=20)
    adamw, muon = schedulable(model.configure_optimizers(cfg))
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = sorted(names[i] for i in muon_ids)
    assert in_muon and all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    assert all(".h." in f".{n}" and n.endswith(".weight") for n in in_muon)
    assert not any(n.startswith(("transformer.wte", "transformer.wpe", "lm_head")) for n in in_muon)
    adam_ids = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert not muon_ids & adam_ids
    assert muon_ids | adam_ids == {id(p) for p in model.parameters()}  # every parameter trained once
    # additive attention's (heads, head size) score vectors: 2-D, but no map from one space to another
    additive = tiny_model(config=train_config(attention="additive", optimizer="muon").model, vocab_size=20)
    _, muon = schedulable(additive.configure_optimizers(train_config(attention="additive", optimizer="muon")))
    assert all(p is not additive.transformer.h[0].attn.score_v for p in muon.param_groups[0]["params"])


def test_adamw_decays_matrices_not_gains():
    cfg = train_config(bias=True)
    model = tiny_model(config=cfg.model, vocab_size=20)
    (adamw,) = schedulable(model.configure_optimizers(cfg))
    for group in adamw.param_groups:
        assert all((p.ndim >= 2) == (group["weight_decay"] > 0) for p in group["params"])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("embedding_lr", [0.0, 0.05])
def test_embeddings_get_their_own_learning_rate(optimizer, embedding_lr):
    cfg = train_config(optimizer=optimizer, learning_rate=1e-3, embedding_lr=embedding_lr)
    model = tiny_model(config=cfg.model, vocab_size=20)
    adamw = schedulable(model.configure_optimizers(cfg))[0]
    lr_of = {id(p): g["lr"] for g in adamw.param_groups for p in g["params"]}
    assert lr_of[id(model.transformer.wte.weight)] == lr_of[id(model.transformer.wpe.weight)] == (embedding_lr or 1e-3)
    others = [lr for pid, lr in lr_of.items() if pid not in (id(model.transformer.wte.weight),
                                                               id(model.transformer.wpe.weight))]
    assert others and all(lr == 1e-3 for lr in others)  # the head, gains (and, with AdamW, every matrix)
    set_lr([adamw], 0.5)  # the schedule scales each group's own peak
    assert {g["lr"] for g in adamw.param_groups} == {0.5 * lr for lr in set(lr_of.values())}


def test_describe_names_a_setting_added_since_where_it_is_not_at_its_default():
    """The explorer lists a run by GPTConfig.describe(): a learner's new option (here attn_scale, added to a
    copy of the config) is named once set, and the words stay as they were at its default."""
    from dataclasses import make_dataclass

    Extended = make_dataclass("Extended", [("attn_scale", float, 1.0)], bases=(GPTConfig,))
    assert Extended().describe() == GPTConfig().describe() == (
        "12 layers, 12 heads, width 768, scaled dot-product attention, causal (a decoder), learned positions, "
        "context 1024")
    assert Extended(attn_scale=0.5).describe() == GPTConfig().describe() + ", attn_scale=0.5"
    assert GPTConfig(mlp=False, qk_norm=True).describe().endswith("context 1024, no MLP")  # left to the details


# ----------------------------------------------------------------------------------------------- LoRA

LORA_BASE = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=50, block_size=16, bias=True, tie_weights=False)
ADAPTED = ("attn.c_attn", "mlp.c_fc")  # the matrices of each block that read the residual stream


def adapter_names(n_layer=LORA_BASE["n_layer"]):
    blocks = {f"transformer.h.{i}.{m}" for i in range(n_layer) for m in ADAPTED}
    return {f"{m}.lora_{ab}" for m in blocks | {"transformer.wte", "lm_head"} for ab in "AB"}


def lora_model(seed=0, **overrides):
    """A LoRA GPT of LORA_BASE at rank 4, its adapters' B drawn at random (0 at init) so that they change
    the output."""
    model = tiny_model(seed, config=GPTConfig(**LORA_BASE, lora_rank=4), **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.05)
    return model


def test_lora_starts_as_the_base_model():
    """B starts at zero: a LoRA model holding a base model's weights (only its adapters missing from them)
    computes the base model's logits exactly."""
    base = tiny_model(config=GPTConfig(**LORA_BASE))
    adapted = tiny_model(seed=1, config=GPTConfig(**LORA_BASE, lora_rank=4))
    result = adapted.load_state_dict(base.state_dict(), strict=False)
    assert set(result.missing_keys) == adapter_names() and not result.unexpected_keys
    assert all(torch.count_nonzero(p) == 0 for n, p in adapted.named_parameters() if n.endswith("lora_B"))
    assert all(torch.count_nonzero(p) > 0 for n, p in adapted.named_parameters() if n.endswith("lora_A"))
    idx = random_tokens((2, 16), vocab=50)
    with torch.no_grad():
        assert torch.equal(adapted(idx, idx)[0], base(idx, idx)[0])


def test_merged_weights_compute_what_the_adapters_do():
    """merge_lora folds each W + (α/r)·B A into a plain model's weights: the same logits, in float32 and under
    bfloat16 autocast; a model's own weights in bfloat16 stay in bfloat16; without adapters nothing changes."""
    adapted = lora_model(lora_alpha=8.0)
    weights, config = merge_lora(adapted.state_dict(), adapted.config)
    assert config.lora_rank == 0 and not any("lora" in name for name in weights)
    assert set(weights) == set(tiny_model(config=config).state_dict())
    plain = GPT(config).eval()
    plain.load_state_dict(weights)
    base = tiny_model(config=config)  # the same seed's base weights, without the update
    base.load_state_dict({n: t for n, t in adapted.state_dict().items() if "lora" not in n})
    idx = random_tokens((2, 16), vocab=50)
    with torch.no_grad():
        want = adapted(idx, idx)[0]
        assert (want - base(idx, idx)[0]).abs().max() > 0.05 * want.abs().max()  # the update matters
        torch.testing.assert_close(plain(idx, idx)[0], want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = plain(idx, idx)[0].float(), adapted(idx, idx)[0].float()
        assert (got - want).abs().max() <= 0.03 * want.abs().max()
    halves, _ = merge_lora({n: t.bfloat16() for n, t in adapted.state_dict().items()}, adapted.config)
    assert all(t.dtype == torch.bfloat16 for t in halves.values())
    assert merge_lora(weights, config) == (weights, config)


def test_an_adapter_with_dropout_on_its_input_merges_as_the_trained_model_runs(monkeypatch):
    """A learner's LoRALinear with dropout on the adapter's input (PEFT's lora_dropout): merging reads forward off
    in eval mode, where the dropout is off, so the adapters fold into plain matrices that compute what they do."""
    import model as model_py

    def forward(self, x):
        update = F.linear(F.linear(F.dropout(x, 0.5, self.training), self.lora_A), self.lora_B)
        return F.linear(x, self.weight, self.bias) + self.scale * update
    monkeypatch.setattr(model_py.LoRALinear, "forward", forward)
    adapted = lora_model(lora_alpha=8.0).eval()
    weights, config = merge_lora(adapted.state_dict(), adapted.config)
    plain = GPT(config).eval()
    plain.load_state_dict(weights)
    idx = random_tokens((2, 16), vocab=50)
    with torch.no_grad():
        want = adapted(idx, idx)[0]
        torch.testing.assert_close(plain(idx, idx)[0], want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_lora_needs_an_untied_head():
    with pytest.raises(ValueError, match=r"^lora_rank needs an untied head \(tie_weights=False\)"):
        GPT(GPTConfig(**dict(LORA_BASE, tie_weights=True), lora_rank=4))


def test_lora_trains_only_the_adapters():
    """With lora_rank > 0 everything is frozen but the adapters (on q, k, v, the MLP's first matrix, the token
    table and the head); they go to AdamW (none to Muon), and a step moves no frozen weight. At rank 8 on the
    chat lesson's model (3 layers of 128, 78 tokens) they are under 5% of it."""
    cfg = train_config(lora_rank=4, optimizer="muon", tie_weights=False, learning_rate=1e-2)
    model = tiny_model(config=cfg.model, vocab_size=20).train()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == adapter_names(cfg.model.n_layer)
    assert model.trainable_params() == sum(p.numel() for n, p in model.named_parameters() if n in trained)
    (adamw,) = schedulable(model.configure_optimizers(cfg))
    decayed = {id(p) for g in adamw.param_groups if g["weight_decay"] == cfg.weight_decay for p in g["params"]}
    assert {id(p) for n, p in model.named_parameters() if "lora" in n} <= decayed
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = random_tokens((4, 17), vocab=20)
    for _ in range(2):  # the second step moves A too: B is no longer zero
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        adamw.step()
        model.zero_grad(set_to_none=True)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == trained
    chat = GPT(GPTConfig(n_layer=3, n_head=4, n_embd=128, vocab_size=78, tie_weights=False, lora_rank=8))
    assert chat.trainable_params() / chat.num_params(non_embedding=False) < 0.05


def adapter_gradients(threads, autocast):
    """The gradients of a LoRA layer of the chat lesson's MLP width (128 to 512 at rank 8) on 4,096 tokens, on a
    number of threads, for 20 draws of its weights and inputs."""
    from model import LoRALinear

    torch.set_num_threads(threads)
    grads = []
    for seed in range(20):
        torch.manual_seed(seed)
        layer = LoRALinear(128, 512, False, 8, 16.0)
        torch.nn.init.normal_(layer.lora_B, std=0.02)  # as trained a while: zero B would give A exact zeros
        x, dy = torch.randn(32, 128, 128), torch.randn(32, 128, 512)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = layer(x)
        (y.float() * dy).sum().backward()
        grads += [layer.lora_A.grad, layer.lora_B.grad]
    return grads


def test_lora_gradients_are_summed_alike_on_any_thread_count_in_bfloat16():
    """Through the narrow r, B's gradient sums over every token into r columns, which bfloat16's CPU kernels sum in
    another order on 2 threads than on 1: the update is folded into the matrix, so a run whose threads follow the
    machine's load ends with the weights of the same run idle. (Where this CPU's float32 sums themselves follow the
    thread count, the run's own probe pins its threads, and there is nothing to test.)"""
    most = torch.get_num_threads()
    try:
        if not all(torch.equal(a, b) for a, b in zip(adapter_gradients(1, False), adapter_gradients(2, False))):
            pytest.skip("this CPU's float32 sums follow the thread count")
        assert all(torch.equal(a, b) for a, b in zip(adapter_gradients(1, True), adapter_gradients(2, True)))
    finally:
        torch.set_num_threads(most)


# ----------------------------------------------------------------------------------------------- one place

SINUSOIDAL = ("        elif self.config.pos_emb == \"rope\":",
              "        elif self.config.pos_emb == \"sinusoidal\":  # Vaswani et al.'s fixed table\n"
              "            half = torch.arange(0, self.config.n_embd, 2, device=idx.device) / self.config.n_embd\n"
              "            angles = positions.float()[:, None] / 10000.0 ** half\n"
              "            x = x + torch.cat((angles.sin(), angles.cos()), dim=-1)\n"
              "        elif self.config.pos_emb == \"rope\":")
EXPLORER_ASKS = """
import json, sys
from fastapi.testclient import TestClient
from gptkit.explorer.app import make_app
from gptkit.explorer.shelf import Shelf
app = TestClient(make_app(Shelf(sys.argv[1], "cpu", "float32")), base_url="http://127.0.0.1:8000")
print(json.dumps({"runs": app.get("/api/runs").json(), "run": app.get("/api/runs/out").json()}))
"""


def project_copy(folder, edits):
    """The project's files copied into folder, with model.py's text edited: [(old, new)], each found."""
    folder.mkdir()
    for part in ("model.py", "train.py", "sample.py", "analyze.py", "gptkit", "config"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, folder / part)
    text = (REPO / "model.py").read_text()
    for old, new in edits:
        assert len(re.findall(re.escape(old), text)) == 1, old
        text = text.replace(old, new)
    (folder / "model.py").write_text(text)
    return folder


@pytest.mark.slow
def test_a_new_positional_encoding_in_model_py_alone_reaches_every_tool(tmp_path, data_dir):
    """Issue 64: 'sinusoidal' added to pos_emb's Literal and to GPT.embed, nothing else changed: --help offers it,
    it trains 20 steps (its FLOPs per token, what MFU divides, counted), sample.py writes, analyze.py heads reads
    its heads, the explorer lists and describes it, and its checkpoint loads."""
    literal = re.search(r"pos_emb: Literal\[[^\]]*\"none\"", (REPO / "model.py").read_text()).group(0)
    project = project_copy(tmp_path / "project", [(literal, literal + ", \"sinusoidal\""), SINUSOIDAL])
    (project / "runs").mkdir()
    out = project / "runs" / "out"

    def command(*args):
        return check_ok(subprocess.run([sys.executable, *map(str, args)], cwd=project, capture_output=True,
                                       text=True, timeout=300))
    assert "sinusoidal" in command("train.py", "--help").stdout
    trained = command("train.py", *train_args(data_dir, out, "--pos_emb=sinusoidal", "--max_iters=20",
                                              "--eval_interval=10", "--log_interval=10"))
    assert "optimizers: AdamW" in trained.stdout and "final: val loss" in trained.stdout
    run = next(json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"run"' in line)
    assert run["flops_per_token"] > 6 * run["params"]
    assert command("sample.py", f"--out_dir={out}", "--max_new_tokens=8", "--num_samples=1").stdout.strip()
    heads = json.loads(command("analyze.py", "heads", out, "--json", f"--output={out / 'heads.png'}").stdout)
    assert len(heads["heads"]) == 2  # one layer of two heads
    answers = json.loads(command("-c", EXPLORER_ASKS, project / "runs").stdout)
    listed = next(r for r in answers["runs"]["runs"] if r["name"] == "out")
    assert "pos_emb='sinusoidal'" in listed["settings"] and listed["params"] == run["params"]
    assert answers["run"]["settings"] == listed["settings"]
    loaded = command("-c", "import sys; from gptkit.run.run_folder import model_at; "
                     "print(model_at(sys.argv[1])[0].config.pos_emb)", out / "best.pt")
    assert loaded.stdout.split()[-1] == "sinusoidal"


def test_an_optimizer_edited_in_configure_optimizers_is_the_one_that_trains(tmp_path, data_dir, monkeypatch):
    """Issue 64: configure_optimizers returning SGD at lr=1e-9 leaves the loss where it started after 20 steps,
    where the unedited method lowers it by more than a nat; the console names SGD, and metrics its rate."""
    import train
    from model import GPT

    def losses(out):
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["iter"]: r for r in records if r["kind"] == "train"}

    args = ["--max_iters=20", "--log_interval=1", "--eval_interval=20", "--learning_rate=2e-2", "--decay_lr=False",
            "--batch_size=16"]
    train.main(train_args(data_dir, tmp_path / "adamw", *args))
    plain = losses(tmp_path / "adamw")
    assert plain[1]["loss"] - plain[20]["loss"] > 1.0
    monkeypatch.setattr(GPT, "configure_optimizers", lambda self, cfg, dtype: torch.optim.SGD(self.parameters(),
                                                                                              lr=1e-9))
    train.main(train_args(data_dir, tmp_path / "sgd", *args))
    edited = losses(tmp_path / "sgd")
    assert abs(edited[20]["loss"] - edited[1]["loss"]) < 0.01 and "sgd_lr" in edited[20]
