"""gptkit/machine/choices.py: the start-up choices (precision, attention path, shape) from this machine's wisdom,
measured once and then read, so that a busy moment changes nothing; a preset's shapes fitted, a learner's shape
kept; and what the run says."""

import json
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_model, train_config
from gptkit.base.errors import UserError
from gptkit.machine import choices, stand_ins
from gptkit.machine import idle as idle_check
from gptkit.machine.choices import Choices, choose
from gptkit.machine.runtime import Runtime
from gptkit.machine.wisdom import FILE_NAME
from model import GPT

PRESET = dict(n_layer=4, n_head=2, n_embd=32, max_time=60, min_tokens_per_param=8, fit_shapes="4x32, 3x32, 2x32",
              device="cpu")


class Machine:
    """A simulated CPU: a step costs `per_param` seconds a parameter, bf16 `bf16` of fp32's; `measured` counts the
    shapes timed (each a list of the precisions timed)."""

    def __init__(self, monkeypatch, per_param=2e-7, bf16=0.5, bf16_instructions=True):
        self.per_param, self.bf16, self.measured = per_param, bf16, []
        monkeypatch.setattr(choices, "cpu_has_bf16", lambda: bf16_instructions)
        monkeypatch.setattr(choices, "measure", self.measure)

    def measure(self, planned, cfg, rt, kernels_, precisions, deadline):
        self.measured.append((planned.n_layer, list(precisions)))
        n = parameters(planned)
        return {"params": n, **{d: {"path": "written", "step": n * self.per_param * (self.bf16 if d == "bfloat16" else
                                                                                     1.0)} for d in precisions}}


def parameters(planned):
    return tiny_model(config=planned).num_params()


def preset(**values):
    return train_config(**{**PRESET, **values})


def chosen(cfg, asked=(), saved=None, vocab=37):
    rt = Runtime(device="cpu", dtype="float32")
    cfg, _, picked = choose(cfg, rt, replace(cfg.model, vocab_size=vocab), saved, set(asked), time.time())
    return cfg, picked


@pytest.fixture(autouse=True)
def own_wisdom(tmp_path, monkeypatch):
    """Each test measures into a wisdom cache of its own."""
    monkeypatch.setenv("GPTKIT_WISDOM_DIR", str(tmp_path / "wisdom"))
    return tmp_path / "wisdom" / FILE_NAME


def test_a_machine_is_measured_once_then_read_and_a_busy_moment_changes_nothing(monkeypatch, capsys):
    """The first run measures both precisions and says so; every later run reads the same choices without timing,
    however slow the machine is at that moment, and says where they came from."""
    machine = Machine(monkeypatch)
    cfg, first = chosen(preset(min_tokens_per_param=0))
    assert machine.measured == [(4, ["float32", "bfloat16"])]
    assert "measuring this machine once for this model (float32, bfloat16)" in capsys.readouterr().out
    assert first.lines[0] == ("precision: bfloat16 (measured now on this CPU: a step in bfloat16 ran 2.00x as fast "
                              "as in float32)")
    busy = Machine(monkeypatch, per_param=1e-5, bf16=3.0)  # were it timed now, everything would differ
    for _ in range(3):
        again_cfg, again = chosen(preset(min_tokens_per_param=0))
        assert (again_cfg, again.dtype, again.attention_path) == (cfg, first.dtype, first.attention_path)
    assert busy.measured == [] and "measuring" not in capsys.readouterr().out
    assert again.lines[0].startswith(f"precision: bfloat16 (measured on this CPU on {time.strftime('%Y-%m-%d')}: ")


@pytest.mark.parametrize("bf16_instructions,bf16_step,want", [
    (True, 0.5, "bfloat16"), (True, 1 / 1.1, "float32"), (False, 0.5, "float32")])
def test_training_precision_is_the_faster_step_not_the_flags(monkeypatch, bf16_instructions, bf16_step, want):
    """bfloat16 must win the model's own step clearly (by 1.15x); without bf16 instructions it is never timed."""
    machine = Machine(monkeypatch, bf16=bf16_step, bf16_instructions=bf16_instructions)
    _, picked = chosen(preset(min_tokens_per_param=0))
    assert picked.dtype == want
    assert machine.measured[0][1] == (["float32", "bfloat16"] if bf16_instructions else ["float32"])
    precision = [line for line in picked.lines if line.startswith("precision: ")]
    if bf16_instructions:
        enough = "" if want == "bfloat16" else ", not enough to pay for it"
        assert precision == [f"precision: {want} (measured now on this CPU: a step in bfloat16 ran "
                             f"{1 / bf16_step:.2f}x as fast as in float32{enough})"]
    else:
        assert precision == []


def test_retime_measures_again_and_refuses_where_nothing_is_left_to_measure(monkeypatch):
    machine = Machine(monkeypatch)
    chosen(preset())
    chosen(preset(retime=True))
    assert len(machine.measured) >= 2 and machine.measured[-1][1] == ["float32", "bfloat16"]
    with pytest.raises(ValueError, match="retime=True measures the choices left to auto again, but dtype and "
                                         "attention_path are both set"):
        preset(min_tokens_per_param=0, retime=True, dtype="float32", attention_path="fused")


@pytest.mark.parametrize("damage, note", [
    ("{not json", "is damaged"), ('{"format": 99, "machines": {}}', "is damaged (format 99, not 1)"),
    ("[1, 2]", "is damaged (it is not the JSON object of machines this tool writes)"),
    (None, "was measured with torch 0.1, not")])
def test_a_damaged_or_foreign_wisdom_cache_is_measured_afresh_with_one_note(monkeypatch, own_wisdom, damage, note):
    machine = Machine(monkeypatch)
    chosen(preset(min_tokens_per_param=0))
    if damage is None:  # the same machine's entry, written by another torch
        data = json.loads(own_wisdom.read_text())
        for mine in data["machines"].values():
            mine["torch"] = "0.1"
        own_wisdom.write_text(json.dumps(data))
    else:
        own_wisdom.write_text(damage)
    _, picked = chosen(preset(min_tokens_per_param=0))
    assert len(machine.measured) == 2
    notes = [line for line in picked.lines if line.startswith("note: ")]
    assert len(notes) == 1 and note in notes[0] and notes[0].endswith("measuring afresh")
    _, picked = chosen(preset(min_tokens_per_param=0))  # rewritten whole: read again
    assert len(machine.measured) == 2 and not any(line.startswith("note: ") for line in picked.lines)


@pytest.mark.parametrize("damage", [
    {"float32": {"path": "written", "step": -0.7}}, {"float32": {"path": "written", "step": "0.3"}},
    {"float32": {"path": "written", "step": True}}, {"float32": {"path": "written", "step": 0}},
    {"float32": {"path": "sideways", "step": 0.1}}, {"float32": {"path": "written", "step": 0.1, "threads": 0.5}},
    {"float32": ["written", 0.1]}, {"measured": None}, {"params": -3}, {"busy": "1.2"}, {"busy": -1},
    {"float32": {"path": "written", "step": 0.1, "threads": 64}}])
def test_a_damaged_wisdom_entry_is_measured_afresh_with_one_note_never_used(monkeypatch, own_wisdom, damage):
    """A hand-edited entry (a wrong type, a missing key, a step time that is no positive number) is named and
    measured again, never used and never a traceback."""
    machine = Machine(monkeypatch, bf16_instructions=False)
    chosen(preset(min_tokens_per_param=0))
    data = json.loads(own_wisdom.read_text())
    for mine in data["machines"].values():
        for entry in mine["shapes"].values():
            for key, value in damage.items():
                if value is None:
                    del entry[key]
                else:
                    entry[key] = value
    own_wisdom.write_text(json.dumps(data))
    _, picked = chosen(preset(min_tokens_per_param=0))
    notes = [line for line in picked.lines if line.startswith("note: ")]
    assert len(machine.measured) == 2 and len(notes) == 1 and "entry in the wisdom cache" in notes[0]
    assert picked.step_seconds > 0 and notes[0].endswith("measuring afresh")


def test_a_wisdom_cache_nested_too_deep_to_read_is_damaged(monkeypatch, own_wisdom):
    Machine(monkeypatch)
    own_wisdom.parent.mkdir(parents=True)
    own_wisdom.write_text("[" * 100_000 + "]" * 100_000)
    _, picked = chosen(preset(min_tokens_per_param=0))
    assert any("is damaged" in line and line.endswith("measuring afresh") for line in picked.lines)


def busy(monkeypatch, others):
    """Every IdleCheck sees other programs holding `others` cores (0: idle)."""
    monkeypatch.setattr(choices.IdleCheck, "__exit__", lambda self, *exc: setattr(self, "others", others))
    monkeypatch.setenv("GPTKIT_ASSUME_IDLE", "0")


def test_a_measurement_taken_beside_a_busy_program_is_read_while_busy_and_measured_again_idle(monkeypatch,
                                                                                             own_wisdom):
    """Beside another program the run keeps what it measured, marked busy, and says so; runs that start while the
    machine is busy read it (the same choices, nothing timed); the first idle start measures again and keeps
    that; later starts, busy or idle, read it."""
    monkeypatch.setattr(idle_check, "LOOK_S", 0.0)
    machine = Machine(monkeypatch)
    busy(monkeypatch, 1.2)
    _, first = chosen(preset(min_tokens_per_param=0))
    assert len(machine.measured) == 1 and "busy" in own_wisdom.read_text()
    assert "note: other programs held about 1.2 of this machine's cores while it measured: runs that start while " \
           "the machine is busy read this measurement" in "\n".join(first.lines)
    machine = Machine(monkeypatch, per_param=1e-5, bf16=3.0)  # were it timed now, everything would differ
    _, again = chosen(preset(min_tokens_per_param=0))
    assert machine.measured == [] and (again.dtype, again.attention_path) == (first.dtype, first.attention_path)
    assert any(line.startswith("note: this model's choices were measured on ") and "read again, as the machine is "
               "busy now" in line for line in again.lines)
    busy(monkeypatch, 0.0)
    _, idle = chosen(preset(min_tokens_per_param=0))
    assert len(machine.measured) == 1 and "busy" not in own_wisdom.read_text()
    assert any("measured again now, idle, and kept" in line for line in idle.lines)
    for others in (1.2, 0.0):
        busy(monkeypatch, others)
        _, later = chosen(preset(min_tokens_per_param=0))
        assert len(machine.measured) == 1 and (later.dtype, later.attention_path) == (idle.dtype, idle.attention_path)
        assert not any(line.startswith("note: ") for line in later.lines)


def test_an_edited_model_is_a_shape_of_its_own(monkeypatch):
    """Its speed is its own: an edit to model.py is measured, not read from the unedited model's entry."""
    from gptkit.machine import wisdom
    cfg = train_config()
    key = wisdom.shape_key(cfg.model, 4, [], False)
    monkeypatch.setattr(wisdom, "model_code", lambda: {"SelfAttention.forward": "edited"})
    assert wisdom.shape_key(cfg.model, 4, [], False) != key


def test_measuring_past_its_share_of_the_budget_says_by_how_much(monkeypatch):
    machine = Machine(monkeypatch)
    slow = machine.measure

    def measure(*args):
        choices.time.sleep(0.7)
        return slow(*args)
    monkeypatch.setattr(choices, "measure", measure)
    _, picked = chosen(preset(min_tokens_per_param=0, max_time=5))  # 0.2 s allowed
    over = [line for line in picked.lines if line.startswith("note: measuring took ")]
    assert len(over) == 1 and "s more than the 0.2 s (4% of max_time) start-up may spend on it" in over[0]


def test_a_resumed_run_takes_its_saved_choices_without_timing(monkeypatch):
    machine = Machine(monkeypatch)
    saved = {"dtype": "bfloat16", "attention_path": "folded", "kernels": ["relu2"]}
    _, picked = chosen(preset(init_from="resume"), saved=saved)
    assert machine.measured == [] and picked.saved() == saved
    _, asked = chosen(preset(init_from="resume", dtype="float32", attention_path="fused"),
                      saved=saved)
    assert (asked.dtype, asked.attention_path) == ("float32", "fused")  # what the command line names wins
    _, retimed = chosen(preset(init_from="resume", retime=True), asked={"retime"}, saved=saved)
    assert machine.measured == [] and retimed.lines[-1].startswith("note: --retime measures a new run's choices; a "
                                                                   "resumed run continues with those it saved")


def test_a_run_saved_on_a_cpu_continues_on_a_gpu_without_the_cpus_dropout_table():
    """TableDropout's mask table lives on the CPU: a GPU run that took it from the checkpoint failed at its first
    step (a CPU mask times a CUDA activation)."""
    saved = {"dtype": "float32", "attention_path": "fused", "kernels": stand_ins.by_rule("cpu")}
    gpu = SimpleNamespace(device="cuda", distributed=False)
    picked = choices.resumed_choices(preset(init_from="resume"), gpu, saved, "float32")
    assert "table_dropout" in saved["kernels"] and picked.kernels == stand_ins.by_rule("cuda")
    cpu = SimpleNamespace(device="cpu", distributed=False)
    assert choices.resumed_choices(preset(init_from="resume"), cpu, saved, "float32").kernels == saved["kernels"]



# ---------------------------------------------------------------------------------------------- shape

@pytest.mark.parametrize("per_param, trained", [(1e-7, 4), (2.5e-7, 3), (1e-6, 2)])
def test_a_preset_trains_the_largest_of_its_shapes_that_sees_enough_tokens(monkeypatch, per_param, trained):
    """tokens per parameter = max_time x batch x block / step / parameters; the preset's shapes are tried in turn,
    and the last one trains where none sees enough."""
    Machine(monkeypatch, per_param=per_param, bf16=1.0)
    cfg, picked = chosen(preset())
    assert cfg.model.n_layer == trained
    if trained == 4:
        assert picked.fitted_from is None
        return
    assert picked.fitted_from == {"n_layer": 4, "n_embd": 32}
    fitted = [line for line in picked.lines if "fit_shapes" in line]
    which = "the largest of this preset's fit_shapes" if trained == 3 else \
        "none of this preset's fit_shapes sees enough here, so the smallest of them"  # 2: none sees enough
    assert len(fitted) == 1 and fitted[0].startswith(
        f"model: {trained} layers × 32, {choices_params(cfg) / 1e6:.2f}M parameters: {which} (4x32, 3x32, 2x32); "
        "min_tokens_per_param=8 tokens per parameter in the 60 s here, and this one sees about ")
    assert "(4 layers × 32 would see " in fitted[0] and fitted[0].endswith("; --n_layer=4 --n_embd=32 trains that)")


def choices_params(cfg):
    return parameters(replace(cfg.model, vocab_size=37))


def test_tokens_per_parameter_is_the_budget_at_the_step_over_the_parameters():
    cfg, rt = train_config(max_time=60), Runtime(device="cpu", dtype="float32")
    planned = replace(cfg.model, vocab_size=37)
    n = tiny_model(config=planned).num_params()
    entry = {"params": n, "float32": {"step": 0.5}}
    assert choices.tokens_per_parameter(cfg, rt, planned, entry, "float32") == pytest.approx(60 * 4 * 16 / 0.5 / n)


@pytest.mark.parametrize("given", [dict(n_layer=6), dict(n_embd=48)])
def test_a_shape_the_learner_sets_is_what_trains_with_a_note_where_it_sees_too_few_tokens(monkeypatch, given):
    """On the command line (given and asked), or in the file (another shape than the preset's first): kept, and a
    note gives the tokens per parameter it will see."""
    Machine(monkeypatch, per_param=2e-6, bf16=1.0)  # every shape of the preset would be fitted down
    for asked in (given, {}):
        cfg, picked = chosen(preset(**given), asked=asked)
        assert (cfg.model.n_layer, cfg.model.n_embd) == (given.get("n_layer", 4), given.get("n_embd", 32))
        assert picked.fitted_from is None
        assert any(line.startswith("note: in the 60 s here this model sees about ") and
                   "fewer than min_tokens_per_param=8: it trains as asked" in line for line in picked.lines)
    cfg, _ = chosen(preset(n_layer=4), asked={"n_layer": 4})  # the preset's own shape, asked
    assert cfg.model.n_layer == 4


def test_fit_shapes_must_list_the_presets_shape_then_smaller_ones():
    assert train_config(fit_shapes="4x128, 3X128,2x96").fit_shape_list() == [(4, 128), (3, 128), (2, 96)]
    for bad, why in [("4x128, 4x128", "then smaller ones"), ("four", "as LAYERSxWIDTH"),
                     ("2x32, 1x31", "makes no model")]:
        with pytest.raises(ValueError, match=why):
            train_config(fit_shapes=bad)
    assert train_config(fit_shapes="4x128, 3x31").fit_shape_list()  # not this run's shape: not its to build


def test_a_model_that_is_mostly_its_vocabulary_is_named_before_it_trains(monkeypatch):
    """GPT-2's 50,304 tokens with a small shape, on a CPU: the embeddings are most of the model, and the run says
    so before its first step."""
    Machine(monkeypatch, per_param=1e-8)
    cfg = preset(min_tokens_per_param=0, tie_weights=False)
    _, picked = chosen(cfg, vocab=50304)
    n = parameters(replace(cfg.model, vocab_size=50304))
    assert picked.lines[-1] == (f"note: {2 * 50304 * 32 / 1e6:.1f}M of its {n / 1e6:.1f}M parameters are the "
                                "embeddings of a 50,304-token vocabulary, slow to train on a CPU; the same text "
                                "prepared by characters, or by a BPE of 512 tokens trained on it, trains far more "
                                "steps")
    assert not any(line.startswith("note:") for line in chosen(cfg)[1].lines)


# ---------------------------------------------------------------------------------------------- measuring

def test_measuring_times_each_precision_on_its_fastest_path_and_leaves_no_trace():
    """The real measurement on a tiny model: every precision gets a path and a step time, and the random
    generators are where they were, so that a run's weights and data order do not depend on it."""
    cfg = preset(dropout=0.1)
    rt = Runtime(device="cpu", dtype="float32")
    torch.manual_seed(3)
    before = torch.get_rng_state()
    speeds = choices.measure(replace(cfg.model, vocab_size=37), cfg, rt, stand_ins.by_rule("cpu"),
                             ["float32", "bfloat16"], time.perf_counter() + 5)
    assert torch.equal(torch.get_rng_state(), before)
    assert set(speeds) == {"params", "float32", "bfloat16"}
    assert speeds["params"] == tiny_model(config=replace(cfg.model, vocab_size=37)).num_params()
    assert all(speeds[d]["path"] in ("written", "folded") and speeds[d]["step"] > 0 for d in ("float32", "bfloat16"))


def test_a_forward_edited_to_return_the_loss_alone_is_one_line_before_it_is_timed(monkeypatch):
    """The measuring is the first work a run on a new machine (or of a newly edited model.py) does with the
    learner's forward: it checks what the forward returns (gptkit/machine/model_contract.py) first."""
    cfg = preset()
    forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, targets=None: forward(self, idx, targets)[1])
    with pytest.raises(UserError, match=r"^model.py's GPT.forward\(idx, targets\) returned Tensor: the tools read "):
        choices.measure(replace(cfg.model, vocab_size=37), cfg, Runtime(device="cpu", dtype="float32"), [],
                        ["float32"], time.perf_counter() + 5)


@pytest.mark.parametrize("fastest", ["fused", "written", "folded"])
def test_the_attention_path_is_the_fastest_one_timed(monkeypatch, fastest):
    monkeypatch.setattr(choices, "fastest_in_turns", lambda runs, repeats, deadline=None: {
        path: (1.0 if path == fastest else 3.0) / 1e3 for path in runs})
    model = tiny_model(config=train_config().model, vocab_size=20)
    assert choices.attention_path_for(model, 4, "float32", "cpu") == fastest
    assert choices.attention_path_for(model, 4, "float32", "cuda") == "fused"  # nothing timed on a GPU
    uniform = tiny_model(config=train_config(attention="uniform").model, vocab_size=20)
    assert choices.attention_path_for(uniform, 4, "float32", "cpu") == "fused"  # nothing to choose


class Heads(torch.nn.Module):
    """The notes' multi-head attention, a learner's own module in Block's place: one Head's key, query and value
    layers per head, its output the heads' concatenated."""

    def __init__(self, config):
        super().__init__()
        size = config.n_embd // config.n_head
        self.heads = torch.nn.ModuleList(torch.nn.Linear(config.n_embd, 3 * size, bias=False)
                                         for _ in range(config.n_head))
        self.register_buffer("tril", torch.tril(torch.ones(config.block_size, config.block_size)))

    def forward(self, x, rotary=None, cache=None, layer=0):
        T, out = x.size(1), []
        for head in self.heads:
            q, k, v = head(x).chunk(3, dim=-1)
            wei = (q @ k.transpose(-2, -1) * k.size(-1) ** -0.5).masked_fill(self.tril[:T, :T] == 0, float("-inf"))
            out.append(torch.softmax(wei, dim=-1) @ v)
        return torch.cat(out, dim=-1)


def with_heads_of_its_own(monkeypatch):
    """model.py's Block with the learner's Heads for its attention."""
    import model as model_py

    init = model_py.Block.__init__

    def own(self, config):
        init(self, config)
        self.attn = Heads(config)
    monkeypatch.setattr(model_py.Block, "__init__", own)


def test_an_attention_module_of_the_learners_own_is_measured_with_no_path_to_choose(monkeypatch):
    """Block.attn a MultiHeadAttention of the learner's own, as the notes write it: measuring the attention paths
    read SelfAttention's attn_dropout, and training stopped in a traceback ('MultiHeadAttention' object has no
    attribute 'attn_dropout'). No path stands in for their module: nothing is timed."""
    with_heads_of_its_own(monkeypatch)
    timed = []
    monkeypatch.setattr(choices, "fastest_in_turns", lambda runs, repeats, deadline=None: timed.append(runs) or {})
    model = tiny_model(config=train_config().model, vocab_size=20)
    assert isinstance(model.transformer.h[0].attn, Heads)
    assert choices.attention_path_for(model, 4, "float32", "cpu") == "fused" and timed == []


def with_note_003s_attention(monkeypatch):
    """model.py's SelfAttention written over as note 003 writes it: its own __init__ and forward, and none of the
    methods the tools' attention paths call by name."""
    import model as model_py

    def init(self, config):
        torch.nn.Module.__init__(self)
        self.heads = Heads(config)

    for name in ("sdpa", "written", "pattern", "visible"):
        monkeypatch.delattr(model_py.SelfAttention, name)
    monkeypatch.setattr(model_py.SelfAttention, "__init__", init)
    monkeypatch.setattr(model_py.SelfAttention, "forward", lambda self, x, *args: self.heads(x))


def test_note_003s_attention_in_selfattentions_place_is_measured_and_said_to_run_as_written(monkeypatch):
    """Note 003's class pasted over SelfAttention (its own attn_drop, mask and forward): measuring read
    SelfAttention's attn_dropout and stopped training in a traceback ('SelfAttention' object has no attribute
    'attn_dropout'). No path is timed for it, and the line naming the fused SDPA kernel goes; the one saying it runs
    as its __init__ sets it up stays."""
    with_note_003s_attention(monkeypatch)
    timed = []
    monkeypatch.setattr(choices, "fastest_in_turns", lambda runs, repeats, deadline=None: timed.append(runs) or {})
    model = tiny_model(config=train_config().model, vocab_size=20)
    assert choices.attention_path_for(model, 4, "float32", "cpu") == "fused" and timed == []
    chosen = Choices("float32", "fused", [], lines=["precision: float32", "attention: the fused path (measured)"])
    choices.on_speed_path(model, chosen)
    assert chosen.lines == ["precision: float32", "attention: model.py's SelfAttention has no sdpa or written or "
                            "pattern or visible, which the tools' attention paths call by name: it runs as its "
                            "__init__ sets it up"]


def test_an_edited_attention_is_timed_on_the_written_path_alone(monkeypatch):
    """Where the learner edited the written-out attention, no other path would run their code: none is timed."""
    import model as model_py
    monkeypatch.setattr(model_py, "SCORES", dict(model_py.SCORES, scaled=lambda attn, q, k: q @ k.transpose(-2, -1)))
    timed = []
    monkeypatch.setattr(choices, "fastest_in_turns", lambda runs, repeats, deadline=None: timed.append(runs) or {})
    edited = tiny_model(config=train_config().model, vocab_size=20)
    assert choices.attention_path_for(edited, 4, "float32", "cpu") == "written" and timed == []


def test_a_path_asked_for_that_an_edit_overrules_is_said_once(monkeypatch):
    """--attention_path=folded on an edited score function: the written path runs, and only its line is said
    (the line naming the folded path 'as asked' went out before it contradicted it)."""
    import model as model_py
    monkeypatch.setattr(model_py, "SCORES", dict(model_py.SCORES, scaled=lambda attn, q, k: q @ k.transpose(-2, -1)))
    chosen = Choices("float32", "folded", [], lines=["precision: float32", "attention: the folded path (as asked)"])
    choices.on_speed_path(tiny_model(config=train_config().model, vocab_size=20), chosen)
    assert chosen.attention_path == "written" and chosen.lines[0] == "precision: float32"
    assert [line.split(":")[0] for line in chosen.lines] == ["precision", "attention"]
    assert chosen.lines[1].startswith("attention: the written path instead of folded")


def test_an_attention_module_of_the_learners_own_is_said_to_run_as_written(monkeypatch):
    """The notes' MultiHeadAttention in Block's place: the run said "attention: the fused path (torch's fused SDPA
    kernel, the attention weights never written out; ...)", of a model whose attention is the learner's own loop over
    Heads. Now that line goes, and one says their module runs."""
    with_heads_of_its_own(monkeypatch)
    chosen = Choices("float32", "fused", [], lines=["precision: float32", "attention: the fused path (measured)"])
    choices.on_speed_path(tiny_model(config=train_config().model, vocab_size=20), chosen)
    assert chosen.lines == ["precision: float32", "attention: model.py's own Heads runs as written (the tools' "
                                                  "attention paths stand in for SelfAttention alone)"]


def test_choices_saved_name_what_a_resume_needs():
    assert Choices("float32", "fused", []).saved() == {"dtype": "float32", "attention_path": "fused", "kernels": []}
    fitted = Choices("bfloat16", "folded", ["relu2"], threads=2, fitted_from={"n_layer": 4})
    assert fitted.saved() == {"dtype": "bfloat16", "attention_path": "folded", "kernels": ["relu2"], "threads": 2,
                              "fitted_from": {"n_layer": 4}}
