"""gptkit/interp/experiments.py: hooks and caches as TransformerLens gives them, ablation against the same change made
by hand, the batched ablation deltas against one pass per head, the head scores on heads whose behaviour is known
(set by hand, or grown by training), patching's two ends, and attribution's parts summing to the logit."""

import numpy as np
import pytest
import torch

from conftest import MODERN, REPO, random_tokens, tiny_model
from gptkit.base.errors import UserError
from gptkit.data.tokenizer import CharTokenizer
from gptkit.interp import experiments
from gptkit.interp.experiments import (KINDS, Run, ablated, ablation_deltas, attribute, chance_scores, head_labels,
                                       head_scores, patching, repeated_tokens, run_patched, run_with_cache,
                                       run_with_hooks, token_losses)
from gptkit.interp.hooks import hook_points

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZa"  # 37 characters: TINY's vocabulary
ARCHS = {"gpt2": {}, "modern": MODERN, "token_shift": dict(MODERN, token_shift=True)}


def tiny_run(**overrides):
    return Run(tiny_model(attention_weights=0.5, **overrides), CharTokenizer(CHARS), "nowhere")


def by_hand(model, idx, heads=(), mlps=(), head_value=None, mlp_value=None):
    """Every position's logits with heads' slices of each c_proj's input and mlps' outputs replaced (0, or the
    values given), by plain torch hooks on the projection and the MLP module: no hook point involved."""
    D = model.config.n_embd // model.config.n_head
    handles = []
    for layer, head in heads:
        def slice_off(module, args, head=head, layer=layer):
            x = args[0].clone()
            x[..., head * D:(head + 1) * D] = 0 if head_value is None else head_value[layer][head]
            return (x,)
        handles.append(model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(slice_off))
    for layer in mlps:
        handles.append(model.transformer.h[layer].mlp.register_forward_hook(
            lambda module, args, out, layer=layer: torch.zeros_like(out) if mlp_value is None
            else mlp_value[layer].expand_as(out)))
    try:
        with torch.no_grad():
            return model(idx, idx)[0]
    finally:
        for handle in handles:
            handle.remove()


# ----------------------------------------------------------------------------- hooks and caches


def test_run_with_cache_keeps_every_hook_and_every_position_s_logits():
    run = tiny_run()
    idx = random_tokens((2, 9))
    logits, cache = run.run_with_cache(idx)
    assert set(cache) == set(hook_points(run.model)) and logits.shape == (2, 9, 37)
    torch.testing.assert_close(logits, run.model(idx, idx)[0])
    _, some = run.run_with_cache(idx, lambda name: name.endswith("hook_pattern"))
    assert list(some) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert list(run.run_with_cache(idx, "hook_embed")[1]) == ["hook_embed"]


def test_run_with_hooks_calls_functions_as_transformer_lens_does_and_leaves_none_behind():
    run = tiny_run()
    idx = run.tokens("ROMEO: a")
    seen = []

    def zero_head_1(z, hook):
        seen.append((hook.name, hook.layer(), tuple(z.shape)))
        z = z.clone()
        z[:, :, 1] = 0
        return z

    logits = run.run_with_hooks(idx, fwd_hooks=[("blocks.1.attn.hook_z", zero_head_1),
                                                (lambda name: name == "blocks.1.attn.hook_z", lambda z, hook: None)])
    assert seen == [("blocks.1.attn.hook_z", 1, (1, 8, 4, 8))]
    torch.testing.assert_close(logits, by_hand(run.model, idx, heads=[(1, 1)]), rtol=0, atol=1e-6)
    assert not any(point.hooked for point in hook_points(run.model).values())


# ----------------------------------------------------------------------------- ablation


@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS)
def test_ablating_a_head_equals_zeroing_its_slice_of_the_projection_input_by_hand(arch):
    run = tiny_run(**arch)
    idx = random_tokens((2, 12))
    with run.ablated(heads=["L0H3", (1, 0)], mlps=["MLP1"]) as off:
        logits = run.model(idx, idx)[0]
    assert off.heads == ((0, 3), (1, 0)) and off.mlps == (1,) and off.label == "L0H3, L1H0, MLP1"
    torch.testing.assert_close(logits, by_hand(run.model, idx, [(0, 3), (1, 0)], [1]), rtol=0, atol=1e-6)
    torch.testing.assert_close(run.model(idx, idx)[0], by_hand(run.model, idx))  # nothing is left switched off


def test_mean_ablation_uses_the_mean_over_the_stated_tokens():
    """Each switched-off part takes its mean over every row and position of the tokens given as means: here
    computed by hand from c_proj's input and the MLP's output on those tokens."""
    run = tiny_run()
    stated, idx = random_tokens((3, 10), seed=4), random_tokens((2, 12))
    inputs, outputs = {}, {}
    block = run.model.transformer.h
    handles = [block[0].attn.c_proj.register_forward_pre_hook(lambda m, a: inputs.__setitem__(0, a[0])),
               block[1].mlp.register_forward_hook(lambda m, a, out: outputs.__setitem__(1, out))]
    with torch.no_grad():
        run.model(stated, stated)
    for handle in handles:
        handle.remove()
    head_mean = inputs[0].mean((0, 1)).view(4, 8)
    expected = by_hand(run.model, idx, [(0, 2)], [1], head_value={0: head_mean}, mlp_value={1: outputs[1].mean((0, 1))})
    with ablated(run.model, [(0, 2)], [1], how="mean", means=stated):
        torch.testing.assert_close(run.model(idx, idx)[0], expected, rtol=0, atol=1e-5)
    with ablated(run.model, [(0, 2)], [1], how="mean", means=random_tokens((3, 10), seed=5)):
        assert not torch.allclose(run.model(idx, idx)[0], expected, atol=1e-3)  # other tokens, other means


def halved_mlp_forward(self, x, rotary=None, cache=None, layer=0):  # a learner's edit to Block.forward
    x = self.hook_resid_pre(x)
    x = x + self.hook_attn_out(self.attn(self.branch_input(x, 0, cache, layer), rotary, cache, layer))
    x = self.hook_resid_mid(x)
    x = x + 0.5 * self.hook_mlp_out(self.mlp(self.branch_input(x, 1, cache, layer)))
    return self.hook_resid_post(x)


def parallel_forward(self, x, rotary=None, cache=None, layer=0):  # GPT-J's parallel block, the hooks kept
    x = self.hook_resid_pre(x)
    a = self.hook_attn_out(self.attn(self.branch_input(x, 0, cache, layer), rotary, cache, layer))
    m = self.hook_mlp_out(self.mlp(self.branch_input(x, 1, cache, layer)))
    return self.hook_resid_post(x + a + m)


def scaled_attention_forward(self, x, rotary=None, cache=None, layer=0):  # attention's branch scaled after its hook
    x = self.hook_resid_pre(x)
    x = x + 0.5 * self.hook_attn_out(self.attn(self.branch_input(x, 0, cache, layer), rotary, cache, layer))
    x = self.hook_resid_mid(x)
    x = x + self.hook_mlp_out(self.mlp(self.branch_input(x, 1, cache, layer)))
    return self.hook_resid_post(x)


@pytest.mark.parametrize("how, skipped, edit", [
    ("zero", False, None), ("mean", False, None), ("zero", True, None), ("mean", True, halved_mlp_forward),
    ("zero", False, parallel_forward), ("mean", False, scaled_attention_forward)])
def test_ablation_deltas_equal_one_ablated_pass_per_head(how, skipped, edit, monkeypatch):
    """The batched deltas (heads in groups, passes from each layer's input, rows in chunks) against the plain
    way: one full pass of every row per head, that head ablated; targets of -1 (a chat dataset's prompt tokens)
    count nowhere, as in training. A Block.forward the learner edited is what both run: one whose MLP does not
    read the stream after attention, or that scales attention's output after its hook point, too."""
    import model as model_py

    monkeypatch.setattr(experiments, "PASS_TOKENS", 48)  # passes of 48 tokens: a row a chunk, heads 3 and 1 a pass
    if edit:
        monkeypatch.setattr(model_py.Block, "forward", edit)
    model = tiny_model(attention_weights=0.5, **MODERN, token_shift=True)
    idx, targets = random_tokens((5, 16)), random_tokens((5, 16), seed=3)
    if skipped:
        targets[:, :6] = -1
    scored = targets != -1
    base, deltas = ablation_deltas(model, idx, targets, how)
    with torch.no_grad():
        assert base == pytest.approx(token_losses(model(idx, idx)[0], targets)[scored].mean().item(), abs=1e-6)
        for layer in range(2):
            for head in range(4):
                with ablated(model, [(layer, head)], how=how, means=idx):
                    loss = token_losses(model(idx, idx)[0], targets)[scored].mean().item()
                assert deltas[layer, head].item() == pytest.approx(loss - base, abs=2e-6)
    assert deltas.abs().max() > 1e-3  # the heads matter: the comparison is not of zeros


def narrow_heads(monkeypatch, width):
    """model.py's attention edited to give each head `width` numbers, not n_embd // n_head (a learner's change):
    the projections resized, and project and forward reading the width from the weights."""
    import model as model_py

    built = model_py.SelfAttention.__init__

    def init(self, config):
        built(self, config)
        self.c_attn = model_py.linear(config, config.n_embd, 3 * config.n_head * width)
        self.c_proj = model_py.linear(config, config.n_head * width, config.n_embd, adapted=False)

    def project(self, x, rotary):
        B, T, _ = x.size()
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, width)
        q, k, v = self.hook_q(qkv[:, :, 0]), self.hook_k(qkv[:, :, 1]), self.hook_v(qkv[:, :, 2])
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x, rotary=None, cache=None, layer=0):
        q, k, v = self.project(x, rotary)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        z = self.hook_z(self.written(q, k, v).transpose(1, 2))
        return self.resid_dropout(self.c_proj(z.flatten(2)))
    for name, function in (("__init__", init), ("project", project), ("forward", forward)):
        monkeypatch.setattr(model_py.SelfAttention, name, function)


def test_ablation_deltas_take_the_heads_width_from_the_model_not_its_settings(monkeypatch):
    narrow_heads(monkeypatch, width=3)  # 4 heads of 3 in a stream of 32
    model = tiny_model(attention_weights=0.5)
    idx, targets = random_tokens((2, 16)), random_tokens((2, 16), seed=3)
    base, deltas = ablation_deltas(model, idx, targets)
    with torch.no_grad():
        for layer, head in [(0, 1), (1, 3)]:
            with ablated(model, [(layer, head)]):
                loss = token_losses(model(idx, idx)[0], targets).mean().item()
            assert deltas[layer, head].item() == pytest.approx(loss - base, abs=2e-6)


# ----------------------------------------------------------------------------- what each head does


def previous_token_model():
    """One layer and one head whose weights are set by hand to attend to the previous position: token
    embeddings 0 and learned positions one-hot (position t is e_t), the query of position t e_t and the key of
    position s e_(s+1); through the norm's centring the match still stands out by ~23 in the scores."""
    T, C = 16, 32
    model = tiny_model(n_layer=1, n_head=1, mlp=False, bias=False)
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        model.transformer.wpe.weight.copy_(torch.eye(T, C))
        weight = model.transformer.h[0].attn.c_attn.weight  # rows: queries, keys, values
        weight[:2 * C].zero_()
        weight[:T, :T] = 4 * torch.eye(T)
        weight[C + 1:C + T, :T - 1] = torch.eye(T - 1)
    return model


def test_a_head_set_by_hand_to_attend_to_the_previous_token_scores_one_previous_token_and_zero_induction():
    text, repeated = random_tokens((4, 16)), repeated_tokens(37, 8)
    scores = head_scores(previous_token_model(), text, repeated)
    assert scores["previous_token"].item() > 0.99 and scores["induction"].item() < 0.05
    assert scores["duplicate_token"].item() < 0.05 and scores["first_token"].item() < 0.1
    assert head_labels(scores, chance_scores(text, repeated)) == [["previous_token"]]


def test_every_score_is_a_share_of_attention_and_a_uniform_head_scores_chance():
    model = tiny_model(attention="uniform", mlp=False)
    text, repeated = random_tokens((3, 16)), repeated_tokens(37, 8)
    scores, chance = head_scores(model, text, repeated), chance_scores(text, repeated)
    for kind in KINDS:
        assert scores[kind].shape == (2, 4)
        torch.testing.assert_close(scores[kind], torch.full((2, 4), chance[kind]))
    assert head_labels(scores, chance) == [[""] * 4] * 2


def test_repeated_sequences_vary_their_length_and_repeat_distinct_tokens():
    rows = repeated_tokens(37, 8, rows=5)
    assert rows.shape == (5, 16)
    for row, L in zip(rows, [4, 5, 6, 7, 8]):  # lengths from half to all of `length`, in turn
        first, second = row[16 - 2 * L:16 - L], row[16 - L:]
        assert torch.equal(first, second) and len(set(first.tolist())) == L
        assert not set(row[:16 - 2 * L].tolist()) & set(first.tolist())  # the filling draws other tokens


LETTERS = 26  # token 0 is the newline that ends a line


def repeated_lines(generator, n_tokens):
    """A stream of lines `s s\\n`, s random letters of a random length from 6 to 24."""
    out = []
    while len(out) < n_tokens:
        s = torch.randint(1, LETTERS + 1, (int(torch.randint(6, 25, (1,), generator=generator)),),
                          generator=generator).tolist()
        out += s + s + [0]
    return torch.tensor(out)


def trained_attention_only(n_layer, steps=1000, T=64):
    """An attention-only model (4 heads, 64 wide, rotary, QK-norm) trained on repeated_lines: Muon on the
    blocks' matrices, AdamW on the rest, as the default recipe trains; one thread, about 20 s per layer."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    stream = repeated_lines(generator, 200_000)
    model = tiny_model(block_size=T, vocab_size=LETTERS + 1, n_layer=n_layer, n_embd=64, mlp=False, bias=False,
                       pos_emb="rope", qk_norm=True).train()
    matrices = [p for name, p in model.named_parameters() if p.dim() == 2 and ".h." in name]
    rest = [p for name, p in model.named_parameters() if not (p.dim() == 2 and ".h." in name)]
    optimizers = [torch.optim.Muon(matrices, lr=0.02), torch.optim.AdamW(rest, lr=3e-3, betas=(0.9, 0.95))]
    for _ in range(steps):
        starts = torch.randint(len(stream) - T - 1, (32,), generator=generator).tolist()
        xy = torch.stack([stream[s:s + T + 1] for s in starts])
        _, loss = model(xy[:, :-1], xy[:, 1:])
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
    text = repeated_lines(torch.Generator().manual_seed(1), 16 * T)[:16 * T].view(16, T)
    return model.eval(), text


@pytest.mark.slow
def test_induction_heads_grow_in_the_second_layer_of_two_and_never_in_one():
    """Olsson et al.: a previous-token head in layer 0 composes with an induction head in layer 1; one layer of
    attention alone cannot form one. The lines repeat at varied distances, so a head that attends a fixed
    distance back does not predict them (nor would it pass the score, whose sequences vary their lengths too)."""
    repeated = repeated_tokens(torch.arange(1, LETTERS + 1), 20)
    labels = {}
    for n_layer in (1, 2):
        model, text = trained_attention_only(n_layer)
        scores = head_scores(model, text, repeated)
        labels[n_layer] = head_labels(scores, chance_scores(text, repeated))
        if n_layer == 2:
            assert scores["induction"][1].max() > 0.15 > 0.1 > scores["induction"][0].max()
            assert scores["previous_token"][0].max() > 0.15
    assert "induction" in labels[2][1] and "induction" not in labels[2][0]
    assert "induction" not in labels[1][0]


# ----------------------------------------------------------------------------- patching


def test_patching_everything_from_clean_restores_clean_exactly_and_nothing_leaves_corrupt():
    model = tiny_model(attention_weights=0.5, **MODERN, token_shift=True)
    clean, corrupt = random_tokens((1, 10), seed=5), random_tokens((1, 10), seed=6)
    names = list(hook_points(model))
    clean_logits, clean_cache = run_with_cache(model, clean, names)
    assert torch.equal(run_patched(model, corrupt, clean_cache, names), clean_logits)
    with torch.no_grad():
        assert torch.equal(run_patched(model, corrupt, clean_cache, []), model(corrupt, corrupt)[0])
    every_position = run_patched(model, corrupt, clean_cache, names, positions=list(range(10)))
    assert torch.equal(every_position, clean_logits)


def test_each_heatmap_cell_is_its_own_patched_run():
    """The batched heatmap against one run_patched per cell: resid_pre of a layer at one position, or one head's
    hook_z at every position."""
    model = tiny_model(attention_weights=0.5, **MODERN, token_shift=True)
    clean, corrupt = random_tokens((1, 7), seed=5), random_tokens((1, 7), seed=6)
    p = patching(model, clean, corrupt, target=3, foil=9)
    names = [f"blocks.{layer}.{point}" for layer in range(2) for point in ("hook_resid_pre", "attn.hook_z")]
    _, clean_cache = run_with_cache(model, clean, names)

    def metric(logits):
        return (logits[0, -1, 3] - logits[0, -1, 9]).item()

    for layer in range(2):
        for position in range(7):
            cell = run_patched(model, corrupt, clean_cache, [f"blocks.{layer}.hook_resid_pre"], positions=[position])
            assert p.resid[layer, position].item() == pytest.approx(metric(cell), abs=1e-5)
        for head in range(4):
            one = {f"blocks.{layer}.attn.hook_z": clean_cache[f"blocks.{layer}.attn.hook_z"]}
            _, corrupt_cache = run_with_cache(model, corrupt, list(one))
            one[f"blocks.{layer}.attn.hook_z"] = torch.where(torch.arange(4)[:, None] == head,
                                                             one[f"blocks.{layer}.attn.hook_z"],
                                                             corrupt_cache[f"blocks.{layer}.attn.hook_z"])
            cell = run_patched(model, corrupt, one, list(one))
            assert p.heads[layer, head].item() == pytest.approx(metric(cell), abs=1e-5)
    assert p.clean != pytest.approx(p.corrupt)


def test_the_default_metric_is_the_clean_top_prediction_s_log_prob():
    model = tiny_model(attention_weights=0.5)
    clean, corrupt = random_tokens((1, 6), seed=5), random_tokens((1, 6), seed=6)
    p = patching(model, clean, corrupt)
    with torch.no_grad():
        clean_logp, corrupt_logp = (torch.log_softmax(model(x, x)[0][0, -1], -1) for x in (clean, corrupt))
    assert p.target == clean_logp.argmax().item() and p.foil is None
    assert (p.clean, p.corrupt) == pytest.approx((clean_logp.max().item(), corrupt_logp[p.target].item()), abs=1e-5)


# ----------------------------------------------------------------------------- attribution


@pytest.mark.parametrize("arch", [*ARCHS.values(), dict(n_layer=0)], ids=[*ARCHS, "bigram"])
def test_attribution_parts_and_the_norm_bias_sum_to_the_logit(arch):
    """Exact up to float rounding: the final stream is the sum of the parts, and with the norm's scale frozen the
    norm (centring included) is linear in it, leaving its bias's term apart. The soft-cap acts after: the parts
    sum to the logit before it."""
    model = tiny_model(attention_weights=0.5, **arch)
    with torch.no_grad():
        for p in model.transformer.ln_f.parameters():  # a gain and a bias far from their start
            p.normal_()
    idx = random_tokens((1, 11))
    a = attribute(model, idx, 7)
    assert a.target == idx[0, 8].item() and a.position == 7
    assert sum(a.parts.values()) + a.norm_bias == pytest.approx(a.raw_logit, abs=1e-4)
    with torch.no_grad():
        assert a.logit == pytest.approx(model(idx, idx)[0][0, 7, a.target].item(), abs=1e-5)
    if model.config.logit_softcap:
        assert a.logit == pytest.approx(15 * torch.tanh(torch.tensor(a.raw_logit / 15)).item(), abs=1e-5)
    else:
        assert a.raw_logit == pytest.approx(a.logit, abs=1e-5)
    heads = [f"L{layer}H{head}" for layer in range(model.config.n_layer) for head in range(4)]
    embeddings = ["embed", "pos_embed"][:1 + (model.config.pos_emb == "learned")]
    assert [p for p in a.parts if "embed" in p] == embeddings and set(heads) <= set(a.parts)
    assert (a.norm_bias != 0) == (model.transformer.ln_f.bias is not None)  # RMSNorm has none
    assert a.adds_up


def doubled_head(self, x):  # a learner's edit to GPT.head: the logits doubled
    return 2 * self.lm_head(x)


@pytest.mark.parametrize("piece, edit", [("Block", scaled_attention_forward), ("GPT", doubled_head)],
                         ids=["scaled branch", "doubled head"])
def test_attribution_says_when_an_edited_model_s_parts_do_not_sum_to_its_logit(piece, edit, monkeypatch):
    """Where model.py builds the stream or the logit otherwise than as the parts added up (a branch scaled after
    its hook point, a head that doubles the logits), the parts are still each what they write, but they do not
    give the model's own logit, and the answer says so."""
    import model as model_py

    monkeypatch.setattr(getattr(model_py, piece), "forward" if piece == "Block" else "head", edit)
    model = tiny_model(attention_weights=0.5)
    idx = random_tokens((1, 11))
    a = attribute(model, idx, 7)
    with torch.no_grad():
        assert a.logit == pytest.approx(model(idx, idx)[0][0, 7, a.target].item(), abs=1e-5)
    assert not a.adds_up and abs(sum(a.parts.values()) + a.norm_bias - a.logit) > 0.01


def test_each_head_s_part_is_what_its_ablation_takes_out_of_the_logit_with_the_scale_frozen():
    """Zeroing one head's slice of c_proj's input removes its output from the final stream; through the frozen
    norm, that removes exactly its part from the logit."""
    model = tiny_model(attention_weights=0.5)
    idx = random_tokens((1, 9))
    a = attribute(model, idx, 8, target=5)
    _, cache = run_with_cache(model, idx, ["ln_final.hook_scale"])
    scale = cache["ln_final.hook_scale"]
    frozen = [("ln_final.hook_scale", lambda x, hook: scale)]
    intact = run_with_hooks(model, idx, frozen)[0, 8, 5].item()
    with ablated(model, ["L1H2"]):
        without = run_with_hooks(model, idx, frozen)[0, 8, 5].item()
    assert intact - without == pytest.approx(a.parts["L1H2"], abs=1e-4)


# ----------------------------------------------------------------------------- bad input


def one_line(error):
    message = str(error.value)
    assert "\n" not in message and message
    return message


@pytest.mark.parametrize("call, expected", [
    (lambda run: run.run_with_cache("ROMEO", ["blocks.0.hook_mlp_out", "blocks.9.attn.hook_z"]),
     "no hook point 'blocks.9.attn.hook_z' in this model"),
    (lambda run: run.run_with_hooks("ROMEO", [("blocks.0.attn.hook_q", lambda x, hook: None), ("nope", print)]),
     "no hook point 'nope'"),
    (lambda run: run.ablated(["L2H0"]).__enter__(), "head L2H0 is out of range: this model has layers 0-1 and "
                                                    "heads 0-3 in each"),
    (lambda run: run.ablated([(0, 4)]).__enter__(), "head L0H4 is out of range"),
    (lambda run: run.ablated(["layer 0 head 1"]).__enter__(), "'layer 0 head 1' is not a head"),
    (lambda run: run.ablated(mlps=[2]).__enter__(), "MLP2 is out of range: this model has MLP0-MLP1"),
    (lambda run: run.ablated(["L0H0"], how="mean").__enter__(), "mean ablation needs means="),
    (lambda run: run.tokens("ROMEO: é"), "the text has characters outside the training vocabulary: 'é'"),
    (lambda run: run.tokens(""), "the text is empty"),
    (lambda run: run.to_tokens(torch.tensor([[1, 40]])), "token id 40 is outside the vocabulary (0 to 36)"),
    (lambda run: run.tokens("A" * 17), "the text is 17 tokens, longer than the model's block_size 16"),
])
def test_bad_input_is_one_line(call, expected):
    with pytest.raises(UserError) as error:
        call(tiny_run())
    assert one_line(error).startswith(expected)


def test_a_model_without_attention_or_mlps_says_so_in_one_line():
    bigram, attention_only = tiny_run(n_layer=0), tiny_run(mlp=False)
    for call in (lambda: bigram.ablated(["L0H0"]).__enter__(),
                 lambda: head_scores(bigram.model, random_tokens((1, 8)), repeated_tokens(37, 4)),
                 lambda: ablation_deltas(bigram.model, random_tokens((1, 8)), random_tokens((1, 8))),
                 lambda: patching(bigram.model, random_tokens((1, 8)), random_tokens((1, 8)))):
        with pytest.raises(UserError) as error:
            call()
        assert one_line(error).startswith("this model has no attention (n_layer=0, a bigram model)")
    with pytest.raises(UserError) as error:
        attention_only.ablated(mlps=["MLP0"]).__enter__()
    assert one_line(error) == "this model has no MLPs (mlp=False: its blocks are attention only)"
    assert attribute(bigram.model, random_tokens((1, 4)), 2).parts.keys() == {"embed", "pos_embed"}


def test_switching_every_head_off_is_allowed_with_a_note(capsys):
    run = tiny_run(mlp=False)
    idx = random_tokens((1, 8))
    every = [(layer, head) for layer in range(2) for head in range(4)]
    with run.ablated(every) as off:
        logits = run.model(idx, idx)[0]
    assert off.note and off.note in capsys.readouterr().out
    embeddings_only = run.model.head(run.model.transformer.ln_f(run.model.embed(idx)[0] + sum(
        block.attn.c_proj.bias for block in run.model.transformer.h)))
    torch.testing.assert_close(logits, embeddings_only, rtol=0, atol=1e-5)
    with run.ablated(every[:-1]) as off:
        assert off.note is None


def test_patching_prompts_of_unequal_length_is_one_line():
    with pytest.raises(UserError) as error:
        patching(tiny_model(), random_tokens((1, 5)), random_tokens((1, 6)))
    assert one_line(error) == ("the clean prompt is 5 tokens and the corrupt one 6: patching pairs their positions, "
                               "so they must be the same length")


def test_attribution_needs_a_position_with_a_next_token():
    model = tiny_model()
    for idx, position, expected in [(random_tokens((1, 5)), 4, "position must be 0 to 3"),
                                    (random_tokens((1, 1)), 0, "the text is one token")]:
        with pytest.raises(UserError) as error:
            attribute(model, idx, position)
        assert one_line(error).startswith(expected)


def test_attribution_through_a_final_norm_the_forward_no_longer_runs_is_one_line(monkeypatch):
    """A learner's GPT.forward that drops ln_f: attribution splits the logit through that norm's scale."""
    import model as model_py

    def forward(self, idx, targets=None, cache=None):
        x, rotary = self.embed(idx)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rotary, cache, i)
        return self.head(x), None
    monkeypatch.setattr(model_py.GPT, "forward", forward)
    with pytest.raises(UserError) as error:
        attribute(tiny_model(), random_tokens((1, 5)), 2)
    assert one_line(error) == ("attribute splits the logit through the final norm, whose scale (ln_final.hook_scale) "
                               "model.py, as edited, no longer computes: GPT.forward applies transformer.ln_f, and "
                               "Norm.forward passes its divisor through self.hook_scale")


# ----------------------------------------------------------------------------- every value given is checked


@pytest.fixture
def run_folder(tmp_path):
    """A run folder holding a tiny model's best.pt, as open_run reads it."""
    from dataclasses import asdict

    from gptkit.run.checkpoint import save_checkpoint

    model = tiny_model()
    (tmp_path / "out").mkdir()
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config),
                     "tokenizer": CharTokenizer(CHARS).to_meta()}, tmp_path / "out" / "best.pt")
    return tmp_path / "out"


HUGE = 10 ** 5000  # more digits than Python will write: a message that echoes it must not try


@pytest.mark.parametrize("kwargs, expected", [
    (dict(checkpoint="bestest"), "checkpoint must be 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' (the "
                                 "snapshot of iteration N), got 'bestest'"),
    (dict(checkpoint=None), "checkpoint must be 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' (the snapshot of "
                            "iteration N), got 'None'"),
    (dict(device="cuda"), "device 'cuda' asked for, but this machine has no CUDA GPU torch can use; use device='cpu'"),
    (dict(device="cuda:3"), "device 'cuda:3' asked for, but this machine has no CUDA GPU"),
    (dict(device="cuda:" + "9" * 5000), "device 'cuda:999999999999...999999999999999999' asked for, but"),
    (dict(device="gpu"), "device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto', got 'gpu'"),
    (dict(device=0), "device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto', got 0"),
    (dict(out_dir=None), "out_dir must be the path of a run folder, e.g. 'out'; got None"),
    (dict(out_dir="o\0ut"), "out_dir must be the path of a run folder"),
    (dict(out_dir="x" * 300), "cannot read xxxx"),
])
def test_open_run_takes_only_what_it_can_open(run_folder, monkeypatch, kwargs, expected):
    """A checkpoint other than best or latest, a device this machine lacks (no GPU here: device_count says so)
    or of no known name, a folder that is no path: each one line, and nothing silently opened instead."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(UserError) as error:
        experiments.open_run(**dict(dict(out_dir=run_folder), **kwargs))
    assert one_line(error).startswith(expected)
    assert experiments.open_run(run_folder, "best", torch.device("cpu")).config.n_layer == 2


def test_the_page_gives_every_checkpoint_open_run_opens():
    """docs/analysis.md's open_run row and its list of refusals name the snapshots beside best and latest, as the
    refusal above does (a snapshot opened: tests/test_timeline.py)."""
    lines = (REPO / "docs" / "analysis.md").read_text(encoding="utf-8").splitlines()
    row = next(line for line in lines if line.startswith("| `open_run("))
    refused = next(line for line in lines if line.startswith("- `open_run`: a `checkpoint` other than"))
    assert '"iter:N"' in row and '"iter:N"' in refused


@pytest.mark.parametrize("tokens, expected", [
    (None, "expected a text (a str) or token ids (a tensor, or a list of whole numbers), got None"),
    (b"ROMEO", "expected a text (a str) or token ids (a tensor, or a list of whole numbers), got b'ROMEO' (bytes)"),
    (3, "expected a text (a str) or token ids"),
    ([[1, 2], [3]], "the rows of token ids are of different lengths (2, 1): give every row as many"),
    ([1, [2]], "token ids must be whole numbers, in a list (T) or a list of lists (batch, T); got [2] among them"),
    ([[[1]]], "token ids must be whole numbers, in a list (T) or a list of lists (batch, T); got [1] among them"),
    ([1, 2.5], "token ids must be whole numbers, in a list (T) or a list of lists (batch, T); got 2.5 among them"),
    ([1, True], "token ids must be whole numbers, in a list (T) or a list of lists (batch, T); got True among them"),
    (["a"], "token ids must be whole numbers, in a list (T) or a list of lists (batch, T); got 'a' among them"),
    ([1, 10 ** 20], "token id <a 21-digit number> is outside the vocabulary (0 to 36)"),
    ([1, -HUGE], "token id -<a 5,001-digit number> is outside the vocabulary (0 to 36)"),
    ([-1], "token id -1 is outside the vocabulary (0 to 36)"),
    (torch.tensor([1.5]), "token ids must be whole numbers of shape (T,) or (batch, T), got torch.float32 (1,)"),
    (torch.ones(1, 2, dtype=torch.complex64), "token ids must be whole numbers of shape (T,) or (batch, T)"),
    (torch.ones(1, 1, 2, dtype=torch.long), "token ids must be whole numbers of shape (T,) or (batch, T)"),
    (np.array([1, object()], dtype=object), "token ids must be a tensor, or a list (T) or a list of lists"),
])
def test_token_ids_that_are_not_token_ids_are_one_line(tokens, expected):
    run = tiny_run()
    calls = [run.run_with_cache, run.run_with_hooks, run.to_tokens]
    if tokens is not None:  # means=None is mean ablation's own error
        calls.append(lambda ids: run.ablated(["L0H0"], how="mean", means=ids).__enter__())
    for call in calls:
        with pytest.raises(UserError) as error:
            call(tokens)
        assert one_line(error).startswith(expected) and len(one_line(error)) < 200, call


def test_token_ids_of_every_shape_and_kind_are_read_alike():
    run, ids = tiny_run(), [[5, 1, 36], [0, 2, 3]]
    want = run.run_with_cache(torch.tensor(ids))[0]
    numpy_ints = [[np.int64(i) for i in row] for row in ids]
    for same in (ids, tuple(map(tuple, ids)), np.array(ids), np.array(ids, dtype=np.int32), numpy_ints):
        torch.testing.assert_close(run.run_with_cache(same)[0], want)
    torch.testing.assert_close(run.run_with_cache(ids[0])[0], want[:1])


@pytest.mark.parametrize("heads, mlps, expected", [
    (0, (), "heads=0 is not a head or a list of them: write L0H3 (layer 0, head 3) or (0, 3), or a list of them"),
    (True, (), "heads=True is not a head or a list of them"),
    (b"L0H0", (), "heads=b'L0H0' (bytes) is not a head or a list of them"),
    ([(True, False)], (), "(True, False) is not a head: write L0H3 (layer 0, head 3) or (0, 3), or a list of them"),
    ([(0, 1.0)], (), "(0, 1.0) is not a head"),
    ([(0, 1, 2)], (), "(0, 1, 2) is not a head"),
    ([None], (), "None is not a head"),
    (["L\u0661H\u0660"], (), "'L\u0661H\u0660' is not a head"),  # another script's digits: L1H0 to int()
    (["L" + "9" * 5000 + "H0"], (), "head L<a 5,000-digit number>H0 is out of range: this model has layers 0-1"),
    ([(HUGE, 0)], (), "head L<a 5,001-digit number>H0 is out of range"),
    ([(-1, 0)], (), "head L-1H0 is out of range"),
    (["x" * 10_000], (), "'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx' is not a head"),
    ((), True, "mlps=True is not an MLP or a list of them: write MLP1 or the layer number, 1, or a list of them"),
    ((), 1.5, "mlps=1.5 is not an MLP or a list of them"),
    ((), [True], "True is not an MLP: write MLP1 or the layer number, 1, or a list of them"),
    ((), ["MLP\u0661"], "'MLP\u0661' is not an MLP"),
    ((), ["MLP" + "9" * 5000], "MLP<a 5,000-digit number> is out of range: this model has MLP0-MLP1"),
    ((), [-HUGE], "MLP-<a 5,001-digit number> is out of range"),
])
def test_heads_and_mlps_that_name_nothing_are_one_line_never_nothing_switched_off(heads, mlps, expected):
    """A number alone, a bool (an int to Python), a pair that is not two whole numbers, a number of thousands of
    digits: each one line from ablated, where a 0 once switched nothing off and (True, False) failed on a hook
    name."""
    run = tiny_run()
    for call in (lambda: run.ablated(heads, mlps).__enter__(), lambda: ablated(run.model, heads, mlps).__enter__()):
        with pytest.raises(UserError) as error:
            call()
        assert one_line(error).startswith(expected) and len(one_line(error)) < 200


def test_a_lone_pair_none_and_numpy_numbers_name_parts_as_lists_do():
    run = tiny_run()
    assert experiments.parse_heads(run.model, (0, 3)) == ((0, 3),) == experiments.parse_heads(run.model, [(0, 3)])
    assert experiments.parse_heads(run.model, [(np.int64(1), torch.tensor(2)), "l0h1"]) == ((0, 1), (1, 2))
    assert experiments.parse_heads(run.model, None) == () == experiments.parse_mlps(run.model, None)
    assert experiments.parse_mlps(run.model, np.int64(1)) == (1,) == experiments.parse_mlps(run.model, "MLP1")
    assert experiments.parse_heads(tiny_run(n_layer=0).model, []) == ()  # nothing asked of a bigram: nothing to say


@pytest.mark.parametrize("call, expected", [
    (lambda run: run.ablated(["L0H0"], how="median").__enter__(), "ablation must be 'zero' or 'mean' (got 'median')"),
    (lambda run: run.ablated(["L0H0"], how=None).__enter__(), "ablation must be 'zero' or 'mean' (got None)"),
    (lambda run: ablation_deltas(run.model, random_tokens((1, 8)), random_tokens((1, 8)), how="median"),
     "ablation must be 'zero' or 'mean' (got 'median')"),
    (lambda run: ablation_deltas(run.model, random_tokens((1, 8)), random_tokens((1, 7))),
     "idx is (1, 8) and targets (1, 7)"),
    (lambda run: ablation_deltas(run.model, random_tokens((1, 8)), torch.full((1, 8), -1)),
     "every target is -1, which the loss skips: give at least one token to score"),
    (lambda run: run.run_with_cache("ROMEO", 5), "names_filter must be None (every hook point), a hook point's name"),
    (lambda run: run.run_with_cache("ROMEO", [5]), "names_filter must be None"),
    (lambda run: run.run_with_hooks("ROMEO", [("blocks.0.attn.hook_z",)]),
     "fwd_hooks must be a list of (hook point name, function) pairs"),
    (lambda run: run.run_with_hooks("ROMEO", ("blocks.0.attn.hook_z", print)), "fwd_hooks must be a list"),
    (lambda run: attribute(run.model, run.tokens("ROMEO"), True), "position must be a whole number, got True"),
    (lambda run: attribute(run.model, run.tokens("ROMEO"), HUGE),
     "position must be 0 to 3, a position with a next token in the text (got <a 5,001-digit number>)"),
    (lambda run: attribute(run.model, run.tokens("ROMEO"), 1, target=10 ** 20),
     "target must be a token id, a whole number from 0 to 36; got <a 21-digit number>"),
    (lambda run: attribute(run.model, random_tokens((2, 5)), 1), "idx must be one row of tokens, (1, T) or (T,)"),
    (lambda run: patching(run.model, run.tokens("ROMEO"), run.tokens("JULIE"), target=-1),
     "target must be a token id, a whole number from 0 to 36; got -1"),
    (lambda run: patching(run.model, run.tokens("ROMEO"), run.tokens("JULIE"), foil=1.0), "foil must be a token id"),
    (lambda run: patching(run.model, run.tokens("ROMEO"), run.tokens("JULIE"), foil=torch.tensor(True)),
     "foil must be a token id, a whole number from 0 to 36; got tensor(True) (Tensor)"),
    (lambda run: patching(run.model, run.tokens("ROMEO"), [1, 99, 2, 3, 4]), "token id 99 is outside the vocabulary"),
    (lambda run: head_scores(run.model, None, repeated_tokens(37, 4)), "token ids must be a tensor"),
])
def test_every_other_value_the_api_takes_is_checked(call, expected):
    with pytest.raises(UserError) as error:
        call(tiny_run())
    assert one_line(error).startswith(expected)
