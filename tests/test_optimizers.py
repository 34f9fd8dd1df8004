"""The optimizers, the learning-rate schedule and the weight average (gptkit/training/optimizers.py): AdamW and Muon
against torch's, each parameter in the optimizer meant for it, the schedule's edges, the average step by step; and
every training option (model and optimizer) takes steps under them without NaN."""

import math
from dataclasses import replace

import pytest
import torch

from conftest import tiny_model, train_config
from gptkit.training import optimizers
from gptkit.training.optimizers import build_optimizers, is_hidden_matrix, lr_factor_at, set_lr
from gptkit.training.train_config import TrainConfig

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
    optimizers = build_optimizers(model, cfg)
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


@pytest.mark.parametrize("tie", [True, False])
def test_muon_gets_only_hidden_matrices(tie):
    cfg = train_config(optimizer="muon", tie_weights=tie)
    model = tiny_model(config=cfg.model, vocab_size=20)
    adamw, muon = build_optimizers(model, cfg)
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = sorted(names[i] for i in muon_ids)
    assert in_muon and all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    assert all(".h." in f".{n}" and n.endswith(".weight") for n in in_muon)
    assert not any(n.startswith(("transformer.wte", "transformer.wpe", "lm_head")) for n in in_muon)
    adam_ids = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert not muon_ids & adam_ids
    assert muon_ids | adam_ids == {id(p) for p in model.parameters()}  # every parameter trained once
    assert is_hidden_matrix("transformer.h.0.mlp.c_fc.weight", model.transformer.h[0].mlp.c_fc.weight)
    assert not is_hidden_matrix("transformer.wte.weight", model.transformer.wte.weight)
    # its (heads, head size) score vectors
    additive = tiny_model(config=train_config(attention="additive").model, vocab_size=20)
    assert not is_hidden_matrix("transformer.h.0.attn.score_v", additive.transformer.h[0].attn.score_v)


def test_adamw_decays_matrices_not_gains():
    cfg = train_config(bias=True)
    model = tiny_model(config=cfg.model, vocab_size=20)
    (adamw,) = build_optimizers(model, cfg)
    for group in adamw.param_groups:
        assert all((p.ndim >= 2) == (group["weight_decay"] > 0) for p in group["params"])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("embedding_lr", [0.0, 0.05])
def test_embeddings_get_their_own_learning_rate(optimizer, embedding_lr):
    cfg = train_config(optimizer=optimizer, learning_rate=1e-3, embedding_lr=embedding_lr)
    model = tiny_model(config=cfg.model, vocab_size=20)
    adamw = build_optimizers(model, cfg)[0]
    lr_of = {id(p): g["lr"] for g in adamw.param_groups for p in g["params"]}
    assert lr_of[id(model.transformer.wte.weight)] == lr_of[id(model.transformer.wpe.weight)] == (embedding_lr or 1e-3)
    others = [lr for pid, lr in lr_of.items() if pid not in (id(model.transformer.wte.weight),
                                                               id(model.transformer.wpe.weight))]
    assert others and all(lr == 1e-3 for lr in others)  # the head, gains (and, with AdamW, every matrix)
    set_lr([adamw], 0.5)  # the schedule scales each group's own peak
    assert {g["lr"] for g in adamw.param_groups} == {0.5 * lr for lr in set(lr_of.values())}


# ---------------------------------------------------------------------------------------------- the schedule

def schedule(**overrides):
    return replace(TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=100), **overrides)


def test_warmup_reaches_the_peak_and_cosine_ends_at_min_lr():
    cfg = schedule()
    assert lr_factor_at(cfg, 0) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 9) == pytest.approx(1.0)
    assert lr_factor_at(cfg, 10) == pytest.approx(1.0)
    assert lr_factor_at(cfg, 100) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 500) == pytest.approx(0.1)  # flat at min_lr after lr_decay_iters


def test_warmup_equal_to_decay_never_divides_by_zero():
    cfg = schedule(warmup_iters=50, lr_decay_iters=50)
    assert [lr_factor_at(cfg, it) for it in (49, 50, 51)] == pytest.approx([1.0, 0.1, 0.1])


def test_constant_lr_without_decay_has_no_warmup():
    assert lr_factor_at(schedule(decay_lr=False), 0) == 1.0


def test_wsd_is_flat_then_linear_to_min_lr():
    cfg = schedule(lr_schedule="wsd", warmdown_frac=0.4)
    assert lr_factor_at(cfg, 59) == 1.0
    assert lr_factor_at(cfg, 80) == pytest.approx(1.0 - 0.5 * 0.9)
    assert lr_factor_at(cfg, 100) == pytest.approx(0.1)


def test_a_budget_by_the_clock_drives_the_decay_and_a_planned_one_does_not():
    planned = schedule(lr_schedule="wsd", warmdown_frac=0.4, max_time=100.0)
    assert lr_factor_at(planned, 20, time_progress=0.8) == 1.0  # its steps are planned: they alone say
    cfg = schedule(lr_schedule="wsd", warmdown_frac=0.4, max_time=100.0, wall_clock=True)
    assert lr_factor_at(cfg, 20, time_progress=0.1) == 1.0  # iterations ahead of time
    assert lr_factor_at(cfg, 20, time_progress=0.8) == pytest.approx(1.0 - 0.5 * 0.9)  # time ahead
    assert lr_factor_at(cfg, 20, time_progress=1.0) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 5, time_progress=0.9) == pytest.approx(0.6)  # warmup still counts steps


# ---------------------------------------------------------------------------------------------- the weight average

def test_the_weight_average_follows_the_weights_at_the_peak_and_averages_more_as_the_rate_decays():
    """Against the average written out step by step; the state dict gives it under both names of a tied table,
    and swapping it in for an evaluation leaves the weights as they were."""
    model = tiny_model(config=train_config(tie_weights=True).model, vocab_size=20)
    params = list(model.parameters())
    average = optimizers.EMA(model, decay=0.9)
    expected = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(0)
    for lr in (0.5, 1.0, 0.25, 0.0, 0.0):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=generator))
        average.update(lr)
        step = 1 - 0.9 * (1 - lr)  # at the peak (lr 1) a step all the way to the weights
        expected = [e + step * (p.detach() - e) for e, p in zip(expected, params)]
        for a, e in zip(average.values, expected):
            torch.testing.assert_close(a, e)
    state = average.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    torch.testing.assert_close(state["transformer.wte.weight"], expected[0])
    weights = [p.detach().clone() for p in params]
    x = torch.randint(0, 20, (2, 16))
    with average.swapped_in():
        inside = model(x)[0]
    reference = tiny_model(config=train_config(tie_weights=True).model, vocab_size=20)
    reference.load_state_dict(state)
    torch.testing.assert_close(inside, reference(x)[0])
    for p, w in zip(params, weights):
        assert torch.equal(p, w)
