"""What a fine-tune starts from: a run's folder, its model's rows moved to the new vocabulary by character, new
characters fresh; a BPE run's rows kept at their ids and the chat markers' fresh, from GPT-2's BPE to a chat model
that answers; a base of another tokenizer, or a folder without a run, is one line; an interrupted fine-tune
continues to the same weights."""

import dataclasses
import json
import os
import signal

import pytest
import torch

from conftest import CHAT_SFT, MODEL, assert_one_error_line, check_ok, make_text, run_here, train_config
from gptkit.base.errors import RunStopped, UserError
from gptkit.data.conversations import MARKERS
from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
from gptkit.training.starting import base_run, build_model, from_base, load_base, pretrained
from model import GPT, GPTConfig

SHAPE = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, tie_weights=False)


def base_checkpoint(vocab_size, tokenizer):
    """A checkpoint of a fresh tiny model of vocab_size rows, as a base run's: (its dict, its path)."""
    base = GPT(GPTConfig(vocab_size=vocab_size, **SHAPE))
    return {"model": base.state_dict(), "model_args": dataclasses.asdict(base.config), "tokenizer": tokenizer}, \
        "base/best.pt"


def test_the_vocabulary_grows_keeping_each_characters_rows(capsys):
    torch.manual_seed(0)
    ckpt, path = base_checkpoint(3, {"tokenizer": "char", "vocab": "abc"})
    base = ckpt["model"]
    model = GPT(GPTConfig(vocab_size=5, lora_rank=2, **SHAPE))
    fresh = model.transformer.wte.weight[0].clone()
    load_base(model, (ckpt, path), {"tokenizer": "char", "vocab": "+abcd"}, rank=0)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        assert torch.equal(model.state_dict()[key][1:4], base[key])  # 'a', 'b', 'c' moved from ids 0-2 to 1-3
    assert torch.equal(model.transformer.wte.weight[0], fresh)  # '+': as a new model's row
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, base["transformer.h.0.attn.c_attn.weight"])
    assert capsys.readouterr().out.startswith("the vocabulary grows from 3 to 5 tokens: 2 new rows")


@pytest.mark.parametrize("lora_rank, says", [
    (2, "LoRA rank 2: 364 of the model's 3,708 parameters train (9.8%): the adapters on the token table, "
        "attention's q, k, v, the MLP's first matrix and the head; the base model's weights are frozen"),
    (0, "a full fine-tune: all 3,344 of the model's parameters train (lora_rank=R trains adapters of rank R instead"),
])
def test_the_console_says_how_many_parameters_a_fine_tune_trains(lora_rank, says, capsys):
    ckpt, path = base_checkpoint(3, {"tokenizer": "char", "vocab": "abc"})
    cfg = train_config(lora_rank=lora_rank, **SHAPE)
    planned = from_base(cfg, {"tokenizer": "char", "vocab": "abc", "vocab_size": 3}, (ckpt, path))
    build_model(cfg, planned, {"tokenizer": "char", "vocab": "abc", "vocab_size": 3}, base=(ckpt, path))
    assert says in capsys.readouterr().out


BPE = {"tokenizer": "bpe", "tokenizer_sha256": "a" * 64, "vocab_size": 61, "bpe": {}}  # a trained BPE's metadata
CHAT = {"user": 61, "assistant": 62, "end": 63}  # its chat markers: the ids after its 61 tokens


def test_a_bpe_runs_rows_keep_their_ids_and_the_markers_start_fresh_where_its_padding_was(capsys):
    """A run of a trained BPE of 61 tokens (its table padded to 64 rows) fine-tuned on a chat dataset of the same
    BPE: rows 0-60 are the base's; 61-63, the markers, are a new model's, though the base had (untrained) rows
    there."""
    torch.manual_seed(0)
    ckpt, path = base_checkpoint(64, BPE)
    meta = dict(BPE, vocab_size=64, chat=CHAT)
    planned = from_base(train_config(n_layer=1, n_head=2, n_embd=16, block_size=8, tie_weights=False), meta,
                        (ckpt, path))
    assert planned.vocab_size == 64
    model = GPT(planned)
    fresh = {key: model.state_dict()[key].clone() for key in ("transformer.wte.weight", "lm_head.weight")}
    load_base(model, (ckpt, path), meta, rank=0)
    for key, rows in fresh.items():
        assert torch.equal(model.state_dict()[key][:61], ckpt["model"][key][:61])
        assert torch.equal(model.state_dict()[key][61:], rows[61:])
    assert capsys.readouterr().out == (
        "the vocabulary grows from 61 to 64 tokens: 3 new rows in the embedding and the head (<|user|>, "
        "<|assistant|>, <|end|>), each new (the base model's rows 61-63, padding it never trained, start afresh); "
        "the 61 the base model knew keep their rows\n")


@pytest.mark.parametrize("base, dataset, says", [
    ({"tokenizer": "tiktoken", "encoding": "gpt2"}, dict(BPE, vocab_size=64, chat=CHAT),
     "base/best.pt was trained on tiktoken's 'gpt2' tokens, but dataset 'tasks' has a trained BPE of 61 tokens "
     "(aaaaaaaaaaaa) and the chat markers: a fine-tune needs the token ids its base model learned; prepare the "
     "dataset with --tokenizer=gpt2"),
    (BPE, dict(BPE, tokenizer_sha256="b" * 64, vocab_size=64, chat=CHAT),
     "base/best.pt was trained on a trained BPE of 61 tokens (aaaaaaaaaaaa), but dataset 'tasks' has a trained BPE "
     "of 61 tokens (bbbbbbbbbbbb) and the chat markers: a fine-tune needs the token ids its base model learned; a "
     "trained BPE's are its own dataset's (a chat dataset trains its own): start from a run trained char-level or "
     "with --tokenizer=gpt2"),
    ({"tokenizer": "char", "vocab": "abc"}, {"tokenizer": "tiktoken", "encoding": "gpt2", "vocab_size": 50260,
                                             "chat": {"user": 50257, "assistant": 50258, "end": 50259}},
     "base/best.pt was trained on a vocabulary of 3 characters, but dataset 'tasks' has tiktoken's 'gpt2' tokens "
     "and the chat markers: a fine-tune needs the token ids its base model learned; prepare the dataset with "
     "--tokenizer=char"),
])
def test_a_base_tokenized_otherwise_than_the_dataset_is_one_line_naming_both(base, dataset, says):
    ckpt = base_checkpoint(64, base)
    with pytest.raises(UserError) as e:
        from_base(train_config(dataset="tasks", block_size=8), dataset, ckpt)
    assert str(e.value) == says


@pytest.mark.slow
def test_a_gpt2_run_fine_tuned_on_a_gpt2_chat_dataset_answers(tmp_path, tiktoken_cache, capsys):
    """A tiny run on text prepared with --tokenizer=gpt2, fine-tuned on tasks prepared with --tokenizer=gpt2: its
    rows keep their ids, the markers' (50257-50259, padding in its 50,304-row table) start fresh, and chat.py
    answers and scores it. A base of another tokenizer is one line."""
    import train
    from gptkit.data.preparing import PrepareConfig, prepare

    data, text = tmp_path / "data", tmp_path / "text.txt"
    text.write_text(make_text(), encoding="utf-8")
    prepare(PrepareConfig(input=str(text), name="text", tokenizer="gpt2", data_dir=str(data), workers=1))
    prepare(PrepareConfig(synthetic="tasks", tasks="addition", problems=200, heldout=5, mix=str(text),
                          tokenizer="gpt2", data_dir=str(data), workers=1))
    base, chat = tmp_path / "base", tmp_path / "chat"
    train.main([f"--data_dir={data}", "--dataset=text", f"--out_dir={base}", *MODEL, "--block_size=32",
                "--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--timeline=False"])
    capsys.readouterr()
    train.main([f"--init_from={base}", f"--out_dir={chat}", f"--data_dir={data}", *CHAT_SFT])
    assert ("the vocabulary grows from 50257 to 50260 tokens: 3 new rows in the embedding and the head (<|user|>, "
            "<|assistant|>, <|end|>), each new (the base model's rows 50257-50259, padding it never trained, start "
            "afresh); the 50257 the base model knew keep their rows\n") in capsys.readouterr().out
    ckpt = load_checkpoint(chat / "best.pt")
    assert ckpt["tokenizer"] == {"tokenizer": "tiktoken", "encoding": "gpt2",
                                 "chat": {"user": 50257, "assistant": 50258, "end": 50259}}
    assert ckpt["model_args"]["vocab_size"] == 50304
    answer = check_ok(run_here("chat.py", f"--out_dir={chat}", "--prompt=123+456", "--temperature=0",
                               "--max_new_tokens=6")).stdout
    # a marker the model writes before <|end|> is shown by its name, never as its private-use character
    assert "<|end|>" not in answer and not set(answer) & set(MARKERS.values())
    scores = json.loads(check_ok(run_here("chat.py", f"--out_dir={chat}", "--eval", "--limit=2", "--samples=2",
                                          "--json")).stdout)
    assert scores["tasks"]["addition"]["n"] == 2 and scores["text_val_loss"] > 0
    prepare(PrepareConfig(synthetic="tasks", tasks="addition", problems=200, heldout=5, name="char_tasks",
                          data_dir=str(data), workers=1))
    proc = run_here("train.py", f"--init_from={base}", f"--out_dir={tmp_path / 'other'}", f"--data_dir={data}",
                    *CHAT_SFT, "--dataset=char_tasks")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {base / 'best.pt'} was trained on tiktoken's 'gpt2' tokens, but "
                          "dataset 'char_tasks' has a vocabulary of *")


@pytest.mark.parametrize("tied, rank, expected", [
    (True, 4, "base/best.pt's model ties its head to its token table, and LoRA gives each its own adapter: fine-tune "
              "it in full (--lora_rank=0)"),
    (False, 17, "base/best.pt's model: lora_rank 17 is larger than the width n_embd=16: an adapter of full rank is "
                "the matrix itself")])
def test_lora_settings_the_base_model_cannot_take_are_one_line(tied, rank, expected):
    """The config's own checks cannot see these: the model's shape, and so its width and head, is the base's."""
    base = GPT(GPTConfig(vocab_size=3, **dict(SHAPE, tie_weights=tied)))
    ckpt = {"model": base.state_dict(), "model_args": dataclasses.asdict(base.config),
            "tokenizer": {"tokenizer": "char", "vocab": "abc"}}
    with pytest.raises(UserError) as e:
        from_base(train_config(lora_rank=rank, block_size=8), {"tokenizer": "char", "vocab": "abc", "vocab_size": 3},
                  (ckpt, "base/best.pt"))
    assert str(e.value) == expected


@pytest.mark.parametrize("stand_in, rank, says", [
    ([], 100_000, "lora_rank 100000 is larger than the width n_embd=16"),  # the config's width: 768, the default
    (["--n_embd=8", "--n_head=2"], 17, "lora_rank 17 is larger than the width n_embd=16"),
    (["--n_embd=8", "--n_head=2"], 12, None)])  # within the base's width: it trains
def test_a_lora_rank_over_the_configs_width_is_checked_against_the_bases(tmp_path, stand_in, rank, says):
    """The config's n_embd only stands in for a fine-tune's width, its base's: a rank above the stand-in was said to
    be larger than it, whatever the base's width."""
    ckpt, _ = base_checkpoint(3, {"tokenizer": "char", "vocab": "abc"})
    (tmp_path / "base").mkdir()
    save_checkpoint(ckpt, tmp_path / "base" / "best.pt")
    config = tmp_path / "stand_in.py"  # a config file's shape gives way to the base's; the command line's is refused
    config.write_text("".join(f"{arg[2:].replace('=', ' = ')}\n" for arg in stand_in), encoding="utf-8")
    proc = run_here("train.py", str(config), f"--init_from={tmp_path / 'base'}", f"--lora_rank={rank}",
                    f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'nothing'}")
    line = assert_one_error_line(proc.stderr)
    if says:
        assert line == (f"error: {tmp_path / 'base' / 'best.pt'}'s model: {says}: an adapter of full rank is the "
                        "matrix itself")
    else:  # the rank taken: the run goes on to look for its dataset
        assert "dataset folder" in line and "not found" in line


def test_a_model_setting_other_than_the_bases_is_refused_from_the_command_line_and_gives_way_in_a_file(capsys):
    """A fine-tune trains its base's model: --n_layer=2 on a 1-layer base is one line (it trained 1 layer, saying
    nothing); a config file's value, which may be the base run's own before a machine fitted its shape, gives way
    with a note; the dropout a fine-tune may change is taken."""
    ckpt = base_checkpoint(3, {"tokenizer": "char", "vocab": "abc"})
    meta = {"tokenizer": "char", "vocab": "abc", "vocab_size": 3}
    cfg = train_config(**dict(SHAPE, n_layer=2, mlp_act="relu2", dropout=0.1))
    with pytest.raises(UserError) as e:
        from_base(cfg, meta, ckpt, given={"n_layer", "mlp_act", "dropout"}, asked={"n_layer", "dropout"})
    assert str(e.value) == ("--n_layer=2: base/best.pt's model was built with n_layer=1, and a fine-tune trains the "
                            "model it starts from; drop --n_layer, or train a new model with it (--init_from=scratch)")
    planned = from_base(cfg, meta, ckpt, given={"n_layer", "mlp_act", "dropout"}, asked={"dropout"})
    assert (planned.n_layer, planned.mlp_act, planned.dropout) == (1, "gelu", 0.1)
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "note: the config's n_layer=2 gives way to base/best.pt's 1: a fine-tune trains the model it starts from",
        "note: the config's mlp_act='relu2' gives way to base/best.pt's 'gelu': a fine-tune trains the model it "
        "starts from"]


def test_a_lora_base_whose_edited_adapter_no_matrix_computes_is_one_line(monkeypatch):
    import model as model_py

    monkeypatch.setattr(model_py.LoRALinear, "forward", lambda self, x: torch.tanh(x @ self.weight.T))
    base = GPT(GPTConfig(vocab_size=3, lora_rank=2, **SHAPE))
    ckpt = {"model": base.state_dict(), "model_args": dataclasses.asdict(base.config),
            "tokenizer": {"tokenizer": "char", "vocab": "abc"}}
    with pytest.raises(UserError) as e:
        load_base(GPT(GPTConfig(vocab_size=3, **SHAPE)), (ckpt, "base/best.pt"), {"tokenizer": "char", "vocab": "abc"},
                  rank=0)
    assert str(e.value) == ("base/best.pt's LoRA adapters cannot be folded into its matrices to fine-tune from: "
                            "LoRALinear.forward is not a matrix times its input plus the bias, so no plain matrix "
                            "computes it")


def test_a_lora_base_whose_adapters_model_py_names_otherwise_is_one_line(monkeypatch):
    """A base trained with lora_A and lora_B, fine-tuned from after model.py's LoRALinear renamed them A and B."""
    import model as model_py

    base = GPT(GPTConfig(vocab_size=3, lora_rank=2, **SHAPE))
    ckpt = {"model": base.state_dict(), "model_args": dataclasses.asdict(base.config),
            "tokenizer": {"tokenizer": "char", "vocab": "abc"}}
    built = model_py.LoRALinear.__init__

    def init(self, *args):
        built(self, *args)
        self.A, self.B = self.lora_A, self.lora_B
        del self.lora_A, self.lora_B
    monkeypatch.setattr(model_py.LoRALinear, "__init__", init)
    with pytest.raises(UserError) as e:
        load_base(GPT(GPTConfig(vocab_size=3, **SHAPE)), (ckpt, "base/best.pt"), {"tokenizer": "char", "vocab": "abc"},
                  rank=0)
    assert str(e.value).startswith("base/best.pt's LoRA adapters do not fit model.py's LoRA layers (Missing key(s) "
                                   'in state_dict: "A", "B"')


def test_the_console_names_the_layers_a_learners_edit_adapts(monkeypatch, capsys):
    """model.py's linear() edited to adapt every block matrix: the line names the output matrices too."""
    import model as model_py

    plain = model_py.linear
    monkeypatch.setattr(model_py, "linear", lambda config, n_in, n_out, adapted=True: plain(config, n_in, n_out))
    ckpt, path = base_checkpoint(3, {"tokenizer": "char", "vocab": "abc"})
    cfg = train_config(lora_rank=2, **SHAPE)
    meta = {"tokenizer": "char", "vocab": "abc", "vocab_size": 3}
    build_model(cfg, from_base(cfg, meta, (ckpt, path)), meta, base=(ckpt, path))
    assert ("the adapters on the token table, attention's q, k, v, attention's output matrix, the MLP's first "
            "matrix, the MLP's second matrix and the head;") in capsys.readouterr().out


@pytest.mark.parametrize("damage, says", [
    ("nan", "base/best.pt is damaged: non-finite values in transformer.wte.weight of its weights, which no training "
            "run writes"),
    ("a matrix of 3 numbers", "base/best.pt's weights do not fit the model it names (")])
def test_a_base_whose_weights_are_damaged_past_their_checksum_is_one_line(damage, says):
    ckpt, path = base_checkpoint(3, {"tokenizer": "char", "vocab": "abc"})
    weights = ckpt["model"]
    if damage == "nan":
        weights["transformer.wte.weight"][0, 0] = float("nan")
    else:
        weights["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(3)
    with pytest.raises(UserError) as e:
        load_base(GPT(GPTConfig(vocab_size=5, **SHAPE)), (ckpt, path), {"tokenizer": "char", "vocab": "+abcd"}, rank=0)
    assert str(e.value).startswith(says)


def test_init_from_a_folder_without_a_run_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no run"):
        base_run(str(tmp_path / "empty"))


def test_init_from_a_checkpoint_file_names_its_folder_not_a_command_that_would_train_over_it(tmp_path):
    """It said 'no such folder' and suggested `train.py ... --out_dir=out/best.pt`, which a file is in the way of."""
    (tmp_path / "best.pt").write_bytes(b"")
    with pytest.raises(UserError) as e:
        base_run(str(tmp_path / "best.pt"))
    assert str(e.value) == (f"init_from={str(tmp_path / 'best.pt')!r} is a file, not a run's folder: give the folder "
                            f"train.py wrote (--init_from={tmp_path})")
    (tmp_path / "notes").mkdir()  # a file in a folder that holds no run: that folder is no suggestion
    (tmp_path / "notes" / "README.md").write_text("mine")
    with pytest.raises(UserError) as e:
        base_run(str(tmp_path / "notes" / "README.md"))
    assert str(e.value) == (f"init_from={str(tmp_path / 'notes' / 'README.md')!r} is a file, not a run's folder: give "
                            "the folder train.py wrote")


def test_a_base_not_yet_evaluated_says_to_continue_it_not_to_pick_a_checkpoint_train_py_has_no_option_for(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "latest.pt").write_bytes(b"")  # its first evaluation, which writes best.pt, not yet reached
    with pytest.raises(UserError) as e:
        base_run(str(base))
    assert str(e.value) == (f"init_from={str(base)!r} holds no best.pt yet (its run has not finished an evaluation): "
                            f"continue that run to one first, with `python train.py CONFIG --out_dir={base} "
                            "--init_from=auto`, CONFIG being its config file")


def test_a_folder_holding_no_run_stops_train_py_in_one_line(tmp_path, chat_data):
    (tmp_path / "nothing").mkdir()
    proc = run_here("train.py", f"--init_from={tmp_path / 'nothing'}", f"--out_dir={tmp_path / 'out'}",
                    f"--data_dir={chat_data}", *CHAT_SFT)
    assert proc.returncode == 1
    assert "holds no run" in assert_one_error_line(proc.stderr)


@pytest.mark.parametrize("start", ["scratch", "auto"])
def test_lora_on_a_new_model_with_a_tied_head_is_one_line(tmp_path, data_dir, start):
    """A new model ties its head to its token table by default, which LoRA would part: one line, not the
    model's ValueError as a traceback; auto with nothing to continue is a new model too."""
    proc = run_here("train.py", "--lora_rank=4", f"--init_from={start}", f"--out_dir={tmp_path / 'out'}",
                    f"--data_dir={data_dir}", "--dataset=tiny", *MODEL, "--max_iters=2")
    assert proc.returncode == 1
    assert assert_one_error_line(proc.stderr) == (
        "error: lora_rank=4 on a new model: its head is its token table (tie_weights=True), and LoRA gives each its "
        "own adapter; LoRA fine-tunes a trained run (--init_from=OUT), or give --tie_weights=False")
    assert not (tmp_path / "out").exists()


def test_auto_with_no_state_starts_a_fine_tune_from_its_configs_base_not_from_scratch(tmp_path, trained_run, chat_data,
                                                                                      capsys):
    """A fine-tune stopped before its first save, run again with --init_from=auto (as every stopped run is): the
    config file's init_from, its base run, is where it starts, said in a note; not a model of the default shape."""
    import train

    config = tmp_path / "finetune.py"
    config.write_text(f"init_from = {str(trained_run[0])!r}\n", encoding="utf-8")
    out = tmp_path / "out"
    train.main([str(config), "--init_from=auto", f"--out_dir={out}", f"--data_dir={chat_data}", *CHAT_SFT])
    assert (f"note: {out} holds no state to continue; the run starts as its config file says, "
            f"init_from={trained_run[0]}") in capsys.readouterr().out
    base, tuned = load_checkpoint(trained_run[0] / "best.pt"), load_checkpoint(out / "latest.pt")
    assert tuned["model_args"]["n_layer"] == base["model_args"]["n_layer"] == 2
    assert tuned["config"]["init_from"] == str(trained_run[0])


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


def test_lora_on_gpt2_s_weights_is_one_line_before_they_load():
    """GPT-2 ties its head to its token table, which LoRA adapts apart: refused, not trained in full unsaid."""
    cfg = train_config(init_from="gpt2", lora_rank=8)
    with pytest.raises(UserError, match=r"^lora_rank=8 with init_from='gpt2': its head is its token table \(GPT-2's "
                                        r"own are tied\)"):
        pretrained(cfg, {"tokenizer": "tiktoken", "vocab_size": 50257})
