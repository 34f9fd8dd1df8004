"""gptkit/interp/hooks.py: hook points under TransformerLens's names, and what is read through them (attention maps,
residual streams, the logit lens, surprise) against the model's own forward pass."""

import math

import pytest
import torch

from conftest import MODERN, random_tokens, tiny_model
from gptkit.base.errors import UserError
from gptkit.interp.hooks import (attention_maps, hook_points, hooked, logit_lens, look_inside, read_out, run_with_cache,
                                 surprise_bits)

TL_SHAPES = {  # TransformerLens's shapes, for B=2, T=5, d_model 32, 4 heads of 8
    "hook_embed": (2, 5, 32), "hook_pos_embed": (2, 5, 32),
    "blocks.1.hook_resid_pre": (2, 5, 32), "blocks.1.hook_resid_mid": (2, 5, 32),
    "blocks.1.hook_resid_post": (2, 5, 32), "blocks.1.hook_attn_out": (2, 5, 32), "blocks.1.hook_mlp_out": (2, 5, 32),
    "blocks.1.attn.hook_q": (2, 5, 4, 8), "blocks.1.attn.hook_k": (2, 5, 4, 8), "blocks.1.attn.hook_v": (2, 5, 4, 8),
    "blocks.1.attn.hook_z": (2, 5, 4, 8),
    "blocks.1.attn.hook_attn_scores": (2, 4, 5, 5), "blocks.1.attn.hook_pattern": (2, 4, 5, 5),
    "ln_final.hook_scale": (2, 5, 1), "blocks.0.ln1.hook_scale": (2, 5, 1),
}


def test_hook_points_have_transformer_lens_names_and_shapes():
    model = tiny_model(attention_weights=0.5)
    _, cache = run_with_cache(model, random_tokens((2, 5)), TL_SHAPES)
    assert {name: tuple(x.shape) for name, x in cache.items()} == TL_SHAPES
    assert len(hook_points(model)) == 2 + 2 * 13 + 1  # embeddings, 13 in each block, the final norm's scale


def test_hooks_refuse_a_name_the_model_lacks_and_leave_nothing_behind():
    model = tiny_model(mlp=False)
    with pytest.raises(UserError, match="no hook point 'blocks.0.hook_mlp_out'"):
        with hooked(model, {"blocks.0.hook_mlp_out": lambda x, name: None}):
            pass
    with pytest.raises(RuntimeError, match="inside"):
        with hooked(model, {"blocks.0.hook_resid_post": lambda x, name: None}):
            raise RuntimeError("inside")
    assert not any(point.hooked for point in hook_points(model).values())


def test_a_forward_written_without_its_hook_points_is_one_line_where_an_analysis_reads_them(monkeypatch):
    """Block.forward as nanoGPT writes it, no hook point called: the model trains and samples, and an analysis
    that reads the stream there says which point its forward never reaches, not a KeyError."""
    import model as model_py

    def plain(self, x, rotary=None, cache=None, layer=0):  # an edit: the lecture's block, no hook points
        x = x + self.attn(self.branch_input(x, 0, cache, layer), rotary, cache, layer)
        return x + self.mlp(self.branch_input(x, 1, cache, layer))

    monkeypatch.setattr(model_py.Block, "forward", plain)
    model = tiny_model()
    with pytest.raises(UserError, match=r"^model.py's forward never passes through the hook point "
                                        r"blocks.0.hook_resid_pre, which this analysis reads: an edit left out its "
                                        r"self.hook_resid_pre\(...\) call"):
        look_inside(model, random_tokens((1, 5)))


@pytest.mark.parametrize("name", ["head", "embed"])
def test_a_renamed_piece_of_gpt_forward_an_analysis_calls_is_one_line(monkeypatch, name):
    import model as model_py

    model = tiny_model(n_layer=0) if name == "embed" else tiny_model()
    monkeypatch.delattr(model_py.GPT, name)
    with pytest.raises(UserError, match=rf"^model.py's GPT has no {name} method \(.*an edit renamed it; keep the "
                                        rf"name {name}$"):
        look_inside(model, random_tokens((1, 5))) if name == "embed" else read_out(model, torch.zeros(1, 1, 32))


@pytest.mark.parametrize("arch", [{}, MODERN, dict(MODERN, token_shift=True)], ids=["gpt2", "modern", "token_shift"])
def test_attention_maps_are_the_causal_weights_sdpa_applies(arch):
    """Each map is a distribution over the keys a query may see, and weights @ values gives what the forward pass
    computed with the weights never written out (SDPA's kernel, hook_z watched alone)."""
    model = tiny_model(attention_weights=0.25, **arch)
    idx = random_tokens((2, 12))
    maps = attention_maps(model, idx)
    _, cache = run_with_cache(model, idx, ["blocks.1.attn.hook_v", "blocks.1.attn.hook_z"])
    future = torch.ones(12, 12, dtype=torch.bool).triu(diagonal=1)
    for weights in maps:
        assert weights.shape == (2, 4, 12, 12)
        assert (weights[..., future] == 0).all() and (weights[..., ~future] > 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 12), rtol=0, atol=1e-5)
    assert maps[0].max() > 0.5  # not uniform attention
    z = maps[1] @ cache["blocks.1.attn.hook_v"].transpose(1, 2)
    torch.testing.assert_close(z.transpose(1, 2), cache["blocks.1.attn.hook_z"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", [{}, dict(MODERN, token_shift=True), dict(n_layer=0, pos_emb="none")],
                         ids=["gpt2", "token_shift", "bigram"])
def test_the_streams_read_out_as_the_model_predicts(arch):
    """The last residual stream read out is the model's own logits at every position; the logit lens of the last
    stream is its prediction; the mean surprise in nats is the model's loss."""
    model = tiny_model(**arch)
    idx = random_tokens((1, 10))
    streams, maps = look_inside(model, idx)
    assert len(streams) == model.config.n_layer + 1 and len(maps) == model.config.n_layer
    with torch.no_grad():
        logits, loss = model(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(read_out(model, streams[-1])[:, :-1], logits)
    torch.testing.assert_close(logit_lens(model, streams, 4)[-1], torch.softmax(logits[0, 4], -1))
    bits = surprise_bits(model, idx[:, :-1], idx[:, 1:])
    assert bits.mean().item() * math.log(2) == pytest.approx(loss.item(), rel=1e-5)
