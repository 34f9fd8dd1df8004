"""What a fine-tune starts from: a run's folder, its model's rows moved to the new vocabulary by character, new
characters fresh; a folder without a run is one line; an interrupted fine-tune continues to the same weights."""

import dataclasses
import os
import signal

import pytest
import torch

from conftest import CHAT_SFT, assert_one_error_line, run_here
from gptkit.base.errors import RunStopped, UserError
from gptkit.run.checkpoint import load_checkpoint
from gptkit.training.starting import base_run, load_base
from model import GPT, GPTConfig

SHAPE = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, tie_weights=False)


def test_the_vocabulary_grows_keeping_each_characters_rows(capsys):
    torch.manual_seed(0)
    base = GPT(GPTConfig(vocab_size=3, **SHAPE))
    ckpt = {"model": base.state_dict(), "model_args": dataclasses.asdict(base.config),
            "tokenizer": {"tokenizer": "char", "vocab": "abc"}}
    model = GPT(GPTConfig(vocab_size=5, lora_rank=2, **SHAPE))
    fresh = model.transformer.wte.weight[0].clone()
    load_base(model, (ckpt, "base/best.pt"), {"vocab": "+abcd"}, rank=0)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        new, old = model.state_dict()[key], base.state_dict()[key]
        assert torch.equal(new[1:4], old)  # 'a', 'b', 'c' moved from ids 0-2 to 1-3
    assert torch.equal(model.transformer.wte.weight[0], fresh)  # '+': as a new model's row
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, base.transformer.h[0].attn.c_attn.weight)
    assert capsys.readouterr().out.startswith("the vocabulary grows from 3 to 5 tokens: 2 new rows")


def test_init_from_a_folder_without_a_run_is_one_line(tmp_path):
    from conftest import train_config

    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no run"):
        base_run(train_config(init_from=str(tmp_path / "empty")))


def test_a_folder_holding_no_run_stops_train_py_in_one_line(tmp_path, chat_data):
    (tmp_path / "nothing").mkdir()
    proc = run_here("train.py", f"--init_from={tmp_path / 'nothing'}", f"--out_dir={tmp_path / 'out'}",
                    f"--data_dir={chat_data}", *CHAT_SFT)
    assert proc.returncode == 1
    assert "holds no run" in assert_one_error_line(proc.stderr)


def test_an_interrupted_fine_tune_continues_to_the_same_weights(tmp_path, trained_run, chat_data, chat_run,
                                                               monkeypatch):
    import train
    from gptkit.training.reporting import Reporter

    stepped = Reporter.stepped

    def stopped_at_3(self, iter_num, threads):  # a scheduler's SIGTERM during step 3
        stepped(self, iter_num, threads)
        if iter_num == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Reporter, "stepped", stopped_at_3)
    args = [f"--init_from={trained_run[0]}", f"--out_dir={tmp_path / 'out'}", f"--data_dir={chat_data}", *CHAT_SFT]
    with pytest.raises(RunStopped):
        train.main(args)
    assert load_checkpoint(tmp_path / "out" / "latest.pt")["iter_num"] == 3
    monkeypatch.undo()
    train.main([*args, "--init_from=auto"])
    whole, resumed = load_checkpoint(chat_run / "latest.pt"), load_checkpoint(tmp_path / "out" / "latest.pt")
    assert whole["iter_num"] == resumed["iter_num"] == 6
    for key, value in whole["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
