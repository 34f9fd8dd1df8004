"""The parts train.py's loop is made of (gptkit/training.py): the random state a checkpoint carries, the whole-split
evaluation, the measured choices a resume keeps, and the model fitted to its time budget."""

import random

import numpy as np
import pytest
import torch

from conftest import tiny_model, train_config
from gptkit import timing, training
from gptkit.checkpoint import load_checkpoint, save_checkpoint
from gptkit.dataset import BatchSampler, Split
from gptkit.kernels import attention_path_of, set_attention_path
from gptkit.runtime import Runtime
from gptkit.training import evaluate_split, rng_state, set_rng_state


@pytest.mark.parametrize("order", ["random", "epochs"])
def test_every_rng_round_trips_through_a_checkpoint(tmp_path, order):
    """torch, numpy, python and the sampler (which redraws the batch it had fetched ahead) come back exactly; in
    epochs, with the batch fetched ahead running from the end of one epoch into the next."""
    (tmp_path / "train.bin").write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    sampler = BatchSampler(Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": 1000}, 8), 3, 0, "cpu", order)
    for _ in range(41):  # 123 of an epoch's 124 windows
        sampler.next()
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    pending, _ = sampler.next()
    save_checkpoint({"rng": [rng_state(sampler)]}, tmp_path / "ckpt.pt")

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), sampler.next()[0].tolist()

    first = draws()
    torch.manual_seed(9), np.random.seed(9), random.seed(9), sampler.next()
    set_rng_state(load_checkpoint(tmp_path / "ckpt.pt")["rng"][0], sampler)
    assert sampler.next()[0].tolist() == pending.tolist()
    assert draws() == first


@pytest.mark.parametrize("max_tokens", [0, 100, 37, 1, 5, 15, 16, 17])
def test_split_evaluation_scores_every_target_once(tmp_path, max_tokens):
    """Against a plain loop: consecutive windows, the last one cut to the targets no window scored yet; the whole
    split (max_tokens 0), or its first max_tokens targets, down to fewer than a block (a final_eval_tokens shorter
    than one)."""
    (tmp_path / "val.bin").write_bytes(np.random.default_rng(0).integers(0, 20, 203).astype(np.uint16).tobytes())
    split = Split(tmp_path, "val", {"dtype": "uint16", "vocab_size": 20}, 16)
    model = tiny_model(config=train_config().model, vocab_size=20).eval()
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


# ---------------------------------------------------------------------------------------------- measured choices

def test_a_resume_keeps_the_measured_choices_it_was_trained_with(monkeypatch):
    """Re-measuring on resume could switch path or precision mid-run (and SDPA draws dropout differently
    from the written-out paths), so the saved choices win; fresh runs measure."""
    from gptkit.training import settle_attention_path, settle_precision

    def no_probe(*args):
        raise AssertionError("a resumed run measured again")

    monkeypatch.setattr(timing, "attention_seconds", no_probe)
    rt, model = Runtime(device="cpu", dtype="float32"), tiny_model(config=train_config().model, vocab_size=20)
    saved = {"dtype": "bfloat16", "attention_path": "folded"}  # a checkpoint's measured choices
    settle_precision(train_config(), rt, model, saved)
    assert settle_attention_path(train_config(), rt, model, saved) == "folded"
    assert rt.dtype == "bfloat16" and attention_path_of(model.transformer.h[0].attn) == "folded"
    explicit = train_config(dtype="float32", attention_path="fused")  # what the command line says wins
    rt = Runtime(device="cpu", dtype="float32")
    settle_precision(explicit, rt, model, saved)
    assert settle_attention_path(explicit, rt, model, saved) == "fused" and rt.dtype == "float32"


def test_the_budget_is_fitted_to_the_step_on_the_measured_attention_path(monkeypatch, data_dir):
    """The shape probe times the configured model on the path the run measured, and the smaller model it trains
    instead takes that path too (and the checkpoint records it)."""

    monkeypatch.setattr(timing, "attention_seconds", lambda attn, shape, autocast, paths: {
        path: 1e-3 if path == "written" else 3e-3 for path in paths})
    paths = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, *args: paths.append(
        [attention_path_of(block.attn) for block in model.transformer.h]) or 0.0)
    cfg = train_config(max_time=60, min_tokens_per_param=6, smaller_n_layer=1, dtype="float32",
                 data_dir=str(data_dir), dataset="tiny")
    data, state = training.build_training(cfg, Runtime(device="cpu", dtype="float32"))
    assert paths == [["written"] * 2]
    assert [attention_path_of(block.attn) for block in state.model.transformer.h] == ["written"]
    assert state.measured["attention_path"] == "written"


def test_the_shape_probe_counts_the_budget_at_the_step_the_precision_probe_timed(monkeypatch, data_dir):
    """The precision probe has just timed the configured model's step in the chosen precision, on the path the
    run takes: the shape probe counts its budget at that step instead of timing it again (half a second of a
    150-second run's start on a 2-core EPYC)."""

    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(timing, "bf16_matmul_speedup", lambda: 2.0)
    monkeypatch.setattr(timing, "step_seconds_in_turns", lambda model, batch_size, paths, settled: {
        "float32": 1.0, "bfloat16": 0.5})
    timed = []
    monkeypatch.setattr(timing, "training_step_seconds", lambda model, *args, **kwargs: timed.append(model) or 1e-6)
    cfg = train_config(max_time=60, min_tokens_per_param=6, smaller_n_layer=1, data_dir=str(data_dir),
                 dataset="tiny")
    rt = Runtime(device="cpu", dtype="float32")
    data, state = training.build_training(cfg, rt)
    assert timed == [] and rt.dtype == "bfloat16"
    assert state.model.config.n_layer == 1  # at 0.5 s a step, 60 s give each parameter far fewer than 6 tokens


@pytest.mark.parametrize("seen", [5.9, 5.96, 6.0])
def test_a_model_too_big_for_its_budget_trains_as_the_smaller_shape(monkeypatch, capsys, seen):
    """Below min_tokens_per_param (tokens each parameter would see in max_time at the timed step) the run
    trains the smaller shape, from the weights a run configured with that shape starts from; at or above it,
    the model as configured. Both say why in one line, which never rounds a figure up to the threshold."""

    timed = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, batch_size, dtype, seconds, processes,
                        step: timed.append((model.config.n_layer, batch_size, dtype, seconds, processes)) or seen)
    cfg = train_config(max_time=60, min_tokens_per_param=6, smaller_n_layer=1)
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
    direct = training.build_model(train_config(n_layer=1), meta).state_dict()
    assert direct.keys() == model.state_dict().keys()
    assert all(torch.equal(direct[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("seen, trained", [({4: 2.8, 3: 6.5}, 3), ({4: 2.8, 3: 4.0}, 2)])
def test_a_fallback_too_big_for_its_budget_loses_a_layer_at_a_time_down_to_two(monkeypatch, capsys, seen, trained):
    """The smaller shape is timed too, on the attention path measured for the configured model; where it also
    falls short it drops a layer at a time, never below two, and the line names each shape that fell short."""

    timed = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, *args: (
        timed.append((model.config.n_layer, {attention_path_of(block.attn) for block in model.transformer.h})) or
        seen[model.config.n_layer]))
    cfg = train_config(n_layer=4, max_time=60, min_tokens_per_param=6, smaller_n_layer=3)
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
    direct = training.build_model(train_config(n_layer=trained), meta).state_dict()
    assert all(torch.equal(direct[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("smaller_n_embd, timed_layers", [(0, [4]), (16, [4, 3])])
def test_a_fallback_one_layer_short_of_a_timed_model_is_timed_only_where_its_figure_cannot_tell(
        monkeypatch, smaller_n_embd, timed_layers):
    """A fallback with fewer layers and nothing else changed runs a part of the bigger model's step, no slower: its
    parameters see at least the bigger one's tokens per parameter scaled by the bigger one's parameters over its
    own. Where that floor reaches min_tokens_per_param it trains untimed (a third of a second of the default's
    start on a 2-core EPYC); a narrower fallback is timed."""

    timed = []
    monkeypatch.setattr(training, "tokens_per_parameter", lambda model, *args: timed.append(model.config.n_layer)
                        or 5.0)
    cfg = train_config(n_layer=4, max_time=60, min_tokens_per_param=6, smaller_n_layer=3,
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

    budget = dict(max_time=60, min_tokens_per_param=6)
    assert train_config(**budget, smaller_n_embd=16).smaller_shape() == {"n_layer": 2, "n_embd": 16}
    assert train_config(**budget, smaller_n_layer=5).smaller_shape() is None  # nothing smaller than the model
    # smaller counts the blocks' weights, layers x width squared: deeper and narrower can be smaller, not wider
    assert train_config(**budget, smaller_n_layer=3, smaller_n_embd=16).smaller_shape() == {"n_layer": 3, "n_embd": 16}
    assert train_config(**budget, smaller_n_layer=1, smaller_n_embd=48).smaller_shape() is None
    with pytest.raises(ValueError, match=r"^smaller_n_layer and smaller_n_embd make no model: n_embd \(15\) must "
                                        r"be divisible by n_head \(2\)$"):
        train_config(**budget, smaller_n_embd=15)
    monkeypatch.setattr(training, "tokens_per_parameter", lambda *args: 0.0)  # far too few, if it were asked
    meta = {"vocab_size": 20, "tokenizer": "char"}
    for unfitted in (dict(budget, max_time=0), dict(budget, min_tokens_per_param=0), dict(budget, n_layer=1)):
        cfg = train_config(**unfitted, smaller_n_layer=1)
        model = training.build_model(cfg, meta)
        rt = Runtime(device="cpu", dtype="float32")
        assert training.fit_to_budget(cfg, rt, model, meta, ([], "fused")) == (cfg, model, None)
