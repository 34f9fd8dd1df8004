"""Every training option trains without NaN; Muon gets only hidden matrices; the LR schedule's edges;
gradient accumulation; the choice of precision."""

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gptkit import optim, timing
from gptkit.config import build
from gptkit.errors import UserError
from gptkit.optim import build_optimizers, is_hidden_matrix, lr_factor_at, set_lr
from gptkit.timing import pick_dtype
from gptkit.runtime import compile_blocks
from gptkit.train_config import TrainConfig
from gptkit.kernels import attention_path_of, by_rule, install, set_attention_path
from model import GPT


def config(**values):
    """A TrainConfig from flat keys, as the command line gives them (model settings included)."""
    return build(TrainConfig, values)


def tiny_model(cfg, vocab_size=20):
    return GPT(replace(cfg.model, vocab_size=vocab_size))

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, bias=False, dropout=0.0)

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
    model = tiny_model(cfg)
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
    cfg = config(**{**TINY, **OPTIONS[name]}, learning_rate=3e-3, warmup_iters=2, max_iters=8)
    losses = train_steps(cfg)
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0]  # it learns the fixed batch


def test_bf16_autocast_trains_without_nan():
    cfg = config(**TINY, **OPTIONS["default_bundle"], learning_rate=3e-3, warmup_iters=2, max_iters=8)
    losses = train_steps(cfg, dtype=torch.bfloat16)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


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
    ours, _ = muon_steps(lambda ps: optim.Muon(ps, ns_dtype=ns_dtype, **settings))
    exact, _ = muon_steps(lambda ps: optim.Muon(ps, ns_dtype=torch.float64, **settings))
    for mine, theirs, best in zip(ours, torch_params, exact):
        if ns_dtype == torch.bfloat16:
            assert torch.equal(mine, theirs)
        else:
            torch.testing.assert_close(mine, best, rtol=0, atol=1e-6)
            assert (theirs - best).abs().max() > 1e-4
    resumed = optim.Muon([p.clone() for p in torch_params], ns_dtype=ns_dtype, **settings)
    resumed.load_state_dict(torch_opt.state_dict())
    assert resumed.state_dict()["state"][0]["momentum_buffer"].equal(torch_opt.state_dict()["state"][0]["momentum_buffer"])


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
    ours, opt = adamw_steps(optim.AdamW)
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    _, resumed = adamw_steps(optim.AdamW, steps=0)
    resumed.load_state_dict(torch_opt.state_dict())
    saved, loaded = torch_opt.state_dict(), resumed.state_dict()
    assert loaded["param_groups"][1]["params"] == saved["param_groups"][1]["params"] == [2]
    assert loaded["param_groups"][1]["lr"] == 0.03
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert loaded["state"][2][key].equal(saved["state"][2][key])


def test_an_eager_run_never_imports_torchs_compiler(tmp_path, data_dir):
    """Building a torch.optim optimizer, or asking for eager evaluation, imports torch's compiler: about a second
    before the first step on a 2-core CPU. A run that compiles nothing trains, evaluates and saves without it."""
    from conftest import REPO, check_ok, train_args

    code = ("import sys, train; train.main(sys.argv[1:]); "
            "print('compiler imported' if 'torch._dynamo' in sys.modules else 'compiler never imported')")
    args = train_args(data_dir, tmp_path / "out", "--optimizer=muon", "--ema_decay=0.9", "--max_iters=3",
                      "--eval_interval=2", "--compile=False")
    proc = check_ok(subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                                   timeout=120))
    assert proc.stdout.strip().endswith("compiler never imported"), proc.stdout


@pytest.mark.parametrize("tie", [True, False])
def test_muon_gets_only_hidden_matrices(tie):
    cfg = config(**TINY, optimizer="muon", tie_weights=tie)
    model = tiny_model(cfg)
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
    additive = tiny_model(config(**TINY, attention="additive"))  # its (heads, head size) score vectors
    assert not is_hidden_matrix("transformer.h.0.attn.score_v", additive.transformer.h[0].attn.score_v)


def test_adamw_decays_matrices_not_gains():
    cfg = config(**{**TINY, "bias": True})
    model = tiny_model(cfg)
    (adamw,) = build_optimizers(model, cfg)
    for group in adamw.param_groups:
        assert all((p.ndim >= 2) == (group["weight_decay"] > 0) for p in group["params"])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("embedding_lr", [0.0, 0.05])
def test_embeddings_get_their_own_learning_rate(optimizer, embedding_lr):
    cfg = config(**TINY, optimizer=optimizer, learning_rate=1e-3, embedding_lr=embedding_lr)
    model = tiny_model(cfg)
    adamw = build_optimizers(model, cfg)[0]
    lr_of = {id(p): g["lr"] for g in adamw.param_groups for p in g["params"]}
    assert lr_of[id(model.transformer.wte.weight)] == lr_of[id(model.transformer.wpe.weight)] == (embedding_lr or 1e-3)
    others = [lr for pid, lr in lr_of.items() if pid not in (id(model.transformer.wte.weight),
                                                               id(model.transformer.wpe.weight))]
    assert others and all(lr == 1e-3 for lr in others)  # the head, gains (and, with AdamW, every matrix)
    set_lr([adamw], 0.5)  # the schedule scales each group's own peak
    assert {g["lr"] for g in adamw.param_groups} == {0.5 * lr for lr in set(lr_of.values())}


def test_compiled_blocks_keep_the_plain_parameter_names():
    model = tiny_model(config(**TINY))
    names = list(model.state_dict())
    compile_blocks(model)  # compiles lazily, at the first call: nothing is compiled here
    assert list(model.state_dict()) == names and not any("_orig_mod" in n for n in names)
    assert all(block._compiled_call_impl is not None for block in model.transformer.h)


def test_a_compiled_block_keeps_its_dropouts_in_one_graph():
    """Dropout draws its mask's offset as a number inside the block; compiled blocks capture it rather than
    breaking the graph at every dropout, which cost compiled steps with dropout 0.1 about 5% more."""
    model = tiny_model(config(**dict(TINY, dropout=0.1))).train()
    install(model, by_rule("cpu"))  # dropout's masks from the table, as a CPU run draws them
    compile_blocks(model)
    block, x = model.transformer.h[0], torch.randn(4, 16, 32)
    type(block).forward(block, x)  # eagerly, as a run's start-up probes do: builds the table of masks
    explained = torch._dynamo.explain(type(block).forward)(block, x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


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


def test_time_budget_drives_the_decay():
    cfg = schedule(lr_schedule="wsd", warmdown_frac=0.4, max_time=100.0)
    assert lr_factor_at(cfg, 20, time_progress=0.1) == 1.0  # iterations ahead of time
    assert lr_factor_at(cfg, 20, time_progress=0.8) == pytest.approx(1.0 - 0.5 * 0.9)  # time ahead
    assert lr_factor_at(cfg, 20, time_progress=1.0) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 5, time_progress=0.9) == pytest.approx(0.6)  # warmup still counts steps


def test_gradient_accumulation_gives_the_update_of_one_big_batch(tmp_path, data_dir):
    """train.py with 2 micro-batches of 4 takes the same step as with one batch of 8: the sampler draws
    the same 8 windows either way, and each micro-batch's loss is divided by the number of them."""
    import train
    from conftest import train_args
    from gptkit.checkpoint import load_checkpoint

    # one attention path for both: each run's probe could pick another, whose sums round differently
    common = ["--max_iters=2", "--eval_interval=100", "--eval_iters=1", "--warmup_iters=0", "--learning_rate=1e-2",
              "--grad_clip=0", "--attention_path=written"]
    shapes = {"big": ["--batch_size=8"], "accum": ["--batch_size=4", "--gradient_accumulation_steps=2"]}
    for name, shape in shapes.items():
        train.main(train_args(data_dir, tmp_path / name, *common, *shape))
    big, accum = (load_checkpoint(tmp_path / name / "latest.pt") for name in ("big", "accum"))
    assert big["iter_num"] == accum["iter_num"] == 2
    big, accum = big["model"], accum["model"]
    for key in big:
        torch.testing.assert_close(accum[key], big[key], rtol=0, atol=1e-6)


def test_the_weight_average_follows_the_weights_at_the_peak_and_averages_more_as_the_rate_decays():
    """Against the average written out step by step; the state dict gives it under both names of a tied table,
    and swapping it in for an evaluation leaves the weights as they were."""
    model = tiny_model(config(**TINY, tie_weights=True))
    params = list(model.parameters())
    average = optim.EMA(model, decay=0.9)
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
    reference = tiny_model(config(**TINY, tie_weights=True))
    reference.load_state_dict(state)
    torch.testing.assert_close(inside, reference(x)[0])
    for p, w in zip(params, weights):
        assert torch.equal(p, w)


def test_with_a_weight_average_the_runs_score_and_checkpoint_the_average(tmp_path, data_dir):
    """The final score is the score of latest.pt's model, the average; the weights trained on are kept beside it."""
    import train
    from conftest import logged, train_args
    from gptkit.checkpoint import load_checkpoint, model_from_checkpoint
    from gptkit.dataset import Split, load_meta
    from gptkit.training import evaluate_split

    train.main(train_args(data_dir, tmp_path, "--max_iters=20", "--eval_interval=10", "--eval_iters=1",
                          "--warmup_iters=2", "--learning_rate=1e-2", "--ema_decay=0.9"))
    ckpt = load_checkpoint(tmp_path / "latest.pt")
    assert any(not torch.equal(ckpt["model"][k], ckpt["trained"][k]) for k in ckpt["model"])
    folder, meta = load_meta(str(data_dir), "tiny")
    model = model_from_checkpoint(ckpt, "latest.pt")
    loss, _ = evaluate_split(model, Split(folder, "val", meta, 16), torch.autocast("cpu", enabled=False), 4)
    assert logged(tmp_path, "final", "val_loss")[20] == pytest.approx(loss, rel=1e-6)


@pytest.mark.parametrize("bf16_instructions,matmul_speedup,step_speedup,want", [
    (True, 2.0, 2.0, "bfloat16"), (True, 2.0, 1.1, "float32"), (True, 4.0, 0.5, "float32"),
    (True, 0.5, None, "float32"), (False, 2.0, 2.0, "float32")])
def test_training_precision_is_the_faster_step_not_the_flags(monkeypatch, bf16_instructions, matmul_speedup,
                                                             step_speedup, want):
    """'auto' on a CPU times the model's own step in each precision, and bf16 must win clearly; where bf16
    matmuls are slower than fp32 no step is timed, and without bf16 instructions nothing is."""
    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: bf16_instructions)
    monkeypatch.setattr(timing, "bf16_matmul_speedup", lambda: matmul_speedup)
    asked = {}

    def step_seconds_in_turns(model, batch_size, paths, settled):
        asked["settled"] = settled
        return {"float32": 1.0, "bfloat16": 1.0 / step_speedup}

    monkeypatch.setattr(timing, "step_seconds_in_turns", step_seconds_in_turns)
    dtype, why, _, seconds = timing.pick_training_dtype("auto", tiny_model(config(**TINY)), 4, "cpu")
    assert dtype == want
    if "settled" in asked:  # one timing of each settles it, unless bf16's speed-up is within 1.3x of the 1.15x margin
        assert asked["settled"]({"float32": 1.0, "bfloat16": 1.0 / step_speedup}) == (step_speedup != 1.1)
    step = 1.0 if want == "float32" else 1.0 / step_speedup  # the chosen precision's step, where one was timed
    assert seconds == (None if not bf16_instructions or step_speedup is None else step)
    if not bf16_instructions:
        assert why is None
    elif step_speedup is None:
        assert why == "precision: float32 (bfloat16 matmuls ran at 0.50x the float32 speed here)"
    else:
        assert why == (f"precision: {want} (a training step, forward and backward, took 1000 ms in float32 and "
                       f"{1000 / step_speedup:.0f} ms in bfloat16 here)")
    assert timing.pick_training_dtype("float32", tiny_model(config(**TINY)), 4, "cpu") == ("float32",) + (None,) * 3
    assert pick_dtype("bfloat16", "cpu") == "bfloat16" and pick_dtype("auto", "mps") == "float32"
    with pytest.raises(UserError, match="float16 is not supported on CPU"):
        pick_dtype("float16", "cpu")


def test_each_precision_is_timed_on_the_attention_path_it_would_train_on(monkeypatch):
    """SDPA's fused kernel can take three times the folded path's time on a CPU: a step timed on a path the run
    will not take misjudges the precision. Each precision's step runs on the path measured fastest in it, or on
    the configured one, and the model's own path is put back; the run then trains on the chosen precision's
    path without measuring the paths again (noise could pick another)."""
    from gptkit.runtime import Runtime
    from gptkit.training import settle_attention_path, settle_precision

    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(timing, "bf16_matmul_speedup", lambda: 2.0)
    fastest, measured = {"float32": "written", "bfloat16": "folded"}, []

    def attention_seconds(attn, shape, autocast, paths):
        measured.extend(paths)
        best = fastest["bfloat16" if isinstance(autocast, torch.autocast) else "float32"]
        return {path: 1e-3 if path == best else 3e-3 for path in paths}

    monkeypatch.setattr(timing, "attention_seconds", attention_seconds)
    timed = []
    monkeypatch.setattr(timing, "step_seconds_in_turns", lambda model, batch_size, paths, settled: timed.append(
        dict(paths)) or {"float32": 1.0, "bfloat16": 0.5})
    model = tiny_model(config(**TINY))
    dtype, _, (path, why), _ = timing.pick_training_dtype("auto", model, 4, "cpu")
    assert timed == [{"float32": "written", "bfloat16": "folded"}]
    assert (dtype, path) == ("bfloat16", "folded") and why.startswith("attention: the folded path (")
    assert [attention_path_of(block.attn) for block in model.transformer.h] == ["fused"] * 2
    timed.clear()
    assert timing.pick_training_dtype("auto", model, 4, "cpu", attention_path="written")[2] == ("written", None)
    assert timed == [{"float32": "written", "bfloat16": "written"}]
    measured.clear()
    rt = Runtime(device="cpu", dtype="float32")
    assert settle_attention_path(config(**TINY), rt, model, {},
                                 settle_precision(config(**TINY), rt, model, {})[0]) == "folded"
    assert rt.dtype == "bfloat16" and len(measured) == 6  # three paths in each precision, none after


def test_the_budget_is_fitted_to_the_step_on_the_measured_attention_path(monkeypatch, data_dir):
    """The shape probe times the configured model on the path the run measured, and the smaller model it trains
    instead takes that path too (and the checkpoint records it)."""
    from gptkit import training
    from gptkit.runtime import Runtime

    monkeypatch.setattr(timing, "attention_seconds", lambda attn, shape, autocast, paths: {
        path: 1e-3 if path == "written" else 3e-3 for path in paths})
    paths = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, *args: paths.append(
        [attention_path_of(block.attn) for block in model.transformer.h]) or 0.0)
    cfg = config(**TINY, max_time=60, min_tokens_per_param=6, smaller_n_layer=1, dtype="float32",
                 data_dir=str(data_dir), dataset="tiny")
    data, state = training.build_training(cfg, Runtime(device="cpu", dtype="float32"))
    assert paths == [["written"] * 2]
    assert [attention_path_of(block.attn) for block in state.model.transformer.h] == ["written"]
    assert state.measured["attention_path"] == "written"


def test_the_shape_probe_counts_the_budget_at_the_step_the_precision_probe_timed(monkeypatch, data_dir):
    """The precision probe has just timed the configured model's step in the chosen precision, on the path the
    run takes: the shape probe counts its budget at that step instead of timing it again (half a second of a
    150-second run's start on a 2-core EPYC)."""
    from gptkit import training
    from gptkit.runtime import Runtime

    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(timing, "bf16_matmul_speedup", lambda: 2.0)
    monkeypatch.setattr(timing, "step_seconds_in_turns", lambda model, batch_size, paths, settled: {
        "float32": 1.0, "bfloat16": 0.5})
    timed = []
    monkeypatch.setattr(timing, "training_step_seconds", lambda model, *args, **kwargs: timed.append(model) or 1e-6)
    cfg = config(**TINY, max_time=60, min_tokens_per_param=6, smaller_n_layer=1, data_dir=str(data_dir),
                 dataset="tiny")
    rt = Runtime(device="cpu", dtype="float32")
    data, state = training.build_training(cfg, rt)
    assert timed == [] and rt.dtype == "bfloat16"
    assert state.model.config.n_layer == 1  # at 0.5 s a step, 60 s give each parameter far fewer than 6 tokens


def test_timing_training_steps_takes_turns_on_each_precisions_path_and_leaves_no_trace():
    """Each precision's step runs on its own attention path, the two taking turns (a machine whose speed moves
    must slow both alike). The probe runs before training: it must leave no gradients, the model's own path, and
    the random generators unmoved, so that a run's data order and dropout masks do not depend on it."""
    model = tiny_model(config(**{**TINY, "dropout": 0.1}))
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(
        ([attention_path_of(block.attn) for block in module.transformer.h], torch.is_autocast_enabled("cpu"))))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    seconds = timing.step_seconds_in_turns(model, 2, {"float32": "written", "bfloat16": "folded"}, repeats=2)
    assert set(seconds) == {"float32", "bfloat16"} and min(seconds.values()) > 0
    assert calls == [(["written"] * 2, False), (["folded"] * 2, True)] * 3  # one untimed call each, then 2 turns
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())
    assert [attention_path_of(block.attn) for block in model.transformer.h] == ["fused"] * 2


@pytest.mark.parametrize("max_tokens", [0, 100, 37])
def test_split_evaluation_scores_every_target_once(tmp_path, max_tokens):
    """Against a plain loop: consecutive windows, the last one cut to the targets no window scored yet."""
    import numpy as np

    from gptkit.dataset import Split
    from gptkit.training import evaluate_split

    (tmp_path / "val.bin").write_bytes(np.random.default_rng(0).integers(0, 20, 203).astype(np.uint16).tobytes())
    split = Split(tmp_path, "val", {"dtype": "uint16", "vocab_size": 20}, 16)
    model = tiny_model(config(**TINY)).eval()
    loss, scored = evaluate_split(model, split, torch.autocast("cpu", enabled=False), 3, max_tokens)
    tokens = torch.from_numpy(np.fromfile(tmp_path / "val.bin", dtype=np.uint16).astype(np.int64))
    n = max_tokens or len(tokens) - 1
    losses = []
    with torch.no_grad():
        for start in range(0, n, 16):
            end = min(start + 16, n)  # targets start+1 .. end
            first = max(0, end - 16)  # a full window ending at `end`
            logits, _ = model(tokens[first:end][None], tokens[first + 1:end + 1][None])
            per_token = torch.nn.functional.cross_entropy(logits[0], tokens[first + 1:end + 1], reduction="none")
            losses += per_token[start - first:].tolist()
    assert scored == n == len(losses)
    assert loss == pytest.approx(sum(losses) / n, rel=1e-5)


def test_probes_time_their_candidates_in_turns_and_keep_each_ones_fastest(monkeypatch):
    """A machine whose speed moves while a probe runs must slow each candidate alike, not the ones timed last;
    the untimed first call of each (kernel selection) never counts."""
    clock, order = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    durations = {"a": [0.1, 9, 7, 8], "b": [0.1, 5, 6, 3]}

    def run(name):
        order.append(name)
        clock[0] += durations[name][order.count(name) - 1]

    assert timing.fastest_in_turns({name: lambda name=name: run(name) for name in durations}, 3) == {"a": 7, "b": 3}
    assert order == ["a", "b"] * 4
    order.clear()  # where the first turn settles what the timings are for, the other turns are not run
    assert timing.fastest_in_turns({name: lambda name=name: run(name) for name in durations}, 3,
                                   settled=lambda best: best["b"] < best["a"]) == {"a": 9, "b": 5}
    assert order == ["a", "b"] * 2


@pytest.mark.parametrize("fastest", ["fused", "written", "folded"])
def test_attention_path_is_the_fastest_one_measured(monkeypatch, fastest):
    monkeypatch.setattr(timing, "attention_seconds", lambda attn, shape, autocast, paths: {
        path: (1.0 if path == fastest else 3.0) / 1e3 for path in paths})
    model = tiny_model(config(**TINY))
    path, why = timing.attention_path_for("auto", model, 4, torch.autocast("cpu", enabled=False), "cpu")
    assert path == fastest and why.startswith(f"attention: the {fastest} path (") and "3.0 ms" in why
    assert timing.attention_path_for("auto", model, 4, None, "cuda") == ("fused", None)  # no probe on a GPU
    assert timing.attention_path_for("written", model, 4, None, "cpu") == ("written", None)  # as set
    uniform = tiny_model(config(**TINY, attention="uniform"))
    assert timing.attention_path_for("auto", uniform, 4, None, "cpu") == ("fused", None)  # nothing to choose


def test_a_resume_keeps_the_measured_choices_it_was_trained_with(monkeypatch):
    """Re-measuring on resume could switch path or precision mid-run (and SDPA draws dropout differently
    from the written-out paths), so the saved choices win; fresh runs measure."""
    from gptkit.runtime import Runtime
    from gptkit.training import settle_attention_path, settle_precision

    def no_probe(*args):
        raise AssertionError("a resumed run measured again")

    monkeypatch.setattr(timing, "attention_seconds", no_probe)
    rt, model = Runtime(device="cpu", dtype="float32"), tiny_model(config(**TINY))
    saved = {"dtype": "bfloat16", "attention_path": "folded"}  # a checkpoint's measured choices
    settle_precision(config(**TINY), rt, model, saved)
    assert settle_attention_path(config(**TINY), rt, model, saved) == "folded"
    assert rt.dtype == "bfloat16" and attention_path_of(model.transformer.h[0].attn) == "folded"
    explicit = config(**TINY, dtype="float32", attention_path="fused")  # what the command line says wins
    rt = Runtime(device="cpu", dtype="float32")
    settle_precision(explicit, rt, model, saved)
    assert settle_attention_path(explicit, rt, model, saved) == "fused" and rt.dtype == "float32"


def test_tokens_per_parameter_is_the_budget_at_the_timed_step_over_the_parameters(monkeypatch):
    model = tiny_model(config(**TINY))
    timed = []
    monkeypatch.setattr(timing, "training_step_seconds", lambda *args, **kwargs: timed.append(args) or 0.5)
    seen = timing.tokens_per_parameter(model, 4, "float32", 60, processes=2)
    assert timed == [(model, 4, "float32")]
    assert seen == pytest.approx(60 * 2 * 4 * 16 / 0.5 / model.num_params())  # 2 processes of 4 x 16 tokens
    assert timing.tokens_per_parameter(model, 4, "float32", 60, 2, step=0.25) == pytest.approx(2 * seen)
    assert len(timed) == 1  # a step timed already is not timed again


@pytest.mark.parametrize("seen", [5.9, 5.96, 6.0])
def test_a_model_too_big_for_its_budget_trains_as_the_smaller_shape(monkeypatch, capsys, seen):
    """Below min_tokens_per_param (tokens each parameter would see in max_time at the timed step) the run
    trains the smaller shape, from the weights a run configured with that shape starts from; at or above it,
    the model as configured. Both say why in one line, which never rounds a figure up to the threshold."""
    from gptkit import training
    from gptkit.runtime import Runtime

    timed = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, batch_size, dtype, seconds, processes,
                        step: timed.append((model.config.n_layer, batch_size, dtype, seconds, processes)) or seen)
    cfg = config(**TINY, max_time=60, min_tokens_per_param=6, smaller_n_layer=1)
    meta = {"vocab_size": 20, "tokenizer": "char"}
    training.seed_everything(cfg.seed)
    configured = training.build_model(cfg, meta)
    fitted_cfg, model, fitted_from = training.fit_to_budget(cfg, Runtime(device="cpu", dtype="float32"),
                                                            configured, meta, ([], "fused"))
    assert timed == [(2, 4, "float32", 60, 1)]
    line = capsys.readouterr().out
    if seen >= 6:
        assert (fitted_cfg, model, fitted_from) == (cfg, configured, None)
        assert line == "shape: n_layer=2, n_embd=32 as configured (6.0 tokens per parameter in 60 s at the step timed " \
                       "here; min_tokens_per_param=6)\n"
        return
    assert model.config.n_layer == fitted_cfg.model.n_layer == 1 and fitted_from == {"n_layer": 2, "n_embd": 32}
    assert line.startswith("shape: n_layer=1, n_embd=32 instead of n_layer=2, n_embd=32: at the step timed here the configured "
                           "model would see 5.9 tokens per parameter in 60 s, fewer than min_tokens_per_param=6")
    training.seed_everything(cfg.seed)
    direct = training.build_model(config(**{**TINY, "n_layer": 1}), meta).state_dict()
    assert direct.keys() == model.state_dict().keys()
    assert all(torch.equal(direct[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("seen, trained", [({4: 2.8, 3: 6.5}, 3), ({4: 2.8, 3: 4.0}, 2)])
def test_a_fallback_too_big_for_its_budget_loses_a_layer_at_a_time_down_to_two(monkeypatch, capsys, seen, trained):
    """The smaller shape is timed too, on the attention path measured for the configured model; where it also
    falls short it drops a layer at a time, never below two, and the line names each shape that fell short."""
    from gptkit import training
    from gptkit.runtime import Runtime

    timed = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, *args: (
        timed.append((model.config.n_layer, {attention_path_of(block.attn) for block in model.transformer.h})) or
        seen[model.config.n_layer]))
    cfg = config(**{**TINY, "n_layer": 4}, max_time=60, min_tokens_per_param=6, smaller_n_layer=3)
    meta = {"vocab_size": 20, "tokenizer": "char"}
    configured = training.build_model(cfg, meta)
    set_attention_path(configured, "written")
    fitted_cfg, model, fitted_from = training.fit_to_budget(cfg, Runtime(device="cpu", dtype="float32"),
                                                            configured, meta, ([], "written"))
    assert timed == [(4, {"written"}), (3, {"written"})]
    assert model.config.n_layer == fitted_cfg.model.n_layer == trained and fitted_from == {"n_layer": 4, "n_embd": 32}
    assert {attention_path_of(block.attn) for block in model.transformer.h} == {"written"}
    fell_short = ", n_layer=3 4.0" if trained == 2 else ""
    assert capsys.readouterr().out == (
        f"shape: n_layer={trained}, n_embd=32 instead of n_layer=4, n_embd=32: at the step timed here the configured "
        f"model would see 2.8 tokens per parameter in 60 s{fell_short}, fewer than min_tokens_per_param=6 "
        "(--min_tokens_per_param=0 keeps it)\n")
    training.seed_everything(cfg.seed)
    direct = training.build_model(config(**{**TINY, "n_layer": trained}), meta).state_dict()
    assert all(torch.equal(direct[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("smaller_n_embd, timed_layers", [(0, [4]), (16, [4, 3])])
def test_a_fallback_one_layer_short_of_a_timed_model_is_timed_only_where_its_figure_cannot_tell(
        monkeypatch, smaller_n_embd, timed_layers):
    """A fallback with fewer layers and nothing else changed runs a part of the bigger model's step, no slower: its
    parameters see at least the bigger one's tokens per parameter scaled by the bigger one's parameters over its
    own. Where that floor reaches min_tokens_per_param it trains untimed (a third of a second of the default's
    start on a 2-core EPYC); a narrower fallback is timed."""
    from gptkit import training
    from gptkit.runtime import Runtime

    timed = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, *args: timed.append(model.config.n_layer)
                        or 5.0)
    cfg = config(**{**TINY, "n_layer": 4}, max_time=60, min_tokens_per_param=6, smaller_n_layer=3,
                 smaller_n_embd=smaller_n_embd)
    meta = {"vocab_size": 20, "tokenizer": "char"}
    configured = training.build_model(cfg, meta)
    fitted_cfg, model, _ = training.fit_to_budget(cfg, Runtime(device="cpu", dtype="float32"), configured, meta,
                                                  ([], "fused"))
    assert timed == timed_layers
    if smaller_n_embd:  # timed at 5.0, under 6: one layer fewer again
        assert model.config.n_layer == fitted_cfg.model.n_layer == 2
    else:  # 4 layers' 5.0 tokens per parameter are over 6 for each of 3 layers'
        assert model.config.n_layer == fitted_cfg.model.n_layer == 3
        assert 5.0 * configured.num_params() / model.num_params() >= 6
        assert training.seen_at_least(model, 5.0, configured) == 0.0  # more layers: no floor


def test_the_smaller_shape_is_checked_and_fitted_only_where_a_budget_can_ask_for_it(monkeypatch):
    from gptkit import training
    from gptkit.runtime import Runtime

    budget = dict(TINY, max_time=60, min_tokens_per_param=6)
    assert config(**budget, smaller_n_embd=16).smaller_shape() == {"n_layer": 2, "n_embd": 16}
    assert config(**budget, smaller_n_layer=5).smaller_shape() is None  # nothing smaller than the model
    # smaller counts the blocks' weights, layers x width squared: deeper and narrower can be smaller, not wider
    assert config(**budget, smaller_n_layer=3, smaller_n_embd=16).smaller_shape() == {"n_layer": 3, "n_embd": 16}
    assert config(**budget, smaller_n_layer=1, smaller_n_embd=48).smaller_shape() is None
    with pytest.raises(ValueError, match=r"^smaller_n_layer and smaller_n_embd make no model: n_embd \(15\) must "
                                        r"be divisible by n_head \(2\)$"):
        config(**budget, smaller_n_embd=15)
    monkeypatch.setattr(training, "tokens_per_parameter", lambda *args: 0.0)  # far too few, if it were asked
    meta = {"vocab_size": 20, "tokenizer": "char"}
    for unfitted in (dict(budget, max_time=0), dict(budget, min_tokens_per_param=0), dict(budget, n_layer=1)):
        cfg = config(**unfitted, smaller_n_layer=1)
        model = training.build_model(cfg, meta)
        rt = Runtime(device="cpu", dtype="float32")
        assert training.fit_to_budget(cfg, rt, model, meta, ([], "fused")) == (cfg, model, None)


def test_the_thread_count_follows_the_faster_steps():
    """On a busy machine one thread can step faster than two: a trial of the other count wins only when its
    steps (the first after the switch not counted) are faster by more than the margin; a loss changes nothing."""
    from gptkit.timing import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, every=0.0, first=0.0, trial_steps=4)
        assert [tuner.after_step(0.100, i) for i in range(4)] == [None] * 4 and torch.get_num_threads() == 1
        lines = [tuner.after_step(s, 4 + i) for i, s in enumerate([0.5, 0.03, 0.03, 0.03, 0.03])]
        assert lines[:4] == [None] * 4 and lines[4] == "threads: 1 from iteration 8 (its steps took 30 ms, on 2 " \
                                                          "threads 100 ms)"
        assert torch.get_num_threads() == 1
        for i, s in enumerate([0.03] * 4 + [0.5] + [0.03] * 4):  # two threads as fast: not worth switching back
            assert tuner.after_step(s, 9 + i) is None
        assert torch.get_num_threads() == 1 and tuner.current == 1
    finally:
        torch.set_num_threads(before)


def test_thread_trials_back_off_while_they_keep_the_count_and_come_at_once_when_steps_drift():
    """Each trial costs steps: on an idle machine they must grow rare (up to `longest` apart on the most threads,
    twice `every` on one), yet a process arriving (the steps slowing by more than `drift`) must be tried at once."""
    from gptkit.timing import ThreadTuner

    now, before = [0.0], torch.get_num_threads()

    def steps(tuner, seconds, count, advance=0.0):
        lines = []
        for _ in range(count):
            now[0] += advance
            lines.append(tuner.after_step(seconds, 0))
        return [line for line in lines if line]

    try:
        tuner = ThreadTuner(2, every=10.0, first=0.0, trial_steps=4, longest=40.0, drift=1.25, clock=lambda: now[0])
        assert steps(tuner, 0.1, 4) == [] and torch.get_num_threads() == 1  # the first trial, at once
        assert steps(tuner, 0.2, 5) == [] and torch.get_num_threads() == 2  # kept: next wait 20 s
        assert steps(tuner, 0.1, 15, advance=1.0) == [] and torch.get_num_threads() == 2  # 15 s: none yet
        steps(tuner, 0.1, 6, advance=1.0)
        assert torch.get_num_threads() == 1  # 21 s after the last: tried
        assert steps(tuner, 0.2, 5) == [] and tuner.wait == 40.0
        steps(tuner, 0.1, 1000, advance=0.03)  # 30 s of steady steps: no trial before the 40 s wait
        assert torch.get_num_threads() == 2 and tuner.trial is None
        assert steps(tuner, 0.3, 3) == [] and torch.get_num_threads() == 2  # three slow steps may be noise
        assert steps(tuner, 0.3, 1) == [] and torch.get_num_threads() == 1  # four: tried at once
        assert steps(tuner, 0.15, 5) == ["threads: 1 from iteration 0 (its steps took 150 ms, on 2 threads 300 ms)"]
        assert tuner.wait == 10.0
        for _ in range(3):  # on one thread the wait stops at twice `every`: a core freed again is found soon
            steps(tuner, 0.15, 4, advance=10.0)
            steps(tuner, 0.3, 5)
        assert tuner.current == 1 and tuner.wait == 20.0
    finally:
        torch.set_num_threads(before)


FAULTS_OF_BIG_TENSORS = """
import resource, sys, torch
from gptkit.runtime import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
for _ in range(20):  # until the heap holds free blocks that fit (allocations are aligned)
    torch.ones(16 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(16 << 20)  # 64 MB, over glibc's largest default mmap threshold (32 MB)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "gnu_get_libc_version"), reason="glibc only")
def test_training_processes_reuse_freed_memory_for_big_tensors():
    """A big activation freed and allocated again each step must not fault its pages in afresh: by default glibc
    maps every allocation over 32 MB anew, which cost the baby GPT's eager CPU step nearly half its time."""
    faults = {}
    for mode in ("default", "kept"):
        run = subprocess.run([sys.executable, "-c", FAULTS_OF_BIG_TENSORS, mode], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).resolve().parents[1])
        faults[mode] = int(run.stdout)
    if faults["default"] < 10 * 16_000:  # 16,384 pages of 4 KB each time, unless huge pages back them
        pytest.skip(f"big allocations fault in {faults['default']:,} pages here, not page by page")
    assert faults["kept"] < faults["default"] / 20
