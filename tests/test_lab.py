"""lab.py: every rung of the attention lab trains a few steps on a tiny corpus and leaves its row, its
attention picture and its sample; the entropy column is the one the README explains; mistakes are one line;
a later run keeps the rows of earlier ones, a rung folder in use is left alone, and a stopped lab stops its
train.py."""

import io
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import lab
import plot
import sample
import train
from conftest import POLL_S, REPO, Run, assert_one_error_line, random_tokens, run_script, tiny_model
from gptkit.base.errors import UserError
from gptkit.base.settings import parse_config
from gptkit.lab import ladder as machinery
from gptkit.run.run_folder import RunDir
from gptkit.training.train_config import TrainConfig
from test_plot import assert_png

# the lab's recipe at a size that trains a few steps in a fraction of a second on one core
TINY = dict(block_size=16, batch_size=4, n_layer=1, n_embd=16, warmup_iters=2, eval_interval=2, eval_iters=1,
            log_interval=2)
TINY_RECIPE = tuple(f"--{k}={v}" for k, v in
                    dict(dict(a[2:].split("=", 1) for a in machinery.RECIPE), **TINY).items())
# the modern rung's preset at that size too: a config file of its own kind (rotary positions, QK-norm, Muon)
TINY_PRESET = """n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
batch_size = 4
pos_emb = 'rope'
qk_norm = True
optimizer = 'muon'
eval_interval = 2
eval_iters = 1
"""
PROMPT = "First Citizen:"  # in the tiny corpus's vocabulary, and shorter than its block_size


REAL_RUN_TRAIN = machinery.run_train


def train_in_process(args, log, stops):
    """train.py's main in this process: the same run a subprocess makes, without its second of imports. The
    bigram rung still runs as lab.py runs every rung, in a train.py process of its own."""
    if Path(log.name).parent.name == "bigram":
        return REAL_RUN_TRAIN(args, log, stops)
    with redirect_stdout(log):
        train.main(args)
    return 0


def lab_args(data_dir, out_dir, *extra):
    return [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out_dir}", f"--prompt={PROMPT}",
            "--sample_tokens=20", "--device=cpu", *extra]


def tiny_lab(data_dir, out, *extra, preset=None):
    """lab.py's main at the tiny recipe (and the preset file given), rungs trained as train_in_process does:
    what it printed."""
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(printed):
        mp.setattr(machinery, "RECIPE", TINY_RECIPE)
        if preset:
            mp.setattr(machinery, "PRESET", preset)
        mp.setattr(machinery, "run_train", train_in_process)
        lab.main(lab_args(data_dir, out, *extra))
    return printed.getvalue()


@pytest.fixture(scope="module")
def ladder(data_dir, workdir):
    """Every rung, trained for a fraction of a second each: (out_dir, what lab.py printed)."""
    preset = workdir / "preset.py"
    preset.write_text(TINY_PRESET, encoding="utf-8")
    return workdir / "lab", tiny_lab(data_dir, workdir / "lab", "--budget=4.3", preset=preset)


def table_rows(out, which=0):
    """{rung label: its cells} from out/table.md's first table (or with which=1, the strongest heads')."""
    tables = (out / "table.md").read_text(encoding="utf-8").split("\n\n")
    lines = [t for t in tables if t.startswith("|")][which].splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {cells[0]: dict(zip(rows[0], cells)) for cells in rows[2:]}


def test_every_rung_leaves_a_run_folder_a_row_a_picture_and_a_sample(ladder):
    out, printed = ladder
    rows = table_rows(out)
    samples = (out / "samples.md").read_text(encoding="utf-8")
    for i, rung in enumerate(machinery.RUNGS, 1):
        label = f"{rung.name} (cheats)" if rung.cheats else rung.name
        row = rows[label]
        assert row["what it adds"] == rung.adds and row["training"] == "4.3 s"
        assert int(row["steps"].replace(",", "")) >= 1 and int(row["parameters"].replace(",", "")) > 0
        assert float(row["bits/char"]) == pytest.approx(float(row["val loss"]) / math.log(2), abs=2e-3)
        assert (out / rung.name / "best.pt").exists() and (out / rung.name / "train.log").exists()
        if rung.name == "bigram":
            assert row["attention entropy (bits)"] == "—" and not (out / rung.name / "attention.png").exists()
        else:
            assert float(row["attention entropy (bits)"]) > 0
            assert_png(out / rung.name / "attention.png")
        assert f"## {label}: 4.3 s of training, seed 1337\n\n```text\n{PROMPT}" in samples
        assert f"[{i}/{len(machinery.RUNGS)}] {rung.name}: " in printed
    assert list(rows) == [f"{r.name} (cheats)" if r.cheats else r.name for r in machinery.RUNGS]
    heads = table_rows(out, which=1)
    assert list(heads) == list(rows) and heads["bigram"]["induction"] == "—"
    for label, row in heads.items():  # the strongest head of each kind: its name and its score
        for kind in ("previous-token", "first-token", "duplicate-token", "induction", "local"):
            if label != "bigram":
                name, score, *formed = row[kind].split(maxsplit=2)
                assert name.startswith("L") and 0 <= float(score) <= 1
                assert not formed or formed[0].startswith("(step ")
    assert_png(out / "loss_vs_time.png")
    assert "| rung " in printed and "--- encoder (cheats) ---" in printed


def test_by_default_every_rung_learns_from_as_many_tokens(data_dir, tmp_path):
    """Without a budget each rung's steps cover the same training tokens, whatever its batch: the recipe's 4 x 16
    tokens a step take 16 steps for 1,000 tokens, the preset's 4 x 16 too; the table says the tokens, and the
    picture's axis is tokens, not seconds."""
    preset = tmp_path / "preset.py"
    preset.write_text(TINY_PRESET.replace("batch_size = 4", "batch_size = 8"), encoding="utf-8")
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=bigram,modern", "--tokens=1000", preset=preset)
    rows = table_rows(out)
    assert {name: (row["training"], row["steps"]) for name, row in rows.items()} == {
        "bigram": ("1,000 tokens", "16"), "modern": ("1,000 tokens", "8")}
    assert "per second" in (out / "table.md").read_text(encoding="utf-8")  # the notes say what each mode teaches
    assert json.loads((out / "modern" / "lab.json").read_text(encoding="utf-8"))["tokens_per_iter"] == 128


def test_uniform_attention_has_the_largest_entropy_a_causal_row_can_have(ladder):
    """Every query of the tril trick spreads over all t+1 keys it sees: log2(t+1) bits, averaged over t."""
    row = table_rows(ladder[0])["uniform"]
    block_size = TINY["block_size"]
    assert float(row["attention entropy (bits)"]) == pytest.approx(
        sum(math.log2(t + 1) for t in range(block_size)) / block_size, abs=0.005)


def test_a_rung_is_a_run_that_sample_and_plot_read(ladder, capsys):
    folder = ladder[0] / "blocks"
    sample.main([f"--out_dir={folder}", f"--start={PROMPT}", "--num_samples=1", "--max_new_tokens=5",
                 "--device=cpu"])
    assert capsys.readouterr().out.startswith(PROMPT)
    plot.main(["loss", f"--out_dir={folder}"])
    assert_png(folder / "loss.png")


def test_the_modern_rung_is_the_preset_itself_with_only_what_the_lab_must_set():
    cfg = machinery.LabConfig(out_dir="somewhere", budget=7, data_dir="elsewhere", seed=5)
    modern = next(r for r in machinery.RUNGS if r.name == "modern")
    args = machinery.train_args(modern, cfg)
    assert args[0] == str(machinery.PRESET) and args[0].endswith("config/shakespeare_char.py")
    preset, lab_run = parse_config(TrainConfig, [args[0]]), parse_config(TrainConfig, args)
    assert (lab_run.out_dir, lab_run.max_time, lab_run.data_dir, lab_run.seed) == \
        ("somewhere/modern", 7, "elsewhere", 5)
    # no max_iters: the budget is planned as the steps that fit in it here idle, whatever the load
    assert not any(a.startswith("--max_iters") for a in args) and not lab_run.wall_clock
    assert lab_run.init_from == "scratch"
    assert lab_run.model == preset.model and lab_run.optimizer == preset.optimizer  # the preset's model, as it is
    assert lab_run.min_tokens_per_param == 0  # never fitted to its budget: rungs compare models, not machines
    assert (lab_run.learning_rate, lab_run.batch_size, lab_run.lr_schedule) == \
        (preset.learning_rate, preset.batch_size, preset.lr_schedule)


def test_a_model_setting_goes_over_every_rung_s_own_and_the_start_line_names_the_rungs_it_changes(capsys):
    """Any of model.py's settings (GPTConfig's fields, a learner's new one too) is a lab.py option: train.py gets it
    after the rung's own options, before what the lab sets; --help lists them as over every rung's own."""
    cfg = machinery.lab_config(["--rungs=scaled,dot,modern", "--attention=dot", "--mlp=False", "--budget=5"])
    assert cfg.model_settings == {"attention": "dot", "mlp": False} and cfg.rungs == "scaled,dot,modern"
    for rung in cfg.chosen():
        args, own = machinery.train_args(rung, cfg), machinery.own_args(rung)
        assert args[:len(own) + 2] == [*own, "--attention='dot'", "--mlp=False"]
        assert parse_config(TrainConfig, args).model.attention == "dot"
    assert machinery.settings_line(cfg) == \
        "model settings over each rung's own: attention='dot' changes scaled, modern; mlp=False changes modern"
    assert [machinery.changed_settings(r, cfg) for r in cfg.chosen()] == \
        [{"attention": "dot"}, {}, {"attention": "dot", "mlp": False}]
    with pytest.raises(SystemExit):
        lab.main(["--help"])
    assert "model settings (model.py's GPTConfig), over every rung's own" in capsys.readouterr().out
    with pytest.raises(UserError, match="^command line: unknown config key 'vocab_size'"):
        lab.main(["--vocab_size=5"])  # the dataset's, as for train.py


def test_a_rung_trained_with_a_model_setting_says_so_in_its_row_and_learns_as_the_rung_that_has_it(data_dir, tmp_path):
    """--attention=dot makes the scaled rung the dot rung: its row is named with the setting, its lab.json keeps it,
    and it learns what the dot rung learns; the dot rung, which has it already, is the path's own."""
    out = tmp_path / "lab"
    printed = tiny_lab(data_dir, out, "--rungs=scaled,dot", "--tokens=320", "--attention=dot")
    assert printed.startswith("model settings over each rung's own: attention='dot' changes scaled\n")
    rows = table_rows(out)
    assert list(rows) == ["scaled (attention='dot')", "dot"]
    assert rows["scaled (attention='dot')"]["val loss"] == rows["dot"]["val loss"]
    kept = {name: json.loads((out / name / "lab.json").read_text(encoding="utf-8")) for name in ("scaled", "dot")}
    assert (kept["scaled"]["model_settings"], kept["dot"]["model_settings"]) == ({"attention": "dot"}, {})
    assert "A model setting in a rung's name was given to lab.py" in (out / "table.md").read_text(encoding="utf-8")
    assert "## scaled (attention='dot'): 320 tokens of training" in (out / "samples.md").read_text(encoding="utf-8")


def test_a_rung_s_strongest_heads_name_each_kind_s_best_head_and_its_score():
    from test_experiments import previous_token_model

    heads = machinery.strongest_heads(previous_token_model(), random_tokens((2, 16)), 37)
    assert list(heads) == ["previous_token", "first_token", "duplicate_token", "induction", "local"]
    assert heads["previous_token"] == ["L0H0", 1.0] and heads["induction"][1] < 0.05


def test_the_step_a_head_formed_is_the_first_record_where_its_score_passed_the_mark():
    def record(step, score):
        scores = {k: [[0.0, 0.0]] for k in ("previous_token", "first_token", "duplicate_token", "local")}
        return {"kind": "timeline", "iter": step, "icl": 0.0, "heads": dict(scores, induction=[[0.1, score]])}
    records = [record(0, 0.0), record(10, 0.2), record(20, machinery.FORMED_AT), record(30, 0.9)]
    heads = {"induction": ["L0H1", 0.9], "local": ["L0H0", 0.0]}
    assert machinery.formed_at(heads, records) == {"induction": 20}
    row = machinery.Row(machinery.RUNGS[1], 0, 1, 10, 5, 2.0, 2.0, None, 1.0, "", [], heads=heads,
                        formed={"induction": 20})
    assert "L0H1 0.90 (step 20)" in machinery.heads_table([row])


def test_entropy_is_in_bits_and_falls_as_the_softmax_sharpens():
    model = tiny_model(block_size=8, vocab_size=11, n_head=2, n_embd=8, bias=False, attention="dot")
    idx = torch.randint(11, (3, 8))
    diffuse = machinery.attention_entropy(model, idx)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(30)  # large scores: a saturated softmax
    assert machinery.attention_entropy(model, idx) < diffuse <= sum(math.log2(t + 1) for t in range(8)) / 8
    assert machinery.attention_entropy(tiny_model(block_size=8, vocab_size=11, n_layer=0), idx) is None


def markdown_rows(table):
    """{first cell: {header: cell}} of a Markdown table's lines."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    return {cells[0]: dict(zip(rows[0], cells)) for cells in rows[2:]}


def test_a_row_whose_model_sees_ahead_is_marked_cheats_and_drawn_aside(tmp_path, monkeypatch, capsys):
    """The lab run after the notes' "just delete the single line that does masking" in model.py: every rung sees the
    tokens after each position, and its loss near 0 stood in the table as the mechanism's result, unmarked. Now such
    a row is 'cheats' as the encoder's is, a note under the table says why, and its curve goes aside."""
    rung = next(r for r in machinery.RUNGS if r.name == "scaled")
    evals = [{"iter": 0, "val_loss": 4.0}, {"iter": 10, "val_loss": 0.1}]
    row = machinery.Row(rung, 0.0, 1337, 1000, 10, 0.1, 0.1, 1.5, 3.0, "", evals, tokens=1000, tokens_per_iter=100,
                        sees_ahead=True)
    drawn = {}
    monkeypatch.setattr("gptkit.interp.pictures.draw_val_loss_vs_time",
                        lambda honest, title, path, aside, tokens_per_iter: drawn.update(honest=honest, aside=aside))
    cfg = SimpleNamespace(out_dir=str(tmp_path), dataset="tiny")
    machinery.write_results(cfg, [row], [], [], {"tokenizer": "char", "val_tokens": 100})
    assert row.label == "scaled (cheats)" and drawn == {"honest": {}, "aside": {"scaled (cheats)": evals}}
    assert "its model's positions see the tokens after them, the next one among them (model.py's mask taken out or " \
        "changed by hand), so its losses are no result." in (tmp_path / "table.md").read_text()


def test_a_rung_whose_attention_has_no_hook_pattern_makes_its_row_without_entropy_or_heads(data_dir, tmp_path,
                                                                                          monkeypatch):
    """The notes' averaging written into model.py (no softmax, so no hook_pattern): the rung trained, then the lab
    stopped at reading its heads, and lost the row."""
    import model as model_py

    def averaging(self, q, k, v):  # the notes' version 2: each position the mean of the values up to it
        T = q.size(2)
        wei = torch.tril(torch.ones(T, T, device=q.device))
        return (wei / wei.sum(1, keepdim=True)) @ v

    monkeypatch.setattr(model_py.SelfAttention, "written", averaging)
    out = tmp_path / "lab"
    printed = tiny_lab(data_dir, out, "--rungs=scaled", "--tokens=3000")
    assert "note: rung scaled: model.py's forward never passes through the hook point blocks.0.attn.hook_pattern" \
        in printed and "its row has no attention entropy or heads, and no attention.png" in printed
    row = table_rows(out)["scaled"]
    assert row["attention entropy (bits)"] == "—" and not (out / "scaled" / "attention.png").exists()


def test_the_table_gives_bits_per_character_beside_the_val_loss():
    """Bits per character = val loss (nats per token) x val tokens / (ln 2 x the characters they spell), from the
    dataset's metadata: the measure that compares tokenizers. Char-level it is bits per token, one column; a
    dataset prepared before its characters were counted has none to give ('—')."""
    rung = next(r for r in machinery.RUNGS if r.name == "scaled")
    row = machinery.Row(rung, 0.0, 1337, 1000, 10, 2.2, 2.0, 1.5, 3.0, "", [], tokens=1000)
    bpe = {"tokenizer": "bpe", "val_tokens": 100, "val_chars": 250}
    got = markdown_rows(machinery.results_table([row], "token", bpe))["scaled"]
    assert got["val loss"] == "2.000" and got["bits/token"] == f"{2.0 / math.log(2):.3f}"
    assert got["bits/char"] == f"{2.0 * 100 / (math.log(2) * 250):.3f}"
    older = markdown_rows(machinery.results_table([row], "token", {"tokenizer": "bpe", "val_tokens": 100}))
    assert older["scaled"]["bits/char"] == "—"
    char = markdown_rows(machinery.results_table([row], "char", {"tokenizer": "char", "val_tokens": 100}))["scaled"]
    assert "bits/token" not in char and char["bits/char"] == f"{2.0 / math.log(2):.3f}"


@pytest.mark.slow
def test_the_lab_trains_on_a_bpe_dataset_and_its_table_and_the_explorer_give_bits_per_character(bpe_data, tmp_path):
    from test_explorer import app_over

    data, meta, _ = bpe_data
    out = tmp_path / "lab"
    printed = tiny_lab(data, out, "--dataset=tiny_bpe", "--rungs=scaled", "--tokens=640")
    row = table_rows(out)["scaled"]
    val_loss = float(row["val loss"])
    assert float(row["bits/token"]) == pytest.approx(val_loss / math.log(2), abs=2e-3)
    per_char = val_loss * meta["val_tokens"] / (math.log(2) * meta["val_chars"])
    assert float(row["bits/char"]) == pytest.approx(per_char, abs=2e-3)
    assert f"bits/token, {row['bits/char']} bits/char)" in printed
    final = app_over(out).get("/api/lab").json()["runs"][0]["final"]  # the explorer's lab panel: the same
    assert final["val_loss"] == pytest.approx(val_loss, abs=5e-4)
    assert final["bits_per_char"] == pytest.approx(float(row["bits/char"]), abs=5e-4)


@pytest.mark.slow
def test_an_unknown_rung_is_one_line_naming_the_valid_ones():
    proc = run_script("lab.py", "--rungs=bigram,trigram")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: unknown rung 'trigram'; choose from {', '.join(machinery.RUNG_NAMES)}")


@pytest.mark.parametrize("extra, expected", [
    (["--dataset=shakespeare_char"], "dataset folder * not found; create it with `python data/prepare.py --data_dir="),
    (["--prompt=a@b"], "prompt: the text has characters outside the training vocabulary: '@'"),
    (["--prompt=" + "First Citizen:" * 20], "the prompt is 280 tokens, longer than rung bigram's block_size *"),
    (["--tokens=0"], "need tokens > 0, or budget > 0 seconds (got tokens=0, budget=0.0)"),
    (["--rungs=dot,dot"], "a rung is named twice in 'dot,dot'"),
    (["--rungs=scaled,uniform", "--qk_norm=True"], "rung uniform cannot take qk_norm=True: attention='uniform' has "
                                                   "no queries or keys: it cannot take qk_norm=True or *"),
    (["--budget=5", "--rungs=modern", "--n_head=5"], "rung modern cannot take n_head=5: n_embd (* must be divisible "
                                                     "by n_head (5)"),
])
def test_mistakes_are_caught_before_any_training(data_dir, tmp_path, extra, expected):
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", *extra))
    head, _, tail = expected.partition("*")
    assert str(caught.value).startswith(head) and tail in str(caught.value)
    assert not (tmp_path / "lab").exists()


# ----------------------------------------------------------------------------- later runs, other runs, signals


def test_a_later_lab_run_keeps_the_rows_of_rungs_it_does_not_train(data_dir, tmp_path, monkeypatch):
    """A second lab run after the first: every rung in out_dir stays in the table, the picture and the samples,
    each with the budget it had; a rung trained again shows its latest run."""
    from gptkit.interp import pictures

    drawn = {}

    def draw(runs, title, path, **kw):
        drawn.update(runs=runs, title=title)
        return real_draw(runs, title, path, **kw)

    real_draw = pictures.draw_val_loss_vs_time
    monkeypatch.setattr(pictures, "draw_val_loss_vs_time", draw)
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=uniform,scaled", "--budget=4.3")
    first = table_rows(out)
    assert [r["training"] for r in first.values()] == ["4.3 s", "4.3 s"] and "per rung" in drawn["title"]
    (out / "additive").mkdir()  # a rung stopped before it finished: a folder without a row
    printed = tiny_lab(data_dir, out, "--rungs=scaled,dot", "--budget=4.6")
    rows = table_rows(out)
    budgets = {"uniform": "4.3 s", "scaled": "4.6 s", "dot": "4.6 s"}
    assert {name: row["training"] for name, row in rows.items()} == budgets
    assert rows["uniform"] == first["uniform"]  # rebuilt from its lab.json as it was
    assert json.loads((out / "uniform" / "lab.json").read_text(encoding="utf-8"))["budget"] == 4.3
    notes = (out / "table.md").read_text(encoding="utf-8")
    assert "rows trained for different lengths do not compare" in notes and "before the end): additive;" in notes
    assert_png(out / "loss_vs_time.png")
    assert list(drawn["runs"]) == ["uniform (4.3 s)", "scaled (4.6 s)", "dot (4.6 s)"]
    latest = [r for r in map(json.loads, (out / "scaled" / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "eval"]
    assert drawn["runs"]["scaled (4.6 s)"] == latest
    samples = (out / "samples.md").read_text(encoding="utf-8")
    assert all(f"## {name}: {budget} of training, seed 1337" in samples for name, budget in budgets.items())
    assert "--- dot ---" in printed and "--- uniform ---" not in printed  # printed: the rungs trained now


def test_rows_of_another_dataset_or_damaged_rows_are_one_line_before_training(data_dir, tmp_path):
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=uniform", "--budget=4.3")
    kept = out / "uniform" / "lab.json"
    kept.write_text(kept.read_text(encoding="utf-8").replace('"dataset": "tiny"', '"dataset": "other"'))
    with pytest.raises(UserError, match=r"was trained on dataset 'other', not 'tiny'.*--rungs=uniform"):
        lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
    kept.write_text("{truncated")
    with pytest.raises(UserError, match=r"lab.json is not a row the lab wrote .*--rungs=uniform"):
        lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
    assert not (out / "dot").exists()
    tiny_lab(data_dir, out, "--rungs=uniform", "--budget=4.3")  # training it again replaces the row


def test_a_table_edited_by_hand_is_one_line_before_training_and_kept(data_dir, tmp_path):
    """The learner wrote notes into table.md or samples.md: the next lab run would write it anew, their notes gone."""
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=uniform", "--budget=4.3")
    tiny_lab(data_dir, out, "--rungs=scaled", "--budget=4.3")  # the lab's own table it writes anew
    table, samples = out / "table.md", out / "samples.md"
    for path, edit in ((table, lambda t: t + "\nMy notes: uniform averages.\n"),
                       (samples, lambda t: t.replace("## uniform", "## uniform (mine: no words yet)"))):
        lab_wrote = path.read_text(encoding="utf-8")
        path.write_text(edit(lab_wrote), encoding="utf-8")
        edited = path.read_text(encoding="utf-8")
        with pytest.raises(UserError) as caught:
            lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
        assert str(caught.value) == (f"{path} was edited since the lab wrote it, and the lab writes it anew from every "
                                     "rung's row; move it, or give the lab another --out_dir")
        assert path.read_text(encoding="utf-8") == edited and not (out / "dot").exists()
        path.write_text(lab_wrote, encoding="utf-8")
    table.rename(tmp_path / "my_table.md")
    tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")
    assert list(table_rows(out)) == ["uniform", "scaled", "dot"]


def test_rows_of_the_dataset_before_it_was_prepared_again_are_one_line_before_training(data_dir, tmp_path):
    """data/prepare.py --start_over replaced the dataset under its name with other text: the rows trained on the
    text it held before would sit in one table with rows of the new one."""
    from gptkit.data.preparing import PrepareConfig, prepare

    data, out = tmp_path / "data", tmp_path / "lab"
    shutil.copytree(data_dir, data)
    tiny_lab(data, out, "--rungs=uniform", "--budget=4.3")
    text = (data_dir.parent / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "other.txt").write_text(text[: len(text) // 2] + PROMPT, encoding="utf-8")
    prepare(PrepareConfig(input=str(tmp_path / "other.txt"), name="tiny", data_dir=str(data), workers=1,
                          start_over=True))
    with pytest.raises(UserError, match=r"uniform was trained on dataset 'tiny' as it was before it was prepared "
                                        r"again .*--rungs=uniform"):
        lab.main(lab_args(data, out, "--rungs=dot", "--budget=4.3"))
    assert not (out / "dot").exists() and (out / "uniform" / "lab.json").exists()
    tiny_lab(data, out, "--rungs=uniform", "--budget=4.3")  # training it again on the new text replaces the row


def test_a_rung_s_folder_renamed_to_another_rung_s_is_one_line_before_training(data_dir, tmp_path):
    """The learner renamed out-lab/scaled to out-lab/dot: the table listed the scaled run as dot's row."""
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=scaled", "--budget=4.3")
    (out / "scaled").rename(out / "dot")
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, out, "--rungs=uniform", "--budget=4.3"))
    assert str(caught.value) == (f"{out / 'dot' / 'lab.json'} is the row of rung 'scaled', not of dot, whose folder "
                                 "holds it; give the folder back its name, or train dot again with --rungs=dot")
    assert not (out / "uniform").exists()


def test_a_row_with_a_field_the_lab_never_writes_is_one_line_before_training(data_dir, tmp_path):
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=uniform", "--budget=4.3")
    kept = out / "uniform" / "lab.json"
    row = json.loads(kept.read_text(encoding="utf-8"))
    for field, value, said in (("val_loss", "x", "its val_loss is 'x'"), ("heads", 5, "its heads is '5'"),
                               ("steps", None, "its steps is 'None'"), ("evals", "x", "its evals is 'x'"),
                               ("evals", [{"iter": 1}], "its evals is"),
                               ("evals", [{"iter": -5, "val_loss": 1e308}], "its evals is"),
                               ("val_loss", 1e308, "its val_loss is '1e+308'"), ("params", -1, "its params is '-1'"),
                               ("tokens_per_iter", 0, "its tokens_per_iter is '0'")):
        kept.write_text(json.dumps(dict(row, **{field: value})), encoding="utf-8")
        with pytest.raises(UserError, match=rf"lab.json is not a row the lab wrote \({re.escape(said)}"):
            lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
    # in the words of its keys, not of the code that read it
    for damaged, said in ((dict(row, extra=1), "it has a key the lab does not write, 'extra'"),
                          ({k: v for k, v in row.items() if k != "rung"}, "it has no 'rung'"),
                          ({k: v for k, v in row.items() if k != "val_loss"}, "it has no 'val_loss'"),
                          ([1, 2], "it is not a JSON object of the row's keys")):
        kept.write_text(json.dumps(damaged), encoding="utf-8")
        with pytest.raises(UserError, match=rf"lab.json is not a row the lab wrote \({re.escape(said)}\); train"):
            lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
    kept.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(UserError, match=r"lab.json is nested too deeply to be a row the lab wrote; .*--rungs=uniform"):
        lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
    assert not (out / "dot").exists()


def test_a_rung_trained_on_since_the_lab_trained_it_is_refused_and_kept(data_dir, tmp_path):
    """train.py continued a rung's run (its latest.pt newer than the row the lab wrote once the rung had trained):
    training the rung again would delete it."""
    folder = tmp_path / "lab" / "scaled"
    folder.mkdir(parents=True)
    for name in ("train.log", "lab.json", "latest.pt"):
        (folder / name).write_text(f"the {name}")
    os.utime(folder / "lab.json", ns=(1, 1))
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert str(caught.value) == (f"{folder} holds a run trained on since the lab trained it (latest.pt written "
                                 "since its lab.json); move it, or give the lab another --out_dir")
    assert (folder / "latest.pt").read_text() == "the latest.pt"


def test_a_rung_is_known_by_what_its_files_hold_not_their_times(data_dir, tmp_path):
    """The row keeps the sha256 of the rung's files: a lab copied with `cp -r` (every file newer than its row)
    trains a rung again, and a latest.pt written since is refused whatever its time."""
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")
    folder = out / "dot"
    written = (folder / "lab.json").stat().st_mtime_ns
    for path in folder.rglob("*"):  # as cp -r leaves them: each file's time the moment it was copied
        if path.is_file() and path.name != "lab.json":
            os.utime(path, ns=(written + 10**9, written + 10**9))
    printed = tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")
    assert "was drawn since" not in printed and json.loads((folder / "lab.json").read_text(encoding="utf-8"))
    latest = folder / "latest.pt"
    latest.write_bytes(latest.read_bytes() + b"trained on")
    os.utime(latest, ns=(1, 1))
    with pytest.raises(UserError, match=r"holds a run trained on since the lab trained it \(latest.pt written since"):
        lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))


def test_a_rung_s_attention_picture_drawn_since_by_plot_py_is_said_as_it_goes_with_the_old_run(data_dir, tmp_path):
    """docs/lab.md's own plot.py attention --out_dir=out-lab/dot --start=... draws over the rung's attention.png:
    training the rung again replaced the learner's picture saying only 'wrote out-lab/dot/attention.png'."""
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")
    picture = out / "dot" / "attention.png"
    plot.main(["attention", f"--out_dir={out / 'dot'}", "--start=First", "--device=cpu"])
    written = (out / "dot" / "lab.json").stat().st_mtime_ns
    os.utime(picture, ns=(written + 10**9, written + 10**9))  # drawn after the row, whatever the clock's grain
    printed = tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")
    assert f"note: {picture} was drawn since the lab drew it; it goes with the rung's old run, and the rung " \
           "trained again draws its own there\n" in printed
    assert "was drawn since" not in tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")  # the lab's own picture


def test_a_rung_whose_train_py_fails_gets_its_earlier_run_and_row_back(data_dir, tmp_path, monkeypatch):
    """Training a rung again (a --budget too small to fit a step, say) cleared its earlier run and row before its
    train.py ran: one that failed left the rung with neither. The earlier run now waits aside and comes back."""
    out = tmp_path / "lab"
    tiny_lab(data_dir, out, "--rungs=dot", "--budget=4.3")
    folder = out / "dot"
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "train.log"}
    assert Path("lab.json") in before and Path("best.pt") in before

    def fails(args, log, stops):  # as train.py does: a first record and snapshot, then one line and status 1
        (folder / "metrics.jsonl").write_text('{"kind": "run", "iter": 0}\n', encoding="utf-8")
        (folder / "snapshots").mkdir(exist_ok=True)
        (folder / "snapshots" / "iter_0.pt").write_bytes(b"the failed run's")
        log.write("error: max_time=0.05 fits no step of this model here\n")
        return 1

    monkeypatch.setattr(machinery, "run_train", fails)
    with pytest.raises(UserError, match="^rung dot: train.py failed: max_time=0.05 fits no step of this model here; "
                                        "its earlier run and row are back in place$"):
        lab.main(lab_args(data_dir, out, "--rungs=dot", "--budget=4.3"))
    after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "train.log"}
    assert after == before and not (folder / ".lab-previous").exists() and not (folder / "snapshots").exists()


def test_a_stopped_rung_that_train_py_continued_is_refused_and_kept(data_dir, tmp_path):
    """A lab stopped while training a rung leaves no row; train.py --init_from=auto then continued the run: its
    metrics hold a second run record, and training the rung again would delete the learner's run."""
    folder = tmp_path / "lab" / "scaled"
    folder.mkdir(parents=True)
    runs = [{"kind": "run", "iter": i, "device": "cpu", "tokens_per_iter": 64} for i in (0, 40)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs) + '{"kind": "tr')
    for name in ("train.log", "latest.pt"):
        (folder / name).write_text(f"the {name}")
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert str(caught.value) == (f"{folder} holds a run trained on since the lab started it (train.py continued it "
                                 "from iteration 40); move it, or give the lab another --out_dir")
    assert (folder / "latest.pt").read_text() == "the latest.pt"
    (folder / "metrics.jsonl").write_text(json.dumps(runs[0]) + "\n" + '{"kind": "tr')  # the lab's stopped run alone
    tiny_lab(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3")
    assert (folder / "lab.json").exists()


def test_a_rung_holding_an_sae_of_its_weights_is_refused_and_kept(data_dir, tmp_path):
    """analyze.py features on a rung keeps an SAE of its weights in sae/, which train.py would refuse a new run
    beside: the lab refuses before it deletes the rung's run and row, rather than fail after."""
    folder = tmp_path / "lab" / "scaled"
    (folder / "sae" / "blocks.1.hook_resid_post").mkdir(parents=True)
    for name in ("train.log", "best.pt", "lab.json"):  # the row last, as the lab writes it
        (folder / name).write_text(f"the {name}")
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert str(caught.value) == (f"{folder} holds sparse autoencoders of its run's weights (sae/, analyze.py "
                                 "features); move them, or give the lab another --out_dir")
    assert {name: (folder / name).read_text() for name in ("lab.json", "best.pt")} == \
        {"lab.json": "the lab.json", "best.pt": "the best.pt"}


def test_a_damaged_dataset_is_one_line_before_an_earlier_rung_is_cleared(data_dir, tmp_path):
    """A rung trained again replaces its earlier run: a token file the rung's train.py would refuse is found
    first, and the earlier run stays."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_dir / "tiny", data / "tiny")
    (data / "tiny" / "val.bin").write_bytes(b"")
    earlier = tmp_path / "lab" / "scaled"
    earlier.mkdir(parents=True)
    for name in ("train.log", "best.pt"):
        (earlier / name).write_text(f"the earlier lab's {name}")
    with pytest.raises(UserError, match=r"val.bin has 0 tokens, meta.json says"):
        lab.main(lab_args(data, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert (earlier / "best.pt").read_text() == "the earlier lab's best.pt"


def test_a_rung_folder_in_use_is_refused_before_anything_in_it_is_deleted(data_dir, tmp_path):
    folder = tmp_path / "lab" / "scaled"
    live = {name: f"{name} of a run in progress" for name in ("latest.pt", "best.pt", "metrics.jsonl", "lab.json")}
    with RunDir(folder).locked():
        for name, text in live.items():
            (folder / name).write_text(text)
        with pytest.raises(UserError) as caught:
            lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
        assert {name: (folder / name).read_text() for name in live} == live
    message = str(caught.value)
    assert message.startswith(f"{folder} is in use by another run (process {os.getpid()})") and "\n" not in message


def test_a_run_the_lab_did_not_train_in_a_rung_s_folder_is_refused_and_kept(data_dir, tmp_path):
    """A folder of the rung's name holding someone's run (a best.pt, no lab's log or row beside it): the lab
    would clear it to train the rung afresh. It refuses before any training, every file kept."""
    folder = tmp_path / "lab" / "scaled"
    folder.mkdir(parents=True)
    (folder / "best.pt").write_text("someone's best model")
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert str(caught.value) == (f"{folder} holds a run the lab did not train (best.pt); move it, or give the lab "
                                 "another --out_dir")
    assert (folder / "best.pt").read_text() == "someone's best model"


def test_a_rung_folder_that_is_a_link_is_refused_and_the_run_it_leads_to_kept(data_dir, tmp_path):
    """out_dir/scaled a link to another lab's rung: training it would clear that run and its row, elsewhere."""
    tiny_lab(data_dir, tmp_path / "other", "--rungs=scaled", "--budget=4.3")
    row = (tmp_path / "other" / "scaled" / "lab.json").read_text(encoding="utf-8")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "scaled").symlink_to(tmp_path / "other" / "scaled")
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert str(caught.value) == (f"{tmp_path / 'lab' / 'scaled'} is a link (to {tmp_path / 'other' / 'scaled'}), "
                                 "and the lab clears and trains a rung only in a folder of its own; remove the link, "
                                 "or give the lab another --out_dir")
    assert (tmp_path / "other" / "scaled" / "lab.json").read_text(encoding="utf-8") == row


def test_a_link_at_a_rung_s_own_file_is_refused_before_its_run_is_cleared(data_dir, tmp_path):
    """The lab writes a rung's row, picture and log after the rung trains: a link at one (dangling here) is refused
    before the lab clears the rung's earlier run, which stays as it was."""
    tiny_lab(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3")
    rung = tmp_path / "lab" / "scaled"
    best = (rung / "best.pt").read_bytes()
    for name in ("lab.json", "attention.png", "train.log"):
        kept = (rung / name).read_bytes() if (rung / name).exists() else None
        (rung / name).unlink(missing_ok=True)
        (rung / name).symlink_to(tmp_path / "nowhere")
        with pytest.raises(UserError) as caught:
            lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
        assert str(caught.value) == f"{rung / name} is a link, and the tool writes this file itself, never " \
                                    "through a link; remove it"
        assert (rung / "best.pt").read_bytes() == best
        (rung / name).unlink()
        if kept is not None:
            (rung / name).write_bytes(kept)


def test_a_rung_s_log_is_never_written_through_a_link(tmp_path, outside):
    """Below the checks at a run's start: a link at a rung's train.log, made while the lab runs, is refused and
    never written through."""
    rung = tmp_path / "rung"
    rung.mkdir()
    (rung / "train.log").symlink_to(outside)
    with pytest.raises(UserError, match="train.log is a link"):
        machinery.train_rung(SimpleNamespace(name="rung"), SimpleNamespace(out_dir=tmp_path), stops=None)
    assert outside.read_text() == "precious\n"


def fake_rung_folder(folder):
    """A rung folder as the modern rung's train.py leaves it (its preset keeps snapshots), and a train_args/run_train
    pair that starts train.py's run in it as train.py would: what that start saw in the folder."""
    (folder / "snapshots").mkdir(parents=True)
    for name in ("train.log", "lab.json", "metrics.jsonl", "best.pt", "snapshots/iter_0.pt", "snapshots/iter_13.pt"):
        (folder / name).write_text("x")
    seen = []

    def run_train(args, log, stops):
        seen.extend(sorted(os.listdir(folder)))
        RunDir(folder).clear_for_a_new_run(False, ";", print)  # train.py's check: another run's files are refused
        return 0
    return seen, run_train


def test_a_rung_trained_again_clears_the_snapshots_its_last_run_kept(tmp_path, monkeypatch):
    """python lab.py, then python lab.py --budget=25: the modern rung's train.py starts in a folder cleared of
    its last run's snapshots too, rather than refusing it as another run's after its row was deleted."""
    seen, run_train = fake_rung_folder(tmp_path / "modern")
    monkeypatch.setattr(machinery, "train_args", lambda rung, cfg: [])
    monkeypatch.setattr(machinery, "run_train", run_train)
    machinery.train_rung(SimpleNamespace(name="modern"), SimpleNamespace(out_dir=tmp_path), stops=None)
    assert seen == [".lab-previous", "run.lock", "train.log"]  # the earlier run waits aside until the new one ends
    assert sorted(os.listdir(tmp_path / "modern")) == ["run.lock", "train.log"]  # and goes with it


def test_a_file_of_the_user_s_among_a_rung_s_snapshots_stays_and_is_one_line(tmp_path, monkeypatch):
    """A file of the user's in a rung's snapshots/: the folder stays with it, and train.py refuses it in one line."""
    _, run_train = fake_rung_folder(tmp_path / "modern")
    (tmp_path / "modern" / "snapshots" / "notes.txt").write_text("mine")
    monkeypatch.setattr(machinery, "train_args", lambda rung, cfg: [])
    monkeypatch.setattr(machinery, "run_train", run_train)
    with pytest.raises(UserError, match=r"holds another run \(snapshots\)"):
        machinery.train_rung(SimpleNamespace(name="modern"), SimpleNamespace(out_dir=tmp_path), stops=None)
    assert (tmp_path / "modern" / "snapshots" / "notes.txt").read_text() == "mine"


def test_a_file_of_the_user_s_among_a_trained_rung_s_snapshots_is_refused_before_its_run_is_cleared(data_dir, tmp_path):
    """python lab.py, a note of the learner's in out-lab/modern/snapshots/, python lab.py --rungs=modern: the lab
    deleted the rung's run and row, then train.py refused the folder for the note."""
    folder = tmp_path / "lab" / "modern"
    (folder / "snapshots").mkdir(parents=True)
    for name in ("snapshots/iter_0.pt", "snapshots/notes.txt", "train.log", "latest.pt", "lab.json"):
        (folder / name).write_text(f"the {name}")
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=modern", "--budget=4.3"))
    assert str(caught.value) == (f"{folder / 'snapshots'} holds notes.txt, and the lab clears only its own snapshots "
                                 "there for a new run; move it, or give the lab another --out_dir")
    assert sorted(os.listdir(folder)) == ["lab.json", "latest.pt", "snapshots", "train.log"]
    (folder / "snapshots" / "notes.txt").unlink()
    (folder / "snapshots").rename(tmp_path / "elsewhere")
    (folder / "snapshots").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match=r"snapshots is a link, and the lab clears only its own snapshots"):
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=modern", "--budget=4.3"))
    assert (folder / "latest.pt").exists() and (tmp_path / "elsewhere" / "iter_0.pt").exists()


@pytest.mark.parametrize("name", ["lab.json", "attention.png", "train.log"])
def test_a_folder_where_the_lab_writes_a_rung_s_file_is_one_line_before_its_run_is_cleared(data_dir, tmp_path, name):
    folder = tmp_path / "lab" / "scaled"
    (folder / name).mkdir(parents=True)
    for kept in {"train.log", "lab.json", "latest.pt"} - {name}:
        (folder / kept).write_text(f"the {kept}")
    os.utime(folder / "latest.pt", ns=(1, 1))
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", "--rungs=scaled", "--budget=4.3"))
    assert str(caught.value) == f"{folder / name} is a folder where the lab writes a file; move it out of the way"
    assert (folder / "latest.pt").read_text() == "the latest.pt"


def test_a_rung_s_snapshots_are_never_cleared_through_a_link(tmp_path, monkeypatch):
    """A link of the user's at a rung's snapshots: what it points to stays, and train.py refuses the folder."""
    fake_rung_folder(tmp_path / "elsewhere")
    (tmp_path / "modern").mkdir()
    (tmp_path / "modern" / "snapshots").symlink_to(tmp_path / "elsewhere" / "snapshots")
    monkeypatch.setattr(machinery, "train_args", lambda rung, cfg: [])
    monkeypatch.setattr(machinery, "run_train",
                        lambda args, log, stops: RunDir(tmp_path / "modern").clear_for_a_new_run(False, ";", print))
    with pytest.raises(UserError, match="modern/snapshots is a link; a run keeps its snapshots in a folder of its own"):
        machinery.train_rung(SimpleNamespace(name="modern"), SimpleNamespace(out_dir=tmp_path), stops=None)
    assert sorted(os.listdir(tmp_path / "elsewhere" / "snapshots")) == ["iter_0.pt", "iter_13.pt"]


@pytest.mark.slow
def test_a_lab_killed_with_sigkill_leaves_no_train_py_training_on(data_dir, tmp_path):
    """kill -9 (or the out-of-memory killer) passes nothing on: its train.py trained on to the end, holding the
    rung's folder against the lab started again. It sees the lab gone, saves its state and ends, the folder free."""
    out = tmp_path / "lab"
    run = Run([sys.executable, str(REPO / "lab.py"), *lab_args(data_dir, out, "--rungs=scaled", "--budget=120")],
              tmp_path / "logs")
    lock = out / "scaled" / "run.lock"
    try:
        train_py(run, lock, lambda: "iter " in (out / "scaled" / "train.log").read_text())
        run.proc.kill()
        assert run.wait() == -signal.SIGKILL
        deadline = time.time() + 30
        while not free(lock.parent):  # its train.py holds it while it trains
            assert time.time() < deadline, "train.py trained on after its lab was killed"
            time.sleep(POLL_S)
    finally:
        run.kill_group()
    log = (out / "scaled" / "train.log").read_text()
    assert f"latest state saved to {out / 'scaled' / 'latest.pt'}" in log and (out / "scaled" / "latest.pt").exists()


def train_py(run, lock, ready=lambda: True):
    """The pid of the train.py a lab run started, once run.lock names it and ready() holds."""
    deadline = time.time() + 90
    while True:  # the lab writes its own pid there first, while it clears the folder
        text = lock.read_text() if lock.exists() else ""
        if text.strip() and int(text) != run.proc.pid and ready():
            return int(text)
        assert run.proc.poll() is None and time.time() < deadline, run.stderr
        time.sleep(POLL_S)


def free(folder):
    try:
        with RunDir(folder).locked():
            return True
    except UserError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_lab_stops_its_train_py_and_exits_with_the_signal(data_dir, tmp_path, signum):
    """The signal to the lab alone, as a scheduler sends it: the lab stops and waits for its train.py, whose pid
    run.lock holds, and says so in one line."""
    out = tmp_path / "lab"
    run = Run([sys.executable, str(REPO / "lab.py"), *lab_args(data_dir, out, "--rungs=scaled", "--budget=120")],
              tmp_path / "logs")
    lock = out / "scaled" / "run.lock"
    try:
        child = train_py(run, lock)
        run.proc.send_signal(signum)
        assert run.wait() == 128 + signum
        assert_one_error_line(run.stderr, f"error: stopped by {signal.Signals(signum).name} while training rung scaled")
    finally:
        run.kill_group()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    with RunDir(lock.parent).locked():  # nothing holds the folder any more
        pass
