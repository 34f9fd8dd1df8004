"""GPT-2 interop: logits against transformers, export round trip, BPE data, and a finetune end to end.

    python -m pytest -q tests/test_gpt2.py

Everything runs offline on tiny randomly initialised models; the BPE tests need the r50k_base
tiktoken files at ../shared/data/tiktoken and are skipped without them.
"""

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, check_ok, make_text, run_script, tiny_model
from gptkit.base.errors import UserError
from gptkit.interop.hf import load_pretrained
from model import GPTConfig

TINY_HF = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=100)


def hf_model(tmp_path, seed=0, **overrides):
    """A random GPT2LMHeadModel saved with save_pretrained; returns (folder, model in eval mode)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**dict(TINY_HF, **overrides))).eval()
    with torch.no_grad():  # non-trivial biases and norm gains, so a missed or swapped tensor shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.normal_(0.5 if name.endswith("weight") else 0.0, 0.2)
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    return folder, model


def tokens(n=64, vocab=100, batch=2, seed=1):
    return torch.randint(vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def all_logits(model, idx):
    with torch.no_grad():
        return model(idx, targets=idx)[0]  # targets: logits at every position, not only the last


def hf_logits(model, idx):
    with torch.no_grad():
        return model(idx).logits


# ----------------------------------------------------------------------------- import


@pytest.mark.parametrize("variant", [{}, {"activation_function": "gelu", "tie_word_embeddings": False}],
                         ids=["gpt2", "exact_gelu_untied"])
def test_load_pretrained_matches_transformers(tmp_path, variant):
    folder, hf = hf_model(tmp_path, **variant)
    model = load_pretrained(str(folder)).eval()
    assert model.config.mlp_act == ("gelu" if variant else "gelu_tanh")
    assert model.config.tie_weights == (not variant)
    assert model.config.bias and model.config.block_size == 64 and model.config.vocab_size == 100
    idx = tokens()
    torch.testing.assert_close(all_logits(model, idx), hf_logits(hf, idx), atol=1e-4, rtol=0)


def test_load_pretrained_crops_block_size_and_overrides_dropout(tmp_path):
    folder, hf = hf_model(tmp_path)
    model = load_pretrained(folder, dropout=0.25, block_size=16)
    assert model.config.block_size == 16 and model.transformer.wpe.weight.shape == (16, 32)
    assert model.config.dropout == 0.25
    idx = tokens(16)
    model.train()
    assert not torch.equal(all_logits(model, idx), all_logits(model, idx))  # dropout is on
    model.eval()
    torch.testing.assert_close(all_logits(model, idx), hf_logits(hf, idx), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="block_size"):
        model(tokens(17))
    with pytest.raises(ValueError, match="only dropout and block_size"):
        load_pretrained(folder, n_layer=3)


def test_load_pretrained_refuses_what_it_cannot_load(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(UserError, match="unknown model 'gpt3'"):
        load_pretrained("gpt3")
    with pytest.raises(UserError, match="not a folder"):
        load_pretrained(str(tmp_path / "missing" / "dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="could not load .* as a transformers GPT-2 folder"):
        load_pretrained(str(tmp_path / "empty"))
    folder, _ = hf_model(tmp_path, n_inner=100)
    with pytest.raises(UserError, match="n_inner=100"):
        load_pretrained(str(folder))


@pytest.mark.slow
def test_hub_name_offline_is_one_error_line(tmp_path):
    pytest.importorskip("transformers")
    home = tmp_path / "hf_home"  # an empty cache, and no network
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub")}
    code = ("from gptkit.base.errors import run_main; from gptkit.interop.hf import load_pretrained; "
            "run_main(lambda: load_pretrained('gpt2'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: could not fetch 'gpt2' from the Hugging Face hub (offline?); "
                     "pass a local directory saved with save_pretrained"], proc.stderr


def test_train_checks_data_and_block_size_against_pretrained(tmp_path):
    from gptkit.training.starting import build_model
    from gptkit.training.train_config import TrainConfig

    folder, _ = hf_model(tmp_path)
    cfg = TrainConfig(init_from=str(folder), dataset="tiny", model=GPTConfig(block_size=16, dropout=0.1))
    bpe = {"tokenizer": "tiktoken", "encoding": "gpt2", "vocab_size": 90}
    model = build_model(cfg, None, bpe)
    assert (model.config.block_size, model.config.dropout, model.config.vocab_size) == (16, 0.1, 100)
    with pytest.raises(UserError, match="char-level.*--tokenizer=gpt2"):
        build_model(cfg, None, {"tokenizer": "char", "vocab": "ab", "vocab_size": 2})
    with pytest.raises(UserError, match="50,257 token ids, more than .*100"):
        build_model(cfg, None, dict(bpe, vocab_size=50257))
    with pytest.raises(UserError, match="block_size 1024 is larger than .* 64 positions; pass --block_size=64"):
        build_model(TrainConfig(init_from=str(folder), dataset="tiny"), None, bpe)


def test_model_settings_other_than_gpt2_s_give_way_with_a_note_or_are_refused_on_the_command_line(tmp_path, capsys):
    """The weights bring their shape: a config file's other setting gives way, said in a note; one the command line
    gives is refused in one line, as for a fine-tune of a run, never dropped unsaid."""
    from gptkit.training.starting import build_model
    from gptkit.training.train_config import TrainConfig

    folder, _ = hf_model(tmp_path)
    cfg = TrainConfig(init_from=str(folder), dataset="tiny", model=GPTConfig(block_size=64, n_layer=6, pos_emb="rope"))
    bpe = {"tokenizer": "tiktoken", "encoding": "gpt2", "vocab_size": 90}
    model = build_model(cfg, None, bpe, given={"n_layer", "pos_emb"}, asked=set())
    assert (model.config.n_layer, model.config.pos_emb) == (2, "learned")
    notes = capsys.readouterr().out
    assert f"note: the config's n_layer=6 gives way to {folder}'s 2: a fine-tune trains the model it starts from" \
        in notes and "the config's pos_emb='rope' gives way" in notes
    with pytest.raises(UserError, match=rf"^--n_layer=6: {folder}'s model was built with n_layer=2"):
        build_model(cfg, None, bpe, given={"n_layer"}, asked={"n_layer"})


def test_lora_on_an_untied_gpt2_folder_starts_as_its_model_and_a_tied_one_is_one_line(tmp_path):
    """An untied GPT-2 folder (an export of an untied run, say) takes adapters, B at zero: its logits at the
    start are the folder's; a tied head, which LoRA would part, is refused in one line."""
    from gptkit.training.starting import build_model
    from gptkit.training.train_config import TrainConfig

    folder, hf = hf_model(tmp_path, tie_word_embeddings=False)
    cfg = TrainConfig(init_from=str(folder), dataset="tiny", model=GPTConfig(block_size=64, lora_rank=4))
    bpe = {"tokenizer": "tiktoken", "encoding": "gpt2", "vocab_size": 90}
    model = build_model(cfg, None, bpe).eval()
    assert model.config.lora_rank == 4 and any("lora_" in name for name, _ in model.named_parameters())
    torch.testing.assert_close(all_logits(model, tokens()), hf_logits(hf, tokens()), atol=1e-4, rtol=0)
    tied, _ = hf_model(tmp_path / "tied")
    with pytest.raises(UserError, match=r"^lora_rank=4 with init_from='.*': its head is its token table"):
        build_model(TrainConfig(init_from=str(tied), dataset="tiny", model=GPTConfig(block_size=64, lora_rank=4)),
                    None, bpe)


# ----------------------------------------------------------------------------- export


def save_fake_run(model, out_dir, tokenizer_meta):
    """A best.pt with the keys train.py writes (see TrainState.save_best), without training."""
    from gptkit.run.checkpoint import save_checkpoint
    from gptkit.training.train_config import TrainConfig

    state = {"model": model.state_dict(), "model_args": asdict(model.config), "config": asdict(TrainConfig()),
             "tokenizer": tokenizer_meta, "iter_num": 0, "val_loss": math.inf}
    save_checkpoint(state, out_dir / "best.pt")


CHARS = "".join(chr(c) for c in range(ord("a"), ord("a") + 37))
EXPORTABLE = {
    "gpt2": dict(mlp_act="gelu_tanh"),
    "nobias_exactgelu_untied": dict(bias=False, mlp_act="gelu", tie_weights=False, zero_init_proj=True),
    "relu2": dict(mlp_act="relu2"),
}


@pytest.mark.parametrize("options", EXPORTABLE.values(), ids=EXPORTABLE.keys())
def test_export_round_trip(tmp_path, options, capsys):
    """The exported GPT-2 gives the run's logits, and loads back; a file of the folder it replaces is said."""
    transformers = pytest.importorskip("transformers")
    import export

    model = tiny_model(**{"block_size": 24, "bias": False, **options})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # so a zero bias or a wrong transpose shows
    save_fake_run(model, tmp_path / "out", {"tokenizer": "char", "vocab": CHARS})
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])  # again: its own files replaced
    assert capsys.readouterr().out.split("\n")[1].startswith(
        f"note: replaced {tmp_path / 'hf'}'s config.json, generation_config.json, model.safetensors, an earlier "
        "export's")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.n_positions == 24 and hf.config.tie_word_embeddings == model.config.tie_weights
    idx = tokens(24, vocab=37)
    torch.testing.assert_close(hf_logits(hf, idx), all_logits(model, idx), atol=1e-4, rtol=0)
    back = load_pretrained(tmp_path / "hf").eval()  # and back again
    torch.testing.assert_close(all_logits(back, idx), all_logits(model, idx), atol=1e-4, rtol=0)


def test_export_stopped_while_its_files_go_in_leaves_no_mix_of_two_exports(tmp_path, monkeypatch, capsys):
    """Ctrl-C between two of the export's files going in would leave one model's config.json beside another's
    weights, an export that loads as neither: the files go in together, and the export ends whole."""
    transformers = pytest.importorskip("transformers")
    import signal

    import export

    for name, width in (("old", 32), ("new", 16)):
        save_fake_run(tiny_model(block_size=24, n_embd=width, mlp_act="gelu_tanh"), tmp_path / name,
                      {"tokenizer": "char", "vocab": CHARS})
    export.main([f"--out_dir={tmp_path / 'old'}", f"--hf_dir={tmp_path / 'hf'}"])
    replace, calls = os.replace, []

    def stopped_midway(src, dst):  # Ctrl-C as the second file goes in
        calls.append(dst)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", stopped_midway)
    try:
        export.main([f"--out_dir={tmp_path / 'new'}", f"--hf_dir={tmp_path / 'hf'}"])
    except KeyboardInterrupt:  # stopped, the folder must still hold one export whole: the asserts below say
        pass
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"wrote {tmp_path / 'hf'}: GPT-2 with 2 layers, "
                                                               "4 heads, 16 wide")
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").config.n_embd == 16
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "generation_config.json",
                                                                   "model.safetensors"]


def test_export_stopped_before_its_files_go_in_is_one_line_and_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import signal

    import export
    from gptkit.base.errors import RunStopped

    save_fake_run(tiny_model(block_size=24, mlp_act="gelu_tanh"), tmp_path / "out", {"tokenizer": "char",
                                                                                      "vocab": CHARS})
    (tmp_path / "hf").mkdir()
    earlier = '{"model_type": "gpt2", "exported_by": "nanogpt-cli export.py"}'  # an earlier export's config
    (tmp_path / "hf" / "config.json").write_text(earlier)
    monkeypatch.setattr(os, "fsync", lambda fd: os.kill(os.getpid(), signal.SIGTERM))

    def unheard(signum, frame):  # where the export hears no SIGTERM, its default would end pytest itself
        raise AssertionError("SIGTERM was not taken as a stop")

    outside = signal.signal(signal.SIGTERM, unheard)
    try:
        with pytest.raises(RunStopped, match=f"^stopped by SIGTERM while exporting; {tmp_path / 'hf'} is as it "
                                             "was$"):
            export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    finally:
        signal.signal(signal.SIGTERM, outside)
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["config.json"]  # its aside folder gone too
    assert (tmp_path / "hf" / "config.json").read_text() == earlier


@pytest.mark.parametrize("case", ["a config of the learner's", "weights of no export", "a GPT-2 of the learner's",
                                  "a run's folder", "a dataset's folder"])
def test_export_refuses_files_no_export_wrote_before_reading_anything(tmp_path, case):
    """A config.json of the learner's, weights with no config beside them, a GPT-2 model saved with save_pretrained
    (the folder a fine-tune started from, say), or a run's folder: the export would replace or mix with them. One
    line, and the folder as it was."""
    import export

    save_fake_run(tiny_model(block_size=24, mlp_act="gelu_tanh"), tmp_path / "out", {"tokenizer": "char",
                                                                                      "vocab": CHARS})
    hf = tmp_path / "out" if case == "a run's folder" else tmp_path / "hf"
    hf.mkdir(exist_ok=True)
    if case == "a GPT-2 of the learner's":
        transformers = pytest.importorskip("transformers")
        transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2)).save_pretrained(hf)
    elif case == "a dataset's folder":
        (hf / "meta.json").write_text("{}")
    elif case != "a run's folder":
        (hf / ("config.json" if case == "a config of the learner's" else "model.safetensors")).write_text("mine")
    before = {p.name: p.read_bytes() for p in hf.iterdir() if p.is_file()}
    with pytest.raises(UserError) as caught:
        export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={hf}"])
    replace = "which the export would replace; move them, or export to another --hf_dir"
    assert str(caught.value) == {
        "a config of the learner's": f"{hf} holds config.json of no earlier export, {replace}",
        "weights of no export": f"{hf} holds model.safetensors of no earlier export, {replace}",
        "a GPT-2 of the learner's": f"{hf} holds a GPT-2 model that export.py did not write (saved or downloaded "
                                    f"there), {replace}",
        "a run's folder": f"{hf} is a run's folder (it holds best.pt); export to a folder of its own, e.g. "
                          "--hf_dir=hf",
        "a dataset's folder": f"{hf} is a dataset's folder (it holds meta.json); export to a folder of its own, e.g. "
                              "--hf_dir=hf"}[case]
    assert {p.name: p.read_bytes() for p in hf.iterdir() if p.is_file()} == before


def test_export_clears_the_aside_folder_of_an_export_killed_outright_and_keeps_one_under_way(tmp_path):
    """kill -9 gives an export no time to remove the folder it saves aside in: the next export removes it, but not
    a folder of a process still running (another export, under way)."""
    pytest.importorskip("transformers")
    import subprocess

    import export

    save_fake_run(tiny_model(block_size=24, mlp_act="gelu_tanh"), tmp_path / "out", {"tokenizer": "char",
                                                                                      "vocab": CHARS})
    dead = subprocess.Popen(["true"])  # its number, once it has ended, is no running process
    dead.wait()
    for pid in (dead.pid, os.getpid()):
        (tmp_path / "hf" / f".export-{pid}-abc").mkdir(parents=True)
        (tmp_path / "hf" / f".export-{pid}-abc" / "model.safetensors").write_text("half an export")
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [f".export-{os.getpid()}-abc", "config.json",
                                                                   "generation_config.json", "model.safetensors"]


def test_export_over_a_folder_where_a_file_goes_is_one_line_and_writes_nothing(tmp_path):
    pytest.importorskip("transformers")
    import export

    save_fake_run(tiny_model(block_size=24, mlp_act="gelu_tanh"), tmp_path / "out", {"tokenizer": "char",
                                                                                      "vocab": CHARS})
    (tmp_path / "hf" / "model.safetensors").mkdir(parents=True)
    with pytest.raises(UserError, match=r"hf/model.safetensors is a folder, where the export writes its "
                                        r"model.safetensors; move it out of the way"):
        export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["model.safetensors"]


def test_export_of_a_bpe_run_names_its_end_of_text_token(bpe_data, tmp_path):
    """A run cut into a trained byte-level BPE exports as any other, its <|endoftext|> (the BPE's last id) the
    model's eos and bos, and gives the same logits on a text whose characters its tokens cut."""
    transformers = pytest.importorskip("transformers")
    import export

    tok = bpe_data[2]
    model = tiny_model(block_size=24, vocab_size=tok.vocab_size, **EXPORTABLE["gpt2"])
    save_fake_run(model, tmp_path / "out", tok.to_meta())
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.eos_token_id == hf.config.bos_token_id == tok.eot_token == tok.vocab_size - 1
    idx = torch.tensor([tok.encode("a coin 🪙 and 🎶")])
    torch.testing.assert_close(hf_logits(hf, idx), all_logits(model, idx), atol=1e-4, rtol=0)


def test_export_of_a_model_py_edited_beyond_gpt2_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """An edit no option names (the gelu_tanh activation made SiLU) would be written as plain GPT-2: the exported
    model's logits are checked against the run's."""
    pytest.importorskip("transformers")
    import export
    import model as model_py

    monkeypatch.setitem(model_py.ACTIVATIONS, "gelu_tanh", F.silu)
    save_fake_run(tiny_model(block_size=24, **EXPORTABLE["gpt2"]), tmp_path / "out", {"tokenizer": "char",
                                                                                      "vocab": CHARS})
    with pytest.raises(UserError, match=r"^GPT-2 built from this model's weights computes other logits \(up to "
                                        r"[0-9.e-]+ apart\): its model.py computes something GPT-2's layout has no "
                                        r"place for \(an edit, or an option of its own\); nothing was written$"):
        export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert not (tmp_path / "hf").exists()


def test_export_checks_the_logits_over_the_whole_context(tmp_path, monkeypatch):
    """An edit may change only what the far positions compute (a window on attention, say): checked at a few
    first positions, it would be written as plain GPT-2."""
    pytest.importorskip("transformers")
    import export
    import model as model_py

    head = model_py.GPT.head

    def far_edited(self, x):  # the logits past the 20th position moved, as a window of 20 would move them
        logits = head(self, x)
        return torch.cat([logits[:, :20], logits[:, 20:] + 1.0], dim=1)

    monkeypatch.setattr(model_py.GPT, "head", far_edited)
    save_fake_run(tiny_model(block_size=24, **EXPORTABLE["gpt2"]), tmp_path / "out", {"tokenizer": "char",
                                                                                      "vocab": CHARS})
    with pytest.raises(UserError, match=r"^GPT-2 built from this model's weights computes other logits \(up to 1"):
        export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert not (tmp_path / "hf").exists()


def with_mlp_edited(monkeypatch, width=None, extra=False, renamed=False):
    """model.py's MLP as a learner might edit it: its hidden width `width` x n_embd (an option of their own, say),
    with a learned scale of its output (extra), or its first matrix renamed fc_in: the last two GPT-2 has no
    place for."""
    import model as model_py

    built = model_py.MLP.__init__

    def init(self, config):
        built(self, config)
        if width:
            self.c_fc = model_py.linear(config, config.n_embd, width * config.n_embd)
            self.c_proj = model_py.linear(config, width * config.n_embd, config.n_embd, adapted=False)
        if extra:
            self.scale = torch.nn.Parameter(torch.ones(()))
        if renamed:
            self.fc_in = self.c_fc
            del self.c_fc

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.fc_in(x))))
    monkeypatch.setattr(model_py.MLP, "__init__", init)
    if renamed:
        monkeypatch.setattr(model_py.MLP, "forward", forward)


def test_export_writes_a_mlp_width_of_the_learners_own_as_gpt2s_n_inner(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    import export

    with_mlp_edited(monkeypatch, width=2)
    model = tiny_model(block_size=24, **EXPORTABLE["gpt2"])
    save_fake_run(model, tmp_path / "out", {"tokenizer": "char", "vocab": CHARS})
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.n_inner == 2 * model.config.n_embd
    idx = tokens(24, vocab=37)
    torch.testing.assert_close(hf_logits(hf, idx), all_logits(model, idx), atol=1e-4, rtol=0)


@pytest.mark.parametrize("edit, found", [
    (dict(extra=True), r'Unexpected key\(s\) in state_dict: "transformer.h.0.mlp.scale", .*'),
    (dict(renamed=True), r"it has no transformer.h.0.mlp.c_fc.weight")])
def test_export_of_a_model_with_weights_gpt2_has_no_place_for_is_one_line_and_writes_nothing(tmp_path, monkeypatch,
                                                                                               edit, found):
    """A weight GPT-2 lacks (a learned scale), or one it needs named otherwise (the MLP's first matrix renamed)."""
    pytest.importorskip("transformers")
    import export

    with_mlp_edited(monkeypatch, **edit)
    save_fake_run(tiny_model(block_size=24, **EXPORTABLE["gpt2"], bias=False), tmp_path / "out",
                  {"tokenizer": "char", "vocab": CHARS})
    with pytest.raises(UserError, match=rf"^GPT-2 has no place for this model's weights \({found}\): its model.py "
                                        r"builds something GPT-2's layout does not hold \(an edit, or an option of "
                                        r"its own\); nothing was written$"):
        export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_export_refuses_incompatible_model(tmp_path):
    model = tiny_model(n_layer=1, n_head=2, n_embd=16, bias=False, pos_emb="rope")
    save_fake_run(model, tmp_path / "out", {"tokenizer": "char", "vocab": CHARS})
    proc = run_script("export.py", f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "pos_emb='rope'" in lines[0], proc.stderr
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("option", [dict(norm="rmsnorm"), dict(qk_norm=True), dict(logit_softcap=30.0),
                                    dict(pos_emb="none"), dict(attention="dot"), dict(causal=False), dict(mlp=False),
                                    dict(token_shift=True), dict(lora_rank=4, tie_weights=False)],
                         ids=["rmsnorm", "qk_norm", "softcap", "no_positions", "dot", "encoder", "no_mlp",
                              "token_shift", "lora_kept"])
def test_export_names_the_option_it_cannot_represent(option):
    from gptkit.interop.hf import check_exportable

    name = next(iter(option))
    with pytest.raises(UserError, match=f"cannot be exported as GPT-2: {name}="):
        check_exportable(GPTConfig(**option))


# ----------------------------------------------------------------------------- BPE data and finetuning


def test_bpe_prepare_round_trip(tmp_path, tiktoken_cache):
    import numpy as np
    import tiktoken

    from gptkit.data.preparing import PrepareConfig, prepare
    from gptkit.data.tokenizer import make_tokenizer, tokenizer_from_meta

    enc = tiktoken.get_encoding("r50k_base")
    docs = [make_text(3000, seed=s) for s in range(3)]
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, doc in enumerate(docs):
        (folder / f"{i}.txt").write_text(doc, encoding="utf-8")
    out_dir, meta = prepare(PrepareConfig(input=str(folder), name="bpe", tokenizer="gpt2",
                                          data_dir=str(tmp_path / "data")))
    assert (meta["tokenizer"], meta["encoding"], meta["vocab_size"], meta["dtype"]) == \
        ("tiktoken", "gpt2", 50257, "uint16")
    train, val = (np.fromfile(out_dir / f"{s}.bin", dtype=np.uint16).tolist() for s in ("train", "val"))
    expected = [t for doc in docs for t in enc.encode_ordinary(doc) + [enc.eot_token]]
    assert train + val == expected  # documents in sorted order, each followed by <|endoftext|>
    assert len(train) == int(len(expected) * 0.9)
    tok = tokenizer_from_meta(meta)
    assert tok.decode(train + val) == "<|endoftext|>".join(docs) + "<|endoftext|>"
    r50k = make_tokenizer("r50k_base")
    assert r50k.encode(docs[0]) == tok.encode(docs[0]) and r50k.decode(tok.encode(docs[0])) == docs[0]


@pytest.mark.slow
def test_finetune_sample_export_end_to_end(tmp_path, tiktoken_cache):
    transformers = pytest.importorskip("transformers")
    from gptkit.data.preparing import PrepareConfig, prepare
    from gptkit.run.checkpoint import load_checkpoint
    from gptkit.run.run_folder import load_model

    folder, _ = hf_model(tmp_path, n_layer=1, vocab_size=50257)
    text = tmp_path / "input.txt"
    text.write_text(make_text(6000), encoding="utf-8")
    prepare(PrepareConfig(input=str(text), name="bpe", tokenizer="r50k_base", data_dir=str(tmp_path / "data")))
    out = tmp_path / "out"
    check_ok(run_script("train.py", f"--init_from={folder}", f"--data_dir={tmp_path / 'data'}", "--dataset=bpe",
                        f"--out_dir={out}", "--device=cpu", "--dtype=float32", "--batch_size=2",
                        "--block_size=32", "--max_iters=2", "--eval_interval=2", "--eval_iters=1",
                        "--log_interval=1", "--warmup_iters=0", "--learning_rate=1e-3", env=tiktoken_cache))
    ckpt = load_checkpoint(out / "latest.pt")
    assert ckpt["tokenizer"] == {"tokenizer": "tiktoken", "encoding": "r50k_base"}
    assert ckpt["iter_num"] == 2
    assert (ckpt["model_args"]["block_size"], ckpt["model_args"]["vocab_size"], ckpt["model_args"]["mlp_act"]) \
        == (32, 50257, "gelu_tanh")

    proc = check_ok(run_script("sample.py", f"--out_dir={out}", "--start=ROMEO:", "--num_samples=1",
                               "--max_new_tokens=12", "--device=cpu", env=tiktoken_cache))
    assert proc.stdout.startswith("ROMEO:") and len(proc.stdout.split("---------------")[0]) > len("ROMEO:")

    check_ok(run_script("export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf_out'}", env=tiktoken_cache))
    config = json.loads((tmp_path / "hf_out" / "config.json").read_text())
    assert (config["eos_token_id"], config["activation_function"], config["n_positions"]) == (50256, "gelu_new", 32)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf_out").eval()
    model, _ = load_model(out, "cpu")
    idx = tokens(32, vocab=50257)
    torch.testing.assert_close(hf_logits(hf, idx), all_logits(model, idx), atol=1e-4, rtol=0)


def test_a_learners_activation_named_as_one_of_transformers_exports_under_that_name():
    """mlp_act='silu', a value a learner added to model.py: transformers has an activation of that name, so the
    export writes it (the export's logit check tells a function of theirs that differs); one it has not is one
    line naming those it can take."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from gptkit.interop.hf import ACT_TO_HF, gpt2_refusal, hf_config_args
    from model import GPTConfig

    silu = SimpleNamespace(**dict(asdict(GPTConfig(vocab_size=37)), mlp_act="silu"))
    assert gpt2_refusal(silu, ACT_TO_HF) is None and hf_config_args(silu)["activation_function"] == "silu"
    swiglu = SimpleNamespace(**dict(asdict(GPTConfig(vocab_size=37)), mlp_act="swiglu"))
    assert gpt2_refusal(swiglu, ACT_TO_HF).startswith("mlp_act='swiglu' (supported: gelu_tanh, gelu, relu2, relu, silu")
