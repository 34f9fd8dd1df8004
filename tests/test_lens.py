"""Handing a model to TransformerLens: its log-probabilities, hook points and hooks against ours, and the options
it refuses.

    python -m pytest -q tests/test_lens.py

The models are tiny and built here. Importing transformer_lens alone takes about 4 s, so the tests that need it
are marked slow; the refusals come before that import.
"""

import re
from importlib.metadata import PackageNotFoundError

import pytest
import torch

from conftest import REPO, random_tokens, tiny_model
from gptkit.base.errors import UserError
from gptkit.base.settings import parse_config
from gptkit.interop import lens as lens_interop
from gptkit.interop.lens import check_convertible, to_transformer_lens
from gptkit.interp.hooks import hook_points, hooked, run_with_cache
from gptkit.lab import ladder
from gptkit.training.train_config import TrainConfig

CONVERTIBLE = {
    "gpt2": dict(mlp_act="gelu_tanh"),
    "nobias_exactgelu_untied": dict(bias=False, mlp_act="gelu", tie_weights=False),
    "bigram": dict(n_layer=0),
}
REFUSED = {
    "rope": dict(pos_emb="rope"), "no_positions": dict(pos_emb="none"), "rmsnorm": dict(norm="rmsnorm"),
    "qk_norm": dict(qk_norm=True), "relu2": dict(mlp_act="relu2"), "softcap": dict(logit_softcap=30.0),
    "token_shift": dict(token_shift=True), "additive": dict(attention="additive"), "dot": dict(attention="dot"),
    "uniform": dict(attention="uniform"), "encoder": dict(causal=False), "no_mlp": dict(mlp=False),
}


def model_with(**options):
    """A tiny model (TINY: biases, 2 layers of 4 heads, 32 wide) whose every weight is moved off its initial
    value, so that a zero bias, a unit gain or a swapped tensor shows."""
    model = tiny_model(**options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def log_probs(logits):
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.slow
@pytest.mark.parametrize("options", CONVERTIBLE.values(), ids=CONVERTIBLE.keys())
def test_log_probs_equal_ours_with_and_without_weight_processing(options):
    pytest.importorskip("transformer_lens")
    model = model_with(**options)
    lens = to_transformer_lens(model)
    idx = random_tokens((2, 16))
    with torch.no_grad():
        ours = log_probs(model(idx, targets=idx)[0])  # targets: every position's logits
        torch.testing.assert_close(log_probs(lens(idx)), ours, atol=1e-4, rtol=0)
        # folding the norms and centring change the weights and the logits, never the log-probabilities
        lens.enable_compatibility_mode(disable_warnings=True)
        torch.testing.assert_close(log_probs(lens(idx)), ours, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_every_hook_point_caches_and_patches_as_in_transformer_lens():
    pytest.importorskip("transformer_lens")
    model = model_with()
    lens = to_transformer_lens(model)
    idx = random_tokens((2, 16))
    names = list(hook_points(model))
    _, ours = run_with_cache(model, idx, names)
    _, theirs = lens.run_with_cache(idx)
    assert "blocks.0.attn.hook_pattern" in names and "blocks.1.hook_resid_post" in names
    for name in names:
        if not name.endswith("hook_attn_scores"):  # TransformerLens 3.9 and 4.3 cache the softmax's output there
            torch.testing.assert_close(ours[name], theirs[name], atol=1e-5, rtol=0, msg=name)

    def head_off(z, hook=None):  # our hooks are called (activation, name), TransformerLens's (activation, hook)
        z = z.clone()
        z[:, :, 1] = 0
        return z

    with hooked(model, {"blocks.1.attn.hook_z": head_off}), torch.no_grad():
        ablated = log_probs(model(idx, targets=idx)[0])
    with torch.no_grad():
        theirs = log_probs(lens.run_with_hooks(idx, fwd_hooks=[("blocks.1.attn.hook_z", head_off)]))
        intact = log_probs(lens(idx))
    torch.testing.assert_close(theirs, ablated, atol=1e-4, rtol=0)
    assert (theirs - intact).abs().max() > 1e-3  # the head's removal showed


@pytest.mark.parametrize("option", REFUSED.values(), ids=REFUSED.keys())
def test_other_options_are_refused_in_one_line_naming_them(option):
    with pytest.raises(UserError) as refused:
        to_transformer_lens(tiny_model(**option))
    line = str(refused.value)
    assert line.startswith(f"this model cannot go to TransformerLens: {next(iter(option))}=") and "\n" not in line


@pytest.mark.parametrize("found, expected", [(None, "needs the `transformer-lens` package: pip install"),
                                             ("3.5.1", "needs transformer-lens 3.9 or later (found 3.5.1)")])
def test_a_missing_or_old_transformer_lens_is_one_line(monkeypatch, found, expected):
    def version(name):
        assert name == "transformer-lens"
        if found is None:
            raise PackageNotFoundError(name)
        return found

    monkeypatch.setattr(lens_interop, "version", version)
    with pytest.raises(UserError) as refused:
        to_transformer_lens(tiny_model())
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_the_run_docs_gpt2_hands_to_transformer_lens_is_one_it_takes():
    """docs/gpt2.md's snippet opens a lab rung of GPT-2's layout (the main job's out/, with rotary positions, is
    refused), with as many heads as the cache's shape it shows."""
    page = (REPO / "docs" / "gpt2.md").read_text(encoding="utf-8")
    folder = re.search(r'load_model\("([^"]+)"', page).group(1)
    assert folder.startswith("out-lab/"), folder
    rung = next(r for r in ladder.RUNGS if r.name == folder.removeprefix("out-lab/"))
    config = parse_config(TrainConfig, ladder.own_args(rung), prog="train.py").model
    check_convertible(config)
    assert f"torch.Size([1, {config.n_head}, 14, 14])" in page
