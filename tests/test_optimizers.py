"""The optimizers (gptkit/optim/optimizers.py): AdamW and Muon against torch's; and every training option (model
and optimizer) takes steps under them without NaN."""

import math

import pytest
import torch

from conftest import tiny_model, train_config
from gptkit.optim import optimizers
from gptkit.training.updates import lr_factor_at, schedulable

OPTIONS = {
    "gpt2": {},
    "rope": dict(pos_emb="rope"),
    "rmsnorm": dict(norm="rmsnorm"),
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(mlp_act="relu2"),
    "gelu_tanh": dict(mlp_act="gelu_tanh"),
    "untied": dict(tie_weights=False),
    "softcap": dict(logit_softcap=15.0),
    "zero_init": dict(zero_init_proj=True),
    "bias": dict(bias=True),
    "muon": dict(optimizer="muon"),
    "wsd": dict(lr_schedule="wsd"),
    "dot": dict(attention="dot"),
    "uniform": dict(attention="uniform"),
    "additive": dict(attention="additive", optimizer="muon"),
    "encoder": dict(causal=False),
    "no_positions": dict(pos_emb="none"),
    "attention_only": dict(mlp=False),
    "bigram": dict(n_layer=0, pos_emb="none", optimizer="muon"),
    "default_bundle": dict(optimizer="muon", pos_emb="rope", norm="rmsnorm", qk_norm=True, mlp_act="relu2",
                           tie_weights=False, zero_init_proj=True, logit_softcap=15.0, lr_schedule="wsd"),
}


def train_steps(cfg, steps=8, dtype=None):
    torch.manual_seed(0)
    model = tiny_model(config=cfg.model, vocab_size=20).train()
    optimizers = schedulable(model.configure_optimizers(cfg))
    data = torch.randint(20, (cfg.batch_size, cfg.model.block_size + 1))
    losses = []
    for it in range(steps):
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * lr_factor_at(cfg, it)
        with torch.autocast("cpu", dtype=dtype) if dtype else torch.autocast("cpu", enabled=False):
            _, loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_trains_without_nan(name):
    cfg = train_config(**OPTIONS[name], learning_rate=3e-3, warmup_iters=2, max_iters=8)
    losses = train_steps(cfg)
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0]  # it learns the fixed batch


def test_bf16_autocast_trains_without_nan():
    cfg = train_config(**OPTIONS["default_bundle"], learning_rate=3e-3, warmup_iters=2, max_iters=8)
    losses = train_steps(cfg, dtype=torch.bfloat16)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


# ---------------------------------------------------------------------------------------------- the optimizers

def muon_steps(make, steps=3):
    """Parameters of three shapes (two sharing one, and a tall one) after `steps` steps of make(params) on
    fixed random gradients."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.05) for shape in [(48, 16), (16, 16),
                                                                                              (16, 16), (16, 64)]]
    opt = make(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach() for p in params], opt


@pytest.mark.parametrize("ns_dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_muon_matches_torch_muon_with_its_newton_schulz_in_the_run_precision(ns_dtype):
    """In bfloat16 it is torch's Muon exactly; in float32 it is float64's result to float32's precision (torch's
    bf16 iterations differ from that by far more), and a torch Muon's checkpoint state carries over."""
    settings = dict(lr=0.02, weight_decay=0.3, momentum=0.95)
    torch_params, torch_opt = muon_steps(lambda ps: torch.optim.Muon(ps, **settings))
    ours, _ = muon_steps(lambda ps: optimizers.Muon(ps, ns_dtype=ns_dtype, **settings))
    exact, _ = muon_steps(lambda ps: optimizers.Muon(ps, ns_dtype=torch.float64, **settings))
    for mine, theirs, best in zip(ours, torch_params, exact):
        if ns_dtype == torch.bfloat16:
            assert torch.equal(mine, theirs)
        else:
            torch.testing.assert_close(mine, best, rtol=0, atol=1e-6)
            assert (theirs - best).abs().max() > 1e-4
    resumed = optimizers.Muon([p.clone() for p in torch_params], ns_dtype=ns_dtype, **settings)
    resumed.load_state_dict(torch_opt.state_dict())
    momentum = [opt.state_dict()["state"][0]["momentum_buffer"] for opt in (resumed, torch_opt)]
    assert momentum[0].equal(momentum[1])


def test_adamw_matches_torch_adamw_and_loads_its_checkpoint_state():
    """Group by group (each with its own rate and decay) it takes torch's AdamW's steps, and a torch AdamW's
    state dict loads into it and comes back out in torch's format."""
    def adamw_steps(make, steps=4):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in [(8, 4), (4,), (3, 5)]]
        opt = make([{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0,
                                                                  "lr": 0.03}], lr=3e-3, betas=(0.9, 0.95))
        for _ in range(steps):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return params, opt

    theirs, torch_opt = adamw_steps(torch.optim.AdamW)
    ours, opt = adamw_steps(optimizers.AdamW)
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    _, resumed = adamw_steps(optimizers.AdamW, steps=0)
    resumed.load_state_dict(torch_opt.state_dict())
    saved, loaded = torch_opt.state_dict(), resumed.state_dict()
    assert loaded["param_groups"][1]["params"] == saved["param_groups"][1]["params"] == [2]
    assert loaded["param_groups"][1]["lr"] == 0.03
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert loaded["state"][2][key].equal(saved["state"][2][key])
