"""lab.py: every rung of the attention lab trains a few steps on a tiny corpus and leaves its row, its
attention picture and its sample; the entropy column is the one the README explains; mistakes are one line."""

import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

import lab
import plot
import sample
import train
from conftest import assert_one_error_line, run_script
from gptkit import lab as machinery
from gptkit.config import parse_config
from gptkit.errors import UserError
from gptkit.train_config import TrainConfig
from model import GPT, GPTConfig
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


def train_in_process(args, log):
    """train.py's main in this process: the same run a subprocess makes, without its second of imports. The
    bigram rung still runs as lab.py runs every rung, in a train.py process of its own."""
    if Path(log.name).parent.name == "bigram":
        return REAL_RUN_TRAIN(args, log)
    with redirect_stdout(log):
        train.main(args)
    return 0, ""


def lab_args(data_dir, out_dir, *extra):
    return [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out_dir}", f"--prompt={PROMPT}",
            "--sample_tokens=20", "--device=cpu", *extra]


@pytest.fixture(scope="module")
def ladder(data_dir, workdir):
    """Every rung, trained for a fraction of a second each: (out_dir, what lab.py printed)."""
    out = workdir / "lab"
    preset = workdir / "preset.py"
    preset.write_text(TINY_PRESET, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(machinery, "RECIPE", TINY_RECIPE)
        mp.setattr(machinery, "PRESET", preset)
        mp.setattr(machinery, "run_train", train_in_process)
        log = out.parent / "lab.txt"
        with open(log, "w", encoding="utf-8") as f, redirect_stdout(f):
            lab.main(lab_args(data_dir, out, "--budget=0.1"))
    return out, log.read_text(encoding="utf-8")


def table_rows(out):
    """{rung label: its cells} from out/table.md."""
    lines = (out / "table.md").read_text(encoding="utf-8").splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    return {cells[0]: dict(zip(rows[0], cells)) for cells in rows[2:]}


def test_every_rung_leaves_a_run_folder_a_row_a_picture_and_a_sample(ladder):
    out, printed = ladder
    rows = table_rows(out)
    samples = (out / "samples.md").read_text(encoding="utf-8")
    for i, rung in enumerate(machinery.RUNGS, 1):
        label = f"{rung.name} (cheats)" if rung.cheats else rung.name
        row = rows[label]
        assert row["what it adds"] == rung.adds
        assert int(row["steps"].replace(",", "")) >= 1 and int(row["parameters"].replace(",", "")) > 0
        assert float(row["bits/char"]) == pytest.approx(float(row["val loss"]) / math.log(2), abs=2e-3)
        assert (out / rung.name / "best.pt").exists() and (out / rung.name / "train.log").exists()
        if rung.name == "bigram":
            assert row["attention entropy (bits)"] == "—" and not (out / rung.name / "attention.png").exists()
        else:
            assert float(row["attention entropy (bits)"]) > 0
            assert_png(out / rung.name / "attention.png")
        assert f"## {label}\n\n```text\n{PROMPT}" in samples
        assert f"[{i}/{len(machinery.RUNGS)}] {rung.name}: " in printed
    assert list(rows) == [f"{r.name} (cheats)" if r.cheats else r.name for r in machinery.RUNGS]
    assert_png(out / "loss_vs_time.png")
    assert "| rung " in printed and "--- encoder (cheats) ---" in printed


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
    assert lab_run.max_iters >= 1e5 and lab_run.init_from == "scratch"
    assert lab_run.model == preset.model and lab_run.optimizer == preset.optimizer  # the preset's model, as it is
    assert (lab_run.learning_rate, lab_run.batch_size, lab_run.lr_schedule) == \
        (preset.learning_rate, preset.batch_size, preset.lr_schedule)


def test_entropy_is_in_bits_and_falls_as_the_softmax_sharpens():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8, attention="dot")).eval()
    idx = torch.randint(11, (3, 8))
    diffuse = machinery.attention_entropy(model, idx)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(30)  # large scores: a saturated softmax
    assert machinery.attention_entropy(model, idx) < diffuse <= sum(math.log2(t + 1) for t in range(8)) / 8
    assert machinery.attention_entropy(GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=0)), idx) is None


def test_an_unknown_rung_is_one_line_naming_the_valid_ones():
    proc = run_script("lab.py", "--rungs=bigram,trigram")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: unknown rung 'trigram'; choose from {', '.join(machinery.RUNG_NAMES)}")


@pytest.mark.parametrize("extra, expected", [
    (["--dataset=shakespeare_char"], "dataset folder * not found; create it with `python data/prepare.py --data_dir="),
    (["--prompt=a@b"], "prompt: the text has characters outside the training vocabulary: '@'"),
    (["--prompt=" + "First Citizen:" * 20], "the prompt is 280 tokens, longer than rung bigram's block_size *"),
    (["--budget=0"], "budget must be more than 0 seconds (got 0.0)"),
    (["--rungs=dot,dot"], "a rung is named twice in 'dot,dot'"),
])
def test_mistakes_are_caught_before_any_training(data_dir, tmp_path, extra, expected):
    with pytest.raises(UserError) as caught:
        lab.main(lab_args(data_dir, tmp_path / "lab", *extra))
    head, _, tail = expected.partition("*")
    assert str(caught.value).startswith(head) and tail in str(caught.value)
    assert not (tmp_path / "lab").exists()
