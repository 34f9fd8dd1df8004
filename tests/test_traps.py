"""Traps a user can walk into (issue 18): a subcommand's --help listing another's options, a picture path
matplotlib cannot write, bookkeeping files written through links out of the run folder, a final evaluation
shorter than one block, and input nested too deeply for the parsers."""

import json
import re

import numpy as np
import pytest
import torch

from conftest import assert_one_error_line, check_ok, logged, run_script, train_args
from gptkit.config import parse_config, settings
from gptkit.errors import UserError

RECORDS = [{"kind": "train", "iter": i, "loss": 3.0 - i / 10, "elapsed_s": float(i)} for i in range(0, 20, 5)] + \
          [{"kind": "eval", "iter": 10, "train_loss": 2.5, "val_loss": 2.6, "elapsed_s": 11.0}]


def write_metrics(folder, lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines if lines is not None else map(json.dumps, RECORDS)) + "\n"
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return folder


# ------------------------------------------------------------------------------------- 1: --help per subcommand


def test_each_plot_subcommand_lists_and_takes_only_its_own_options():
    import plot

    listed = {}
    for name, (_, config) in plot.COMMANDS.items():
        proc = check_ok(run_script("plot.py", name, "--help"))
        listed[name] = set(re.findall(r"^  --(\w+)=", proc.stdout, flags=re.M))
        assert listed[name] == set(settings(config)), (name, proc.stdout)
    assert listed["loss"] == {"out_dir", "output", "dpi"}
    assert listed["attention"] == listed["loss"] | {"checkpoint", "start", "device"}
    for key in listed["attention"] - listed["loss"]:  # refused, not silently ignored
        with pytest.raises(UserError, match=f"unknown config key '{key}'"):
            plot.main(["loss", f"--{key}=best"])


# ---------------------------------------------------------------------------------------------- 2: plot.py --output


@pytest.mark.parametrize("output", ["picture.foo", "picture", "picture.png.bak"])
@pytest.mark.parametrize("picture", ["loss", "attention"])
def test_an_output_matplotlib_cannot_write_is_refused_before_any_work(tmp_path, picture, output):
    """The run folder is empty: had the command read metrics or loaded a model first, it would fail on that."""
    proc = run_script("plot.py", picture, f"--out_dir={tmp_path}", f"--output={tmp_path / output}")
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr, "error: output must end in one of *")
    assert {".png", ".pdf", ".svg"} <= set(re.findall(r"\.\w+", line))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("picture", ["loss", "attention"])
def test_an_output_that_is_a_folder_or_under_a_file_is_refused_before_any_work(tmp_path, picture):
    folder = tmp_path / "pictures"
    folder.mkdir()
    (tmp_path / "notes.txt").write_text("mine\n")
    for output, expected in [(folder, f"error: output {folder} is a folder, not a picture file*"),
                             (tmp_path / "notes.txt" / "x.png", f"error: output {tmp_path / 'notes.txt' / 'x.png'} "
                              f"cannot be written: {tmp_path / 'notes.txt'} is a file, not a folder")]:
        proc = run_script("plot.py", picture, f"--out_dir={tmp_path}", f"--output={output}")
        assert proc.returncode == 1
        assert_one_error_line(proc.stderr, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pictures"]  # no pictures.png beside it
    assert list(folder.iterdir()) == [] and (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_folder_at_the_default_picture_path_is_refused(tmp_path):
    (write_metrics(tmp_path) / "loss.png").mkdir()
    proc = run_script("plot.py", "loss", f"--out_dir={tmp_path}")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: output {tmp_path / 'loss.png'} is a folder*")


@pytest.mark.parametrize("output, signature", [("loss.svg", b"<?xml"), ("loss.PDF", b"%PDF")])
def test_the_output_extension_picks_the_format(tmp_path, output, signature):
    proc = check_ok(run_script("plot.py", "loss", f"--out_dir={write_metrics(tmp_path)}",
                               f"--output={tmp_path / output}"))
    assert proc.stdout.strip() == f"wrote {tmp_path / output}"
    assert (tmp_path / output).read_bytes().startswith(signature)


# ---------------------------------------------------------------------------------------------- 3: links


@pytest.fixture
def outside(tmp_path):
    """A file of the user's, outside any run folder, that a link in one points at."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text("precious\n")
    return target


@pytest.mark.parametrize("name", ["run.lock", "metrics.jsonl", "latest.pt.tmp", "best.pt.tmp"])
def test_a_run_refuses_a_bookkeeping_file_that_is_a_link(tmp_path, data_dir, outside, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(outside)
    proc = run_script("train.py", *train_args(data_dir, out, "--max_iters=2", "--eval_interval=1"))
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {out / name} is a link, and a run writes this file itself*")
    assert outside.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == [name]  # refused before anything was written


def test_bookkeeping_writes_never_go_through_a_link(tmp_path, outside):
    """Below the run's check at its start: a link made while it runs is refused too, and never written through."""
    from types import SimpleNamespace

    from gptkit.checkpoint import save_checkpoint
    from gptkit.lab import train_rung
    from gptkit.metrics import RunLog
    from gptkit.rundir import RunDir

    (tmp_path / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(UserError, match="metrics.jsonl is a link"):
        RunLog(tmp_path / "metrics.jsonl").write({"kind": "train", "iter": 1, "loss": 2.0})
    (tmp_path / "best.pt.tmp").symlink_to(outside)
    with pytest.raises(UserError, match="best.pt.tmp is a link"):
        save_checkpoint({"iter_num": 1}, tmp_path / "best.pt")
    rung = tmp_path / "rung"
    rung.mkdir()
    (rung / "train.log").symlink_to(outside)
    with pytest.raises(UserError, match="train.log is a link"):
        train_rung(SimpleNamespace(name="rung"), SimpleNamespace(out_dir=tmp_path), stops=None)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.check_folder = lambda: None  # the link appears after the check
    (run.path / "run.lock").symlink_to(outside)
    with pytest.raises(UserError, match="run.lock is a link"):
        with run.locked():
            pass
    assert outside.read_text() == "precious\n"
    (run.path / "run.lock").unlink()
    del run.check_folder
    with run.locked():  # without the link, the lock is a file of its own
        assert (run.path / "run.lock").read_text().strip().isdigit()


# ---------------------------------------------------------------------------------------------- 4: final_eval_tokens


@pytest.mark.parametrize("max_tokens", [1, 5, 15, 16, 17])
def test_a_final_evaluation_of_fewer_tokens_than_a_block_scores_just_those(tmp_path, max_tokens):
    from gptkit.dataset import Split
    from gptkit.training import evaluate_split
    from model import GPT, GPTConfig

    tokens = np.random.default_rng(0).integers(0, 20, 100).astype(np.uint16)
    (tmp_path / "val.bin").write_bytes(tokens.tobytes())
    split = Split(tmp_path, "val", {"dtype": "uint16", "vocab_size": 20}, 16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=20, n_layer=1, n_head=2, n_embd=16, dropout=0.0)).eval()
    loss, scored = evaluate_split(model, split, torch.autocast("cpu", enabled=False), 4, max_tokens)
    ids = torch.from_numpy(tokens.astype(np.int64))
    losses = []
    with torch.no_grad():  # a plain loop: consecutive blocks of targets, each in the longest window ending with it
        for start in range(0, max_tokens, 16):
            end = min(start + 16, max_tokens)  # targets start+1 .. end
            first = max(0, end - 16)
            logits, _ = model(ids[None, first:end], ids[None, first + 1:end + 1])
            per_token = torch.nn.functional.cross_entropy(logits[0], ids[first + 1:end + 1], reduction="none")
            losses += per_token[start - first:].tolist()
    assert scored == max_tokens == len(losses)
    assert loss == pytest.approx(sum(losses) / max_tokens, rel=1e-5)


def test_train_scores_a_final_eval_shorter_than_a_block(tmp_path, data_dir):
    out = tmp_path / "out"
    proc = check_ok(run_script("train.py", *train_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                                       "--eval_iters=1", "--final_eval_tokens=5")))
    assert "on 5 val tokens" in proc.stdout
    assert list(logged(out, "final", "val_tokens").values()) == [5]


# ---------------------------------------------------------------------------------------------- 5: deep nesting


DEEP = 100_000
DEEP_VALUES = {"parens": "(" * DEEP + "1" + ")" * DEEP, "list": "[" * DEEP + "]" * DEEP,
               "list_within_the_parser": "[" * 150 + "]" * 150, "minus": "-" * DEEP + "1",
               "not": "not " * DEEP + "1", "sum": "1" + "+1" * DEEP}


@pytest.mark.parametrize("value", DEEP_VALUES.values(), ids=DEEP_VALUES)
def test_a_config_file_nested_too_deeply_is_one_error_line(tmp_path, value):
    import plot

    path = tmp_path / "deep.py"
    path.write_text(f"dpi = {value}\n")
    with pytest.raises(UserError) as e:
        plot.main(["loss", str(path)])
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize("key", ["dpi", "output"])
@pytest.mark.parametrize("value", DEEP_VALUES.values(), ids=DEEP_VALUES)
def test_a_command_line_value_nested_too_deeply_is_one_error_line(tmp_path, key, value):
    import plot

    with pytest.raises(UserError) as e:
        plot.main(["loss", f"--out_dir={tmp_path}", f"--{key}={value}"])
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_deep_nesting_through_the_command_itself(tmp_path):
    """As a user meets it: one line on stderr, from a file and from an argument (an argument is at most 128 KiB)."""
    path = tmp_path / "deep.py"
    path.write_text("dpi = " + "-" * DEEP + "1\n")
    for args in ([path], ["--dpi=" + "(" * 60_000 + "1" + ")" * 60_000]):
        proc = run_script("plot.py", "loss", f"--out_dir={tmp_path}", *args)
        assert proc.returncode == 1
        assert len(assert_one_error_line(proc.stderr)) < 400


def test_a_chain_of_presets_too_long_is_one_error_line(tmp_path):
    from gptkit.train_config import TrainConfig

    for i in range(2000):
        (tmp_path / f"c{i}.py").write_text(f"base = 'c{i + 1}.py'\n")
    (tmp_path / "c2000.py").write_text("batch_size = 3\n")
    with pytest.raises(UserError, match="too many bases in a row"):
        parse_config(TrainConfig, [str(tmp_path / "c0.py")])
    (tmp_path / "c50.py").write_text("batch_size = 3\n")  # a chain of 51 is fine
    assert parse_config(TrainConfig, [str(tmp_path / "c0.py")]).batch_size == 3


def test_json_nested_too_deeply_is_one_error_line(tmp_path):
    """The run's and the dataset's JSON files: deep nesting is damage to report, as any other."""
    from gptkit.dataset import load_meta
    from gptkit.metrics import read_metrics

    deep = "[" * DEEP + "]" * DEEP
    write_metrics(tmp_path, [json.dumps(RECORDS[0]), deep])
    with pytest.raises(UserError, match=r"metrics.jsonl has a line nested too deeply to read \(line 2\)"):
        read_metrics(tmp_path)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "meta.json").write_text(deep)
    with pytest.raises(UserError, match=r"meta.json is damaged: not valid JSON"):
        load_meta(tmp_path, "tiny")
