"""Decoding (gptkit/sampling/decoding.py): the KV cache against full recompute, also past block_size, with a window that
slides by half a block and holds only itself however many tokens; seeded sampling; top-k, top-p and temperature;
and the layout for decoding, which changes no value, tie or token."""

import pytest
import torch
import torch.nn.functional as F

from conftest import random_tokens, tiny_model
from gptkit.sampling import decoding
from gptkit.sampling.decoding import lay_out_for_decoding, sample_next


def generate(model, idx, n, kv_cache, seed=7, **kwargs):
    return decoding.generate(model, idx, n, kv_cache=kv_cache, generator=torch.Generator().manual_seed(seed), **kwargs)


def recorded_logits(model, idx, n, kv_cache, seed=7, **kwargs):
    """The tokens and the logits of every step, as decode_steps samples them (generate's seed by default)."""
    steps = list(decoding.decode_steps(model, idx, n, kv_cache=kv_cache, generator=torch.Generator().manual_seed(seed),
                                       **kwargs))
    return torch.cat([idx] + [token for token, _, _ in steps], dim=1), torch.stack([logits for _, logits, _ in steps])


# ----------------------------------------------------------------------------- KV cache vs full recompute

@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0),
                                      dict(temperature=0.8, top_k=10, top_p=0.9)],
                         ids=["greedy", "seeded", "topk_topp"])
def test_cache_matches_full_recompute_past_block_size(pos_emb, sampling):
    """3.5 blocks of new tokens: the window slides several times; every step's logits and token agree."""
    model = tiny_model(sharpen=8.0, pos_emb=pos_emb)
    idx = random_tokens((3, 5), seed=3)
    cached, logits_cached = recorded_logits(model, idx, 56, True, **sampling)
    full, logits_full = recorded_logits(model, idx, 56, False, **sampling)
    assert cached.shape == (3, 5 + 56)
    torch.testing.assert_close(logits_cached, logits_full, rtol=1e-4, atol=1e-4)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_prompt_longer_than_block_size(pos_emb):
    model = tiny_model(sharpen=8.0, pos_emb=pos_emb)
    idx = random_tokens((1, 40), seed=3)  # 2.5 blocks: only the last block is seen
    a, b = generate(model, idx, 20, True, temperature=0.0), generate(model, idx, 20, False, temperature=0.0)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :40], idx)
    # the continuation depends only on the last block of the prompt
    c = generate(model, idx[:, -16:], 20, True, temperature=0.0)
    assert torch.equal(a[:, 40:], c[:, 16:])


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
@pytest.mark.parametrize("kv_cache", [True, False])
def test_window_slides_by_half_a_block(pos_emb, kv_cache):
    """Every forward stays inside block_size; once full, the context restarts from the last half block."""
    model = tiny_model(sharpen=8.0, pos_emb=pos_emb)
    calls = []  # (cache position before the call, tokens fed)

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        calls.append((cache.pos if cache is not None else 0, args[0].size(1)))

    # asked once a model, before its first decoding: not counted below
    assert not decoding.sees_ahead(model) and decoding.cache_agrees(model)
    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        generate(model, random_tokens((1, 3), seed=3), 40, kv_cache, temperature=0.0)
    finally:
        handle.remove()
    assert len(calls) == 40
    assert all(start + fed <= 16 for start, fed in calls)
    contexts = [start + fed for start, fed in calls]  # tokens the model saw at each step
    # 3 prompt tokens grow to a full block, then slide to 8 and grow again
    assert contexts[:14] == list(range(3, 17))
    assert contexts[14:23] == list(range(8, 17))
    assert contexts[23:32] == list(range(8, 17))
    if kv_cache:  # re-prefilled exactly at the slides, one token per step otherwise
        assert [fed for _, fed in calls if fed > 1] == [3, 8, 8, 8]


@pytest.mark.parametrize("kv_cache", [True, False])
def test_decoding_holds_only_the_window_however_many_tokens(monkeypatch, kv_cache):
    """The tokens before the window are dropped: a huge --max_new_tokens streams in bounded memory, each step as
    fast as the first (it grew a tensor of every token so far and copied it at each step)."""
    widths, cat = [], torch.cat

    def spy(tensors, dim=0, **kwargs):
        if dim == 1 and tensors[0].dtype == torch.long:  # the running context, with the new token
            widths.append(tensors[0].size(1))
        return cat(tensors, dim=dim, **kwargs)

    monkeypatch.setattr(torch, "cat", spy)
    steps = decoding.generate_stream(tiny_model(sharpen=8.0), random_tokens((1, 40), seed=3), 200, kv_cache=kv_cache,
                                     temperature=0.0)
    assert sum(1 for _ in steps) == 200
    assert len(widths) == 200 and max(widths) <= 16


def test_the_cache_takes_each_layers_keys_and_values_as_they_come():
    """Heads of another width than n_embd // n_head (a learner's model.py that sizes them itself), and keys of
    none (uniform attention): each layer's cache is shaped by its first keys and values, and returns all so far."""
    config = tiny_model().config  # 2 heads of 16 by its settings
    cache = decoding.KVCache(config, 2, "cpu", torch.float32)
    k, v = torch.randn(2, 2, 5, 0), torch.randn(2, 2, 5, 3)
    assert [t.shape for t in cache.update(0, k, v)] == [k.shape, v.shape]
    cache.pos = 5
    k2, v2 = torch.randn(2, 2, 1, 0), torch.randn(2, 2, 1, 3)
    keys, values = cache.update(0, k2, v2)
    assert torch.equal(values, torch.cat([v, v2], 2)) and keys.shape == (2, 2, 6, 0)


def test_a_mask_removed_by_hand_decodes_from_the_whole_context_as_an_encoder_does(monkeypatch):
    """A learner's model.py whose attention lost its causal mask, its settings still causal: the model is asked
    whether it sees ahead, and decodes as the encoder it is, each step from the whole window, not from cached
    keys the earlier positions computed before the later tokens came."""
    import model as model_py

    model = tiny_model(sharpen=5.0, attention_weights=0.5)
    assert not decoding.sees_ahead(model)
    monkeypatch.setattr(model_py.SelfAttention, "sdpa", lambda self, q, k, v: F.scaled_dot_product_attention(q, k, v))
    unmasked = tiny_model(sharpen=5.0, attention_weights=0.5)
    assert decoding.sees_ahead(unmasked) and unmasked.config.causal
    idx = random_tokens((1, 3))
    runs = [generate(unmasked, idx, 10, temperature=0.0, kv_cache=kv) for kv in (True, False)]
    assert torch.equal(runs[0], runs[1])


def test_an_edit_the_cache_computes_otherwise_decodes_from_the_whole_window_with_a_note(monkeypatch, capsys):
    """A learner's Block.forward that adds the mean of the positions it is given (a bag of words), right in
    training's full pass: with the cache it would see one position a step. Decoding notes it once and gives the
    tokens and logits of decoding without the cache; an unedited model keeps its cache, and says nothing."""
    import model as model_py

    monkeypatch.setattr(decoding, "NOTED", [])
    assert decoding.cache_agrees(tiny_model(sharpen=5.0)) and capsys.readouterr().err == ""
    forward = model_py.Block.forward

    def averaging(self, x, *args, **kwargs):  # an edit: each position adds the mean of those up to it
        x = x + x.cumsum(1) / torch.arange(1, x.size(1) + 1)[None, :, None]
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(model_py.Block, "forward", averaging)
    model, idx = tiny_model(sharpen=5.0), random_tokens((1, 3))
    cached, uncached = (recorded_logits(model, idx, 10, kv_cache=kv, temperature=0.0) for kv in (True, False))
    assert torch.equal(cached[0], uncached[0]) and torch.equal(cached[1], uncached[1])
    assert not decoding.cache_agrees(model) and not decoding.cache_agrees(tiny_model(sharpen=5.0))
    assert capsys.readouterr().err.count("note: decoding with the KV cache gives other logits") == 1


def test_an_edit_that_fails_on_the_caches_steps_decodes_from_the_whole_window_with_a_note(monkeypatch, capsys):
    """The notes' averaging loop as a learner writes it into uniform attention: one output per value, right in
    training, where every position is a query; with the cache, one query and all the keys, and the reshape after it
    raised (sample.py and the explorer's every run, a traceback). Now decoding notes it and decodes as training
    computes, from the whole window."""
    import model as model_py

    def averaged(self, q, k, v):  # the mean of each position's past, a row per value
        out = torch.zeros_like(v)
        for t in range(v.size(2)):
            out[:, :, t] = v[:, :, :t + 1].mean(2)
        return out
    monkeypatch.setattr(model_py.SelfAttention, "written", averaged)
    monkeypatch.setattr(decoding, "NOTED", [])
    model, idx = tiny_model(sharpen=5.0, attention="uniform"), random_tokens((1, 3))
    assert torch.equal(generate(model, idx, 10, kv_cache=True, temperature=0.0),
                       generate(model, idx, 10, kv_cache=False, temperature=0.0))
    assert capsys.readouterr().err.startswith("note: model.py's forward fails on the KV cache's one-token steps (")


def test_a_forward_written_as_nanogpt_s_without_a_cache_decodes_from_the_whole_window(monkeypatch, capsys):
    import model as model_py

    def forward(self, idx, targets=None):  # an edit: nanoGPT's forward, which takes no cache
        x = self.embed(idx)[0]
        for block in self.transformer.h:
            x = block(x)
        logits = self.head(self.transformer.ln_f(x))
        return logits, None if targets is None else self.token_loss(logits, targets)

    model, idx = tiny_model(sharpen=5.0), random_tokens((1, 3))
    want = generate(model, idx, 10, kv_cache=False, temperature=0.0)
    monkeypatch.setattr(model_py.GPT, "forward", forward)
    monkeypatch.setattr(decoding, "NOTED", [])
    assert torch.equal(generate(model, idx, 10, kv_cache=True, temperature=0.0), want)
    assert capsys.readouterr().err == ("note: model.py's GPT.forward takes no cache: each token is decoded from the "
                                       "whole window instead, as training computes it\n")


def test_same_seed_same_text_and_batch_rows_differ():
    model = tiny_model()
    idx = random_tokens((4, 4), seed=3)
    a, b = generate(model, idx, 30, True, seed=11), generate(model, idx, 30, True, seed=11)
    assert torch.equal(a, b)
    assert len({tuple(row[4:].tolist()) for row in a}) > 1  # one batch, independent samples
    assert not torch.equal(a, generate(model, idx, 30, True, seed=12))


def test_decoding_layout_keeps_values_ties_and_tokens():
    model = tiny_model(sharpen=8.0)
    assert model.transformer.wte.weight is model.lm_head.weight  # tied, as GPT-2's head
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = random_tokens((1, 4), seed=3)
    want = generate(model, idx, 20, True, temperature=0.0)
    lay_out_for_decoding(model)
    assert model.lm_head.weight.t().is_contiguous()  # the layout did change
    assert model.transformer.wte.weight is model.lm_head.weight
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert torch.equal(generate(model, idx, 20, True, temperature=0.0), want)


# ----------------------------------------------------------------------------- sampling controls

def test_top_p_one_is_plain_sampling():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    for temperature in (1.0, 0.7):
        got = sample_next(logits, temperature=temperature, top_p=1.0, generator=torch.Generator().manual_seed(4))
        plain = torch.multinomial((logits / temperature).softmax(-1), 1, generator=torch.Generator().manual_seed(4))
        assert torch.equal(got, plain)


def test_tiny_top_p_is_greedy():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(1))
    greedy = sample_next(logits, temperature=0.0)
    assert torch.equal(greedy, logits.argmax(-1, keepdim=True))
    for seed in range(5):
        got = sample_next(logits, temperature=1.5, top_p=1e-9, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got, greedy)


def test_top_p_keeps_the_smallest_covering_set():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.7 keeps the first two, top_p=0.8 still two, 0.81 three
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for top_p, allowed in ((0.5, {0}), (0.7, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2})):
        g = torch.Generator().manual_seed(0)
        drawn = {sample_next(logits, top_p=top_p, generator=g).item() for _ in range(300)}
        assert drawn == allowed, top_p


def test_top_k_and_temperature_zero():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    assert {sample_next(logits, temperature=5.0, top_k=2, generator=g).item() for _ in range(200)} == {1, 2}
    assert sample_next(logits, temperature=0.0, top_k=2).item() == 1


def test_logits_no_token_can_be_drawn_from_are_one_line():
    """A learner's model.py that computes NaN logits: sampling says so rather than torch's multinomial failing."""
    from gptkit.base.errors import UserError

    logits = torch.tensor([[0.0, float("nan"), 1.0]])
    with pytest.raises(UserError, match="^the model's logits hold NaN or infinity, which no token can be drawn from"):
        sample_next(logits, temperature=1.0)
