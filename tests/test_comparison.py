"""gptkit/run/comparison.py: what differs between two runs (settings, model.py, circumstances) and the one note
that says when more than the learner's edit differs. The runs here are made by hand; tests/test_plot.py trains
real ones and compares them through plot.py."""

import pytest

from gptkit.run.comparison import ComparedRun, besides_note, describe, differences

CODE = {"GPT.forward": "1111", "relu_squared": "2222", "SelfAttention.pattern": "3333"}


def made_run(name, steps=100, code=CODE, measured=None, global_batch=12, **settings):
    """A run as load_run reads one: on a CPU, in float32, on the fused path and 1 thread unless told."""
    chosen = {"learning_rate": 1e-3, "seed": 1337, "dtype": "auto", "threads": 0, "attention_path": "auto",
              "batch_size": 12, "block_size": 64, "max_iters": 100, "out_dir": name, **settings}
    return ComparedRun(name, [], chosen, code, {"dtype": "float32", "attention_path": "fused", "kernels": [],
                                                "threads": 1, **(measured or {})}, steps, global_batch)


BASE = made_run("out")
EDIT = "the comparison is not only your edit"
MIXED = "the comparison is not of one change"


@pytest.mark.parametrize("other, note", [
    (made_run("out-seed", seed=1), None),  # one circumstance alone is the edit
    (made_run("out-long", max_iters=200, steps=200), None),
    (made_run("out-wide", n_embd=256, learning_rate=3e-4), None),  # several settings, no circumstance
    (made_run("out-edit", code=dict(CODE, relu_squared="9999"), steps=80, measured={"dtype": "bfloat16"}),
     "note: besides model.py, out-edit differs from out in steps (100 → 80) and precision "
     f"(float32 → bfloat16): {EDIT}; out trained again with --dtype=bfloat16 holds it equal"),
    (made_run("out-lr", learning_rate=3e-3, measured={"threads": 2}),
     f"note: besides learning_rate, out-lr differs from out in threads (1 → 2): {EDIT}; out trained again with "
     "--threads=2 holds it equal"),
    (made_run("out-gpu", learning_rate=3e-3, measured={"threads": None}), None),  # not the run's: unknown
    (made_run("out-two", seed=1, global_batch=24, batch_size=24),
     "note: out-two differs from out in data order (seed 1337 → seed 1) and batch "
     f"(12 sequences a step → 24 sequences a step): {MIXED}"),
    (made_run("out-path", measured={"attention_path": "written"}, dtype="float32", steps=90),
     f"note: out-path differs from out in steps (100 → 90) and attention path (fused → written): {MIXED}; out "
     "trained again with --attention_path=written holds it equal"),
])
def test_the_note_names_what_differs_besides_the_edit_and_only_then(other, note):
    assert besides_note(BASE, other, differences(BASE, other)) == note


def test_additive_scores_against_scaled_ones_are_one_change(tmp_path):
    """The lab's lesson by hand: --attention=additive (Bahdanau's own nn.Linear layers in model.py) against the scaled
    head. The additive run records the 'fused' path it never takes (its scores are written out whatever the path),
    and the note said "besides model.py and attention, out-bahdanau differs from out in attention path (written →
    fused): the comparison is not only your edit". An attention with no path to choose has none to differ in."""
    base = made_run("out", measured={"attention_path": "written"}, attention="scaled")
    additive = made_run("out-bahdanau", code=dict(CODE, additive_scores="9999"), attention="additive")
    assert besides_note(base, additive, differences(base, additive)) is None
    assert len(describe(base, additive, differences(base, additive))) == 3  # no line of circumstances


def test_runs_whose_steps_max_time_planned_are_told_how_to_train_equal_steps():
    """An edit that steps faster trains more steps in the same max_time: the note says how to hold steps equal."""
    planned = {"planned": {"steps": 100, "idle_seconds": 150.0}}
    base = made_run("out", measured=planned)
    edited = made_run("out-gelu", code=dict(CODE, relu_squared="9999"), steps=120,
                      measured={"planned": {"steps": 120, "idle_seconds": 150.0}})
    assert besides_note(base, edited, differences(base, edited)) == (
        f"note: besides model.py, out-gelu differs from out in steps (100 → 120): {EDIT}; each trained the steps "
        "max_time plans at its own model's speed here (equal time): --max_iters=100 gives out-gelu out's steps")
    longer = made_run("out-gelu", code=dict(CODE, relu_squared="9999"), steps=240, max_time=300,
                      measured={"planned": {"steps": 240, "idle_seconds": 300.0}})
    assert besides_note(base, longer, differences(base, longer)).endswith(EDIT)  # not equal time: no such words


def test_the_settings_that_differ_are_listed_from_the_base_to_the_run():
    other = made_run("out-gelu", activation="gelu", learning_rate=3e-3, dtype="float32")
    base = made_run("out", activation="relu2")
    assert describe(base, other, differences(base, other)) == [
        "out-gelu against out:",
        "  settings: activation relu2 → gelu, dtype auto → float32, learning_rate 0.001 → 0.003",
        "  model.py: the same code"]


def test_where_runs_write_and_settings_another_version_lacks_are_not_differences():
    """out_dir always differs; a key only one run records has no known value in the other."""
    other = made_run("elsewhere", wandb_run_name="mine", wall_clock=True)
    diff = differences(BASE, other)
    assert (diff.settings, diff.circumstances, diff.code_changed()) == ([], [], False)
    assert describe(BASE, other, diff)[1] == "  settings: the same"


@pytest.mark.parametrize("newer, differs", [(True, [("token_shift", False, True)]), (False, [])])
def test_a_model_setting_an_older_run_lacks_compares_as_its_default(tmp_path, newer, differs):
    """A run saved before a model option existed was built at its default, as model_config loads it: a newer run
    that set it differs there, one at the default does not."""
    import json
    from dataclasses import asdict

    from gptkit.run.checkpoint import save_checkpoint
    from gptkit.run.comparison import load_runs
    from model import GPTConfig

    built = asdict(GPTConfig())
    for name, model_args in (("old", {k: v for k, v in built.items() if k != "token_shift"}),
                             ("new", dict(built, token_shift=newer))):
        (tmp_path / name).mkdir()
        save_checkpoint({"model_args": model_args, "config": {"learning_rate": 1e-3}, "iter_num": 10},
                        tmp_path / name / "latest.pt")
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"kind": "train", "iter": 10, "loss": 2.0}) + "\n")
    old, new = load_runs([tmp_path / "old", tmp_path / "new"])
    assert differences(old, new).settings == differs


def test_the_model_py_line_names_each_piece_changed_added_and_removed():
    edited = {"GPT.forward": "5555", "SelfAttention.pattern": "3333", "swiglu": "6666"}
    other = made_run("out-swiglu", code=edited)
    assert describe(BASE, other, differences(BASE, other))[2] == \
        "  model.py: GPT.forward changed; swiglu added; relu_squared removed"
    old = made_run("out-old", code=None)
    assert describe(BASE, old, differences(BASE, old))[2] == \
        "  model.py: not compared (out-old's checkpoint, from an earlier version, does not record it)"
    assert besides_note(BASE, old, differences(BASE, old)) is None


def test_an_edited_table_of_choices_in_model_py_is_a_change_and_an_earlier_record_compares_its_functions():
    """SCORES or ACTIVATIONS edited (silu in gelu's place) changes what a run computes as an edited function does:
    the line names it. A run of an earlier version recorded its functions alone, so those are what compare."""
    from gptkit.machine.stand_ins import model_code, module_values
    code = model_code()
    assert {"SCORES", "ACTIVATIONS"} <= code.keys() and code["ACTIVATIONS"] == module_values()["ACTIVATIONS"]
    now, edited = made_run("out", code=code), made_run("out-silu", code=dict(code, ACTIVATIONS="0" * 16))
    assert describe(now, edited, differences(now, edited))[2] == "  model.py: ACTIVATIONS changed"
    earlier = made_run("out-old", code={k: v for k, v in code.items() if k not in module_values()})
    assert describe(earlier, now, differences(earlier, now))[2] == "  model.py: the same code"


def test_the_circumstances_line_shows_each_one_that_differs():
    other = made_run("out-bf16", steps=1204, measured={"dtype": "bfloat16"})
    assert describe(BASE, other, differences(BASE, other))[3] == \
        "  the runs: steps 100 → 1,204, precision float32 → bfloat16"


def test_tokens_a_step_are_the_global_batch_of_sequences_times_their_length():
    assert made_run("out", global_batch=24, block_size=32).tokens_per_step == 768


def test_an_option_of_the_learner_s_that_only_one_run_has_is_named_with_its_value():
    """An option added to model.py's GPTConfig, trained, then taken out again: the compare dropped it, as it drops
    another version's training setting, and said only that model.py changed."""
    base = made_run("out-base")
    wide = made_run("out-wide", code=dict(CODE, relu_squared="9999"), mlp_width="8x")
    wide.options = frozenset({"mlp_width"})
    diff = differences(base, wide)
    assert describe(base, wide, diff)[1] == "  settings: mlp_width (none) → 8x"
    assert describe(wide, base, differences(wide, base))[1] == "  settings: mlp_width 8x → (none)"
    newer = made_run("out-new", some_training_setting=3)  # another version's training setting: not compared
    assert differences(base, newer).settings == []
