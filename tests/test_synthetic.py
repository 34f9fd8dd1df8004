"""data/prepare.py --synthetic=repeats (gptkit/data/synthetic.py): the same text for a seed, random lowercase
strings each written twice with their lengths over the whole range, a dataset prepared again as it was, one-line
errors; and config/induction.py, the preset that trains on it."""

import json
import string

import numpy as np
import pytest

from conftest import REPO, assert_one_error_line, check_ok, run_here, run_script
from gptkit.base.errors import UserError
from gptkit.base.settings import parse_config
from gptkit.data import synthetic
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.data.synthetic import REPEATS_LONGEST, REPEATS_SHORTEST, repeats_strings, repeats_text
from gptkit.data.tokenizer import tokenizer_from_meta
from gptkit.training.train_config import TrainConfig

FEW = 300  # strings in the small corpus the prepare tests write in place of the whole one


@pytest.fixture
def few_repeats(monkeypatch):
    """--synthetic=repeats writes FEW strings' pairs, not 150,000; returns that text."""
    monkeypatch.setitem(synthetic.SYNTHETIC, "repeats", lambda cfg: ("repeats.txt", repeats_text(FEW)))
    return repeats_text(FEW)


def test_repeats_are_the_same_text_for_a_seed_and_other_text_for_another():
    assert repeats_text(500) == repeats_text(500)
    assert repeats_text(500, seed=1) != repeats_text(500)
    assert repeats_text(FEW) == repeats_text(500)[:len(repeats_text(FEW))]  # a longer corpus only goes on


def test_each_pair_is_a_string_written_twice_its_length_anywhere_in_the_range():
    strings = list(repeats_strings(2000))
    text, at = repeats_text(2000), 0
    for s in strings:
        assert text[at:at + 2 * len(s)] == s + s
        at += 2 * len(s)
    assert at == len(text) and set(text) == set(string.ascii_lowercase)
    assert {len(s) for s in strings} == set(range(REPEATS_SHORTEST, REPEATS_LONGEST + 1))
    assert any(len(set(s)) < len(s) for s in strings)  # letters drawn independently: some strings repeat one


def test_prepare_writes_data_repeats_and_prepares_it_again_with_the_same_settings(tmp_path, few_repeats):
    cfg = PrepareConfig(synthetic="repeats", data_dir=str(tmp_path), workers=1)
    out_dir, meta = prepare(cfg)
    assert out_dir == tmp_path / "repeats" and meta["vocab"] == string.ascii_lowercase
    assert (out_dir / "repeats.txt").read_text(encoding="utf-8") == few_repeats
    tok = tokenizer_from_meta(meta)
    splits = [np.fromfile(out_dir / f"{split}.bin", dtype=meta["dtype"]).tolist() for split in ("train", "val")]
    assert tok.decode(splits[0]) + tok.decode(splits[1]) == few_repeats
    assert prepare(cfg)[1] == meta
    (out_dir / "repeats.txt").unlink()  # written again, it is still the text the dataset was made of
    assert prepare(cfg)[1] == meta
    assert prepare(PrepareConfig(synthetic="repeats", name="mine", data_dir=str(tmp_path), workers=1))[0] == \
        tmp_path / "mine"


def test_a_file_of_other_text_where_the_corpus_goes_is_refused_and_kept(tmp_path, few_repeats):
    (tmp_path / "repeats").mkdir()
    (tmp_path / "repeats" / "repeats.txt").write_text("the user's own\n", encoding="utf-8")
    with pytest.raises(UserError, match="repeats.txt is not the text --synthetic=repeats writes"):
        prepare(PrepareConfig(synthetic="repeats", data_dir=str(tmp_path), workers=1))
    assert (tmp_path / "repeats" / "repeats.txt").read_text(encoding="utf-8") == "the user's own\n"


@pytest.mark.parametrize("args, expected", [
    (["--synthetic=repeat"], "error: unknown --synthetic=repeat; did you mean 'repeats'? (known: repeats, tasks)"),
    (["--synthetic=shapes"], "error: unknown --synthetic=shapes (known: repeats, tasks)"),
    (["--synthetic=repeats", "--input=my.txt"], "error: --input and --synthetic each name the text to prepare: *"),
])
def test_cli_a_synthetic_corpus_it_cannot_make_is_one_line(tmp_path, args, expected):
    proc = run_here("data/prepare.py", *args, f"--data_dir={tmp_path}")
    assert proc.returncode != 0
    assert_one_error_line(proc.stderr, expected)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_induction_preset_trains_its_own_shape_on_repeats(tmp_path, few_repeats):
    cfg = parse_config(TrainConfig, [str(REPO / "config" / "induction.py")])
    assert (cfg.dataset, cfg.out_dir) == ("repeats", "out-induction")
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.mlp, cfg.model.token_shift) == (2, 1, False, False)
    assert cfg.max_time == 0 and not cfg.fit_shapes and cfg.snapshots == 10
    prepare(PrepareConfig(synthetic="repeats", data_dir=str(tmp_path), workers=1))
    out_dir = tmp_path / "out"
    proc = check_ok(run_script("train.py", "config/induction.py", f"--data_dir={tmp_path}", f"--out_dir={out_dir}",
                               "--max_iters=4", "--eval_interval=2"))
    assert "model: 2 layers × 64," in proc.stdout + proc.stderr
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert any(r.get("kind") == "timeline" and len(r["heads"]["induction"]) == 2 for r in records)


def test_training_on_a_synthetic_corpus_not_yet_prepared_names_the_command_that_makes_it(tmp_path):
    proc = run_here("train.py", "config/induction.py", f"--data_dir={tmp_path}", f"--out_dir={tmp_path / 'out'}")
    assert_one_error_line(proc.stderr, f"error: dataset folder {tmp_path / 'repeats'} not found; create it with "
                                       f"`python data/prepare.py --synthetic=repeats --data_dir={tmp_path}`")
