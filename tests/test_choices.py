"""gptkit/choices.py: the start-up choices (threads, precision, attention path, shape) on a simulated machine,
idle, beside a process that keeps a core busy the whole time, and under a passing spike; the shape rule that
cannot invert; and what the run says."""

from dataclasses import replace

import pytest
import torch

from conftest import tiny_model, train_config
from gptkit import choices, timing, training
from gptkit.choices import Choices, choose, scaled_seen
from gptkit.config import build
from gptkit.kernels import attention_path_of
from gptkit.runtime import Runtime
from gptkit.train_config import TrainConfig

SHAPE = dict(n_layer=4, n_head=2, n_embd=32, block_size=16, batch_size=4, bias=False, dropout=0.0)


def config(**values):
    return build(TrainConfig, {**SHAPE, "max_time": 60, "min_tokens_per_param": 8, "smaller_n_layer": 3,
                               "device": "cpu", **values})


class Machine:
    """A simulated 2-core CPU, on a fake clock: a step costs `per_param` seconds a parameter, bf16 half of fp32's,
    2 threads `two_threads` of 1 thread's. busy=True: another process holds a core the whole time, and a step on 2
    threads waits for the thread that shares it (4x); spike_at: that many timed calls in, one call takes 20x."""

    def __init__(self, monkeypatch, two_threads=0.95, busy=False, spike_at=None, per_param=2e-7, bf16=0.5):
        self.now, self.calls, self.two_threads, self.busy = 0.0, 0, two_threads, busy
        self.spike_at, self.per_param, self.bf16 = spike_at, per_param, bf16
        self.dtypes, self.paths = [], {}  # what was timed: each step's precision, each precision's paths
        monkeypatch.setattr(timing.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(choices, "cpu_has_bf16", lambda: True)
        monkeypatch.setattr(choices, "matmul_peak", lambda dtype, *args: 2.0 if dtype == "bfloat16" else 1.0)
        monkeypatch.setattr(choices, "attention_path_for", lambda model, batch, dtype, device, c=None: "written")
        monkeypatch.setattr(choices, "training_step", self.step)
        monkeypatch.setattr(torch, "get_num_threads", lambda: self.threads)
        monkeypatch.setattr(torch, "set_num_threads", lambda n: setattr(self, "threads", n))
        self.threads = 2

    def step(self, model, batch_size, dtype, path):
        def run():
            self.dtypes.append(dtype)
            self.paths.setdefault(dtype, []).append(path)
            seconds = model.num_params() * self.per_param * (self.bf16 if dtype == "bfloat16" else 1.0)
            if self.threads == 2:
                seconds *= self.two_threads * (4 if self.busy else 1)
            self.calls += 1
            self.now += seconds * (20 if self.calls == self.spike_at else 1)
        return run


def chosen(cfg):
    rt = Runtime(device="cpu", dtype="float32")
    def build(cfg):  # the tiny vocabulary: the config's own default is GPT-2's
        return tiny_model(**(vars(cfg.model) | {"vocab_size": 37}))

    cfg, model, picked = choose(cfg, rt, build(cfg), {}, build)
    return picked.threads, picked.dtype, model.config.n_layer, picked


@pytest.mark.parametrize("per_param", [2e-7, 6e-7], ids=["keeps 4 layers", "fits 3 layers"])
def test_a_core_busy_the_whole_time_or_a_passing_spike_changes_no_choice(monkeypatch, per_param):
    """On a CPU where two threads gain little for a small model (as on the 2-core EPYC), idle and beside a busy
    process the run picks one thread, bfloat16 and the same shape; a spike in any one timed call changes nothing."""
    Machine(monkeypatch, per_param=per_param)
    idle = chosen(config())
    assert idle[:3] == (1, "bfloat16", 4 if per_param == 2e-7 else 3)
    Machine(monkeypatch, per_param=per_param, busy=True)
    assert chosen(config())[:3] == idle[:3]
    for spike_at in range(1, 9):
        Machine(monkeypatch, per_param=per_param, spike_at=spike_at)
        assert chosen(config())[:3] == idle[:3], f"a spike at timed call {spike_at}"


def test_where_two_threads_win_idle_a_busy_core_makes_it_one_and_says_so(monkeypatch):
    Machine(monkeypatch, two_threads=0.6)
    threads, dtype, _, picked = chosen(config())
    assert (threads, dtype) == (2, "bfloat16") and not any(line.startswith("threads") for line in picked.lines)
    assert any(line.startswith("threads: 2 (2 threads stepped 1.67x") for line in picked.details)
    Machine(monkeypatch, two_threads=0.6, busy=True)
    threads, dtype, _, picked = chosen(config())
    assert (threads, dtype) == (1, "bfloat16")
    assert picked.lines[0].startswith("threads: 1 of 2 (a step on 2 took 2.40x as long as on 1 here")


def test_the_lines_say_the_choices_in_a_learners_words(monkeypatch):
    Machine(monkeypatch, per_param=6e-7)
    *_, picked = chosen(config())
    assert picked.lines == [
        "threads: 1 of 2 (a step on 2 took 0.95x as long as on 1 here: another program may be busy, or the model "
        "is too small to share its work)",
        "precision: bfloat16 (a training step ran 2.00x as fast in bfloat16 as in float32 here)",
        "model: 3 layers × 32 instead of 4 layers × 32: in the 60 s here the configured model would see 4.9 tokens "
        "per parameter, fewer than min_tokens_per_param=8 (--min_tokens_per_param=0 keeps it)"]
    assert picked.saved() == {"dtype": "bfloat16", "attention_path": "written", "kernels": picked.kernels,
                              "threads": 1, "fitted_from": {"n_layer": 4, "n_embd": 32}}


def test_a_resumed_run_takes_its_saved_choices_without_timing(monkeypatch):
    machine = Machine(monkeypatch)
    rt = Runtime(device="cpu", dtype="float32")
    saved = {"dtype": "bfloat16", "attention_path": "folded", "kernels": ["relu2"], "threads": 1}
    cfg = config(init_from="resume")
    _, model, picked = choose(cfg, rt, tiny_model(n_layer=4, n_head=2, n_embd=32), saved, None)
    assert machine.calls == 0 and picked.saved() == saved and rt.dtype == "bfloat16"
    _, _, asked = choose(config(init_from="resume", dtype="float32", attention_path="fused"), rt, model, saved, None)
    assert (asked.dtype, asked.attention_path) == ("float32", "fused")  # what the command line names wins


@pytest.mark.parametrize("timed_ratio", [0.5, 1.0, 3.0])
def test_a_smaller_model_never_sees_fewer_tokens_per_parameter_than_its_share_of_the_bigger(monkeypatch,
                                                                                          timed_ratio):
    """Where its step, timed in turns with the bigger one's, reads slower (another program came meanwhile), the
    floor holds: the bigger model's figure times their parameters' ratio."""
    bigger, smaller = tiny_model(n_layer=4, n_head=2, n_embd=32), tiny_model(n_layer=3, n_head=2, n_embd=32)
    monkeypatch.setattr(choices, "step_seconds", lambda big, batch, dtype, others: [1.0, 1.0 / timed_ratio])
    rt = Runtime(device="cpu", dtype="float32")
    seen = scaled_seen(config(min_tokens_per_param=100), rt, bigger, 5.0, smaller)
    share = bigger.num_params() / smaller.num_params()
    assert seen == pytest.approx(5.0 * share * max(1.0, timed_ratio))
    assert Choices("float32", "fused", []).saved() == {"dtype": "float32", "attention_path": "fused", "kernels": []}


def test_a_model_that_is_mostly_its_vocabulary_is_named_before_it_trains(monkeypatch):
    """GPT-2's 50,304 tokens with the character preset's small shape, on a CPU: the embeddings are most of the
    model, and the run says so before its first step."""
    Machine(monkeypatch, per_param=1e-8)
    rt = Runtime(device="cpu", dtype="float32")
    cfg = config(min_tokens_per_param=0, max_time=30)
    model = tiny_model(**(vars(cfg.model) | {"vocab_size": 50304, "tie_weights": False}))
    *_, picked = choose(cfg, rt, model, {}, None)
    embeddings = 2 * 50304 * 32
    assert picked.lines[-1] == (f"note: {embeddings / 1e6:.1f}M of its {model.num_params() / 1e6:.1f}M parameters "
                                f"are the embeddings of a 50,304-token vocabulary, slow to train on a CPU; the same "
                                "text prepared by characters, or by a BPE of 512 tokens trained on it, trains far "
                                "more steps")
    characters = tiny_model(**(vars(cfg.model) | {"vocab_size": 37}))
    assert not any(line.startswith("note:") for line in choose(cfg, rt, characters, {}, None)[2].lines)


# ---------------------------------------------------------------------------------------------- precision and path

@pytest.mark.parametrize("bf16_instructions,matmuls,bf16_step,want", [
    (True, 2.0, 0.5, "bfloat16"), (True, 2.0, 1 / 1.1, "float32"), (True, 4.0, 2.0, "float32"),
    (True, 0.5, 0.5, "float32"), (False, 2.0, 0.5, "float32")])
def test_training_precision_is_the_faster_step_not_the_flags(monkeypatch, bf16_instructions, matmuls, bf16_step,
                                                             want):
    """bfloat16 must win the model's own step clearly (by 1.15x); where bf16 matmuls are slower than fp32 no step is
    timed in it, and without bf16 instructions nothing is."""
    machine = Machine(monkeypatch, bf16=bf16_step)
    monkeypatch.setattr(choices, "cpu_has_bf16", lambda: bf16_instructions)
    monkeypatch.setattr(choices, "matmul_peak", lambda dtype, *args: matmuls if dtype == "bfloat16" else 1.0)
    threads, dtype, _, picked = chosen(config(min_tokens_per_param=0))
    assert dtype == want
    assert any(dtype == "bfloat16" for dtype in machine.dtypes) == (bf16_instructions and matmuls > 1)
    precision = [line for line in picked.lines if line.startswith("precision: ")]
    if not bf16_instructions:
        assert precision == []
    elif matmuls < 1:
        assert precision == ["precision: float32 (bfloat16 matmuls ran at 0.50x the float32 speed here)"]
    else:
        assert precision == [f"precision: {want} (a training step ran {1 / bf16_step:.2f}x as fast in bfloat16 as "
                             f"in float32 here{'' if want == 'bfloat16' else ', not enough to pay for it'})"]


def test_each_precision_is_timed_on_the_attention_path_it_would_train_on(monkeypatch):
    """SDPA's fused kernel can be far slower than the folded path on a CPU: a step timed on a path the run will not
    take misjudges the precision. Each precision's step runs on the path fastest in it (or on the configured one),
    and the run then takes the chosen precision's path without timing the paths again."""
    machine = Machine(monkeypatch)
    fastest = {"float32": "written", "bfloat16": "folded"}
    monkeypatch.setattr(choices, "attention_path_for", lambda model, batch, dtype, device, c=None: fastest[dtype])
    *_, picked = chosen(config(min_tokens_per_param=0))
    assert set(machine.paths["bfloat16"]) == {"folded"} and set(machine.paths["float32"]) <= {"written", None}
    assert (picked.dtype, picked.attention_path) == ("bfloat16", "folded")
    machine.paths.clear()
    *_, picked = chosen(config(min_tokens_per_param=0, attention_path="written"))
    assert set(machine.paths["bfloat16"]) == {"written"} and picked.attention_path == "written"


def test_timing_steps_takes_turns_on_each_precisions_path_and_leaves_no_trace():
    """The steps timed before training must leave no gradients, the model's own path, and the random generators
    unmoved, so that a run's data order and dropout masks do not depend on them."""
    model = tiny_model(config=train_config(dropout=0.1).model, vocab_size=20).train()  # dropout draws
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(
        ([attention_path_of(block.attn) for block in module.transformer.h], torch.is_autocast_enabled("cpu"))))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with choices.quiet(model):
        runs = {dtype: choices.training_step(model, 2, dtype, path)
                for dtype, path in (("float32", "written"), ("bfloat16", "folded"))}
        seconds = timing.fastest_in_turns(runs, 2)
    assert set(seconds) == {"float32", "bfloat16"} and min(seconds.values()) > 0
    assert calls == [(["written"] * 2, False), (["folded"] * 2, True)] * 3  # one untimed call each, then 2 turns
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())
    assert [attention_path_of(block.attn) for block in model.transformer.h] == ["fused"] * 2


@pytest.mark.parametrize("fastest", ["fused", "written", "folded"])
def test_the_attention_path_is_the_fastest_one_timed(monkeypatch, fastest):
    monkeypatch.setattr(choices, "fastest_in_turns", lambda runs, repeats: {
        path: (1.0 if path == fastest else 3.0) / 1e3 for path in runs})
    model = tiny_model(config=train_config().model, vocab_size=20)
    said = Choices("float32", "fused", [])
    assert choices.attention_path_for(model, 4, "float32", "cpu", said) == fastest
    assert said.details[0].startswith(f"attention: the {fastest} path (") and "3.0 ms" in said.details[0]
    assert choices.attention_path_for(model, 4, "float32", "cuda") == "fused"  # nothing timed on a GPU
    uniform = tiny_model(config=train_config(attention="uniform").model, vocab_size=20)
    assert choices.attention_path_for(uniform, 4, "float32", "cpu") == "fused"  # nothing to choose


# ---------------------------------------------------------------------------------------------- shape

def test_tokens_per_parameter_is_the_budget_at_the_timed_step_over_the_parameters(monkeypatch):
    model = tiny_model(config=train_config().model, vocab_size=20)
    timed = []
    monkeypatch.setattr(choices, "step_seconds", lambda *args: timed.append(args) or [0.5])
    rt = Runtime(device="cpu", dtype="float32")
    seen = choices.tokens_per_parameter(train_config(max_time=60), rt, model)
    assert timed == [(model, 4, "float32")] and seen == pytest.approx(60 * 4 * 16 / 0.5 / model.num_params())
    assert choices.tokens_per_parameter(train_config(max_time=60), rt, model, 0.25) == pytest.approx(2 * seen)
    assert len(timed) == 1  # a step timed already is not timed again


def fit(monkeypatch, cfg, seen):
    """choices.fitted on a tiny model that sees `seen` tokens per parameter as configured, where a smaller model's
    step times as long as the bigger one's (as slow as it can be): (cfg, model, choices, the layer counts of the
    smaller models whose steps were timed)."""
    timed = []
    monkeypatch.setattr(choices, "tokens_per_parameter", lambda cfg, rt, model, step=None: seen)
    monkeypatch.setattr(choices, "step_seconds", lambda bigger, batch, dtype, others: timed.append(
        others[0].config.n_layer) or [1.0, 1.0])
    meta = {"vocab_size": 20, "tokenizer": "char"}
    training.seed_everything(cfg.seed)
    model = training.build_model(replace(cfg, init_from="scratch"), meta)
    picked = Choices("float32", "written", [])
    rt = Runtime(device="cpu", dtype="float32")
    fitted_cfg, model = choices.fitted(cfg, rt, model, {}, picked, lambda c: training.fresh_model(c, rt, meta))
    return fitted_cfg, model, picked, timed


@pytest.mark.parametrize("seen", [5.9, 5.96, 6.0])
def test_a_model_too_big_for_its_budget_trains_as_the_smaller_shape(monkeypatch, seen):
    """Below min_tokens_per_param the run trains the smaller shape, from the weights a run configured with that
    shape starts from; at or above it, the model as configured. The line never rounds a figure up to the
    threshold."""
    cfg = train_config(max_time=60, min_tokens_per_param=6, smaller_n_layer=1)
    fitted_cfg, model, picked, _ = fit(monkeypatch, cfg, seen)
    if seen >= 6:
        assert fitted_cfg == cfg and model.config.n_layer == 2 and picked.fitted_from is None
        assert picked.lines == [f"model: 2 layers × 32, {model.num_params() / 1e6:.2f}M parameters (it sees 6.0 "
                                "tokens per parameter in the 60 s here)"]
        return
    assert model.config.n_layer == fitted_cfg.model.n_layer == 1 and picked.fitted_from == {"n_layer": 2, "n_embd": 32}
    assert picked.lines == ["model: 1 layer × 32 instead of 2 layers × 32: in the 60 s here the configured model "
                            "would see 5.9 tokens per parameter, fewer than min_tokens_per_param=6 "
                            "(--min_tokens_per_param=0 keeps it)"]
    training.seed_everything(cfg.seed)
    direct = training.build_model(train_config(n_layer=1), {"vocab_size": 20, "tokenizer": "char"}).state_dict()
    assert direct.keys() == model.state_dict().keys() and all(torch.equal(direct[k], v)
                                                              for k, v in model.state_dict().items())
    assert {attention_path_of(block.attn) for block in model.transformer.h} == {"written"}  # the run's path


@pytest.mark.parametrize("seen, trained", [(4.6, 3), (2.8, 2)])
def test_a_fallback_too_big_for_its_budget_loses_a_layer_at_a_time_down_to_two(monkeypatch, seen, trained):
    """Each smaller model sees at least its share of the bigger one's parameters: 4.6 x 50,080 / 37,728 = 6.1 for 3
    layers, over 6; 2.8 gives 3.7 for 3 layers and 5.5 for 2, the fewest it goes to. The line names each shape that
    fell short."""
    cfg = train_config(n_layer=4, max_time=60, min_tokens_per_param=6, smaller_n_layer=3)
    fitted_cfg, model, picked, _ = fit(monkeypatch, cfg, seen)
    assert model.config.n_layer == fitted_cfg.model.n_layer == trained
    fell_short = ", 3 layers 3.7" if trained == 2 else ""
    assert picked.lines == [f"model: {trained} layers × 32 instead of 4 layers × 32: in the 60 s here the configured "
                            f"model would see {seen} tokens per parameter{fell_short}, fewer than "
                            "min_tokens_per_param=6 (--min_tokens_per_param=0 keeps it)"]


@pytest.mark.parametrize("smaller_n_embd, timed_layers", [(0, []), (16, [3])])
def test_a_fallback_one_layer_short_is_timed_only_where_its_share_of_the_bigger_cannot_tell(
        monkeypatch, smaller_n_embd, timed_layers):
    """A fallback with fewer layers and nothing else changed runs a part of the bigger model's step: its parameters
    see at least the bigger one's figure times their parameters' ratio. Where that floor reaches the threshold it
    is not timed; a narrower fallback is."""
    cfg = train_config(n_layer=4, max_time=60, min_tokens_per_param=6, smaller_n_layer=3,
                       smaller_n_embd=smaller_n_embd)
    _, model, _, timed = fit(monkeypatch, cfg, 5.0)
    assert timed == timed_layers and model.config.n_layer == 3


def test_the_smaller_shape_is_fitted_only_where_a_budget_can_ask_for_it(monkeypatch):
    for unfitted in (dict(max_time=0), dict(min_tokens_per_param=0), dict(n_layer=1), dict(init_from="resume")):
        cfg = train_config(**dict(dict(max_time=60, min_tokens_per_param=6), **unfitted), smaller_n_layer=1)
        fitted_cfg, model, picked, _ = fit(monkeypatch, cfg, 0.0)  # far too few, if it were asked
        assert fitted_cfg == cfg and model.config.n_layer == cfg.model.n_layer and picked.fitted_from is None
