"""One checkpoint file (gptkit/run/checkpoint.py): a flipped byte anywhere is named and refused, a field of the wrong
kind is named on load, a hostile file is refused without running it, a file of an earlier version still loads,
and a save is atomic: a full disk, a failed rename, SIGKILL or Ctrl-C in the middle of a write leave the previous
checkpoint whole and no .tmp behind, and a save never writes through a link."""

import errno
import hashlib
import io
import os
import pickle
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import sample
import train
from conftest import REPO, assert_one_error_line, run_here, run_script, train_args
from gptkit.base import files as base_files  # files() below lists a folder
from gptkit.base.errors import RunStopped, UserError
from gptkit.explorer.runs import summarize
from gptkit.run import checkpoint
from gptkit.run.checkpoint import (HEADER_SIZE, MODEL_KEYS, TRAINING_KEYS, HashingWriter, load_checkpoint,
                                   save_checkpoint)
from gptkit.run.run_folder import RunDir
from gptkit.training.resume import resume_state


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(folder):
    """Every file's bytes but run.lock's, which holds the process id of the last run to start there."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "run.lock"}


# ---------------------------------------------------------------------------------------------- integrity

def parts(data):
    """{part: (start, end)} byte ranges of a checkpoint file: its header line, and in the zip torch.save wrote,
    the first and last entries' local headers (with their alignment padding) and data, the central
    directory and the end records."""
    payload = data[HEADER_SIZE:]
    entries = zipfile.ZipFile(io.BytesIO(payload)).infolist()
    out = {"header line": (0, HEADER_SIZE)}
    for label, entry in [("first", entries[0]), ("last", entries[-1])]:
        start = HEADER_SIZE + entry.header_offset
        name_len, extra_len = struct.unpack("<HH", payload[entry.header_offset + 26:entry.header_offset + 30])
        data_start = start + 30 + name_len + extra_len
        out[f"{label} local header and padding"] = (start, data_start)
        out[f"{label} entry's data"] = (data_start, data_start + entry.compress_size)
    end_records = HEADER_SIZE + max(payload.rfind(b"PK\x06\x06"), payload.rfind(b"PK\x05\x06"))
    central = HEADER_SIZE + struct.unpack("<I", payload[payload.rfind(b"PK\x05\x06") + 16:][:4])[0]
    if central == HEADER_SIZE + 0xFFFFFFFF:  # zip64: the offset lives in the zip64 end record
        central = HEADER_SIZE + struct.unpack("<Q", payload[payload.rfind(b"PK\x06\x06") + 48:][:8])[0]
    out["central directory"] = (central, end_records)
    out["end records"] = (end_records, len(data))
    return out


def test_a_checkpoint_written_before_hook_points_and_kernels_samples_the_same_text(tmp_path, capsys):
    """tests/data/written_before_hooks/best.pt was trained by the model file as it stood before hook points and
    gptkit/machine/stand_ins.py (2 layers, rotary, QK-norm, ReLU^2, token shift); its sample is the text that code
    wrote."""
    shutil.copytree(Path(__file__).parent / "data" / "written_before_hooks", tmp_path / "run")
    sample.main([f"--out_dir={tmp_path / 'run'}", "--device=cpu", "--dtype=float32", "--num_samples=1",
                 "--max_new_tokens=80", "--seed=7", "--start=ROMEO:"])
    assert capsys.readouterr().out == ("ROMEO:\nThe ver ca2 the foul srod. 1t an e. 52 thom!. kner crs.\n\nROMEO:\n"
                                       "The mergy watse\n---------------\n")


@pytest.mark.parametrize("name", ["latest.pt", "best.pt"])
def test_a_flipped_byte_anywhere_is_caught_on_load(trained_run, tmp_path, name):
    """Every byte of the header line, and 40 random offsets in each part of the zip, each flipped to a random
    other value; then truncations and appended bytes: every one is refused with one line naming the file."""
    data = (trained_run[0] / name).read_bytes()
    rng = random.Random(12)
    cases = []
    for part, (start, end) in parts(data).items():
        assert start < end, part
        offsets = range(start, end) if part == "header line" else [rng.randrange(start, end) for _ in range(40)]
        for offset in offsets:
            damaged = bytearray(data)
            damaged[offset] ^= rng.randrange(1, 256)
            cases.append((f"{part}, byte {offset}", bytes(damaged)))
    cuts = [0, 1, HEADER_SIZE - 1, HEADER_SIZE, *rng.sample(range(len(data)), 20)]
    cases += [(f"cut at {n}", data[:n]) for n in cuts]
    cases += [("appended", data + b"\0"), ("appended a line", data + b"more\n")]
    path = tmp_path / name
    for label, damaged in cases:
        path.write_bytes(damaged)
        with pytest.raises(UserError) as info:
            load_checkpoint(path)
        message = str(info.value)
        assert message.startswith(str(path)) and "\n" not in message, (label, message)
        assert "damaged" in message, (label, message)
    path.write_bytes(data)
    assert load_checkpoint(path)["iter_num"] > 0  # the undamaged bytes load


def test_a_checkpoint_without_a_checksum_still_loads(run, data_dir, capsys):
    """An earlier version's single ckpt.pt (torch.save's zip alone): sampled and resumed as before."""
    payload = (run / "latest.pt").read_bytes()[HEADER_SIZE:]
    old = run.parent / "old"
    old.mkdir()
    (old / "ckpt.pt").write_bytes(payload)
    sample.main([f"--out_dir={old}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5"])
    train.main([f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={old}", "--init_from=auto", "--max_iters=35"])
    assert load_checkpoint(old / "latest.pt")["iter_num"] == 35 and digest(old / "ckpt.pt") == hashlib.sha256(
        payload).hexdigest()


# ---------------------------------------------------------------------------------------------- checkpoint fields

DELETE = object()


def rewrite(path, where, value):
    """Rewrite a checkpoint with the field at `where` (keys and list indices, outermost first) set to value, or
    deleted, through save_checkpoint: its checksum is right, only the field is wrong."""
    ckpt = load_checkpoint(path)
    del ckpt["format_version"]
    *outer, last = where
    holder = ckpt
    for key in outer:
        holder = holder[key]
    if value is DELETE:
        del holder[last]
    else:
        holder[last] = value
    save_checkpoint(ckpt, path)


def first_weight(path):
    return next(iter(load_checkpoint(path)["model"]))


# (the field, the value written there, what the error line says of it)
DAMAGE = {
    "best_val_loss a string": (("best_val_loss",), "x", "best_val_loss is 'x', not a loss (a number of at least 0)"),
    "best_val_loss NaN": (("best_val_loss",), float("nan"), "best_val_loss is nan, not a loss (a number of at least 0)"),
    "best_val_loss a bool": (("best_val_loss",), True, "best_val_loss is True, not a loss (a number of at least 0)"),
    "iter_num a float": (("iter_num",), 2.5, "iter_num is 2.5, not a whole number of at least 0"),
    "iter_num negative": (("iter_num",), -1, "iter_num is -1, not a whole number of at least 0"),
    "vocabulary not a string": (("tokenizer", "vocab"), 65, "tokenizer.vocab is 65, not a string"),
    "vocabulary missing": (("tokenizer", "vocab"), DELETE, "tokenizer has no vocab"),
    "tokenizer unknown": (("tokenizer", "tokenizer"), "sentencepiece",
                          "tokenizer.tokenizer is 'sentencepiece', not 'char' or 'tiktoken' or 'bpe'"),
    "tokenizer not a dict": (("tokenizer",), "char", "tokenizer is 'char', not a dict"),
    "model_args not a dict": (("model_args",), [1, 2], "model_args is a list, not a dict"),
    "a model setting of another type": (("model_args", "n_layer"), "2",
                                        "model_args.n_layer is '2', not a whole number"),
    "a model flag not a bool": (("model_args", "bias"), 1, "model_args.bias is 1, not True or False"),
    "weights not a dict": (("model",), 3, "model is 3, not a dict"),
    "a weight not a tensor": (("model", "FIRST"), [0.5], "model['FIRST'] is a list, not a tensor"),
    "optimizer not a list": (("optimizer",), {"state": {}}, "optimizer is a dict, not a list"),
    "optimizer empty": (("optimizer",), [], "optimizer is empty"),  # read as 'a different optimizer' before
    "optimizer state not a dict": (("optimizer", 0, "state"), 5, "optimizer[0].state is 5, not a dict"),
    "scaler not a dict": (("scaler",), None, "scaler is None, not a dict"),
    "config not a dict": (("config",), "x", "config is 'x', not a dict"),
    "rng not a list": (("rng",), 5, "rng is 5, not a list"),
    "python random state": (("rng", 0, "python"), (3, (1, 2), None),
                            "rng[0].python is a tuple, not a Python random state"),
    "numpy random state": (("rng", 0, "numpy"), ["MT19937"], "rng[0].numpy is a list, not a numpy random state"),
    "torch random state": (("rng", 0, "torch"), torch.zeros(3), "rng[0].torch is a tensor, not a torch random state"),
    "sampler state missing": (("rng", 0, "sampler", "generator"), DELETE, "rng[0].sampler has no generator"),
    "seconds_spent a string": (("seconds_spent",), "12", "seconds_spent is '12', not a number"),
    "measured not a dict": (("measured",), "float32", "measured is 'float32', not a dict"),
    "wandb_id a number": (("wandb_id",), 7, "wandb_id is 7, not a string or None"),
    "rng empty": (("rng",), [], "rng is empty"),
    "an attention path of no kernel": (("measured", "attention_path"), "warp",
                                       "measured.attention_path is 'warp', not one of fused, written, folded"),
    "a dtype of none": (("measured", "dtype"), "int8", "measured.dtype is 'int8', not one of float32, bfloat16, "
                                                       "float16"),
    "a plan without its idle time": (("measured", "planned"), {"steps": 30, "step": 0.1, "eval": 0.5, "final": 1.0},
                                     "measured.planned has no idle_seconds"),
    "a plan of steps taking no time": (("measured", "planned"), {"steps": 30, "step": 0, "eval": 0.5, "final": 1.0,
                                                                 "idle_seconds": 9.0},
                                       "measured.planned.step is 0, not a number above 0"),
    "a best loss below 0": (("best_val_loss",), -1.0, "best_val_loss is -1.0, not a loss (a number of at least 0)"),
    "a score stop of another kind": (("stopped_by_score",), [1, 2], "stopped_by_score is a list, not None or "
                                                                     "{'task', 'pass_at_1', 'iter'}"),
}


def damage(path, case):
    """Write one DAMAGE case into the checkpoint at path; the problem its error line names."""
    where, value, problem = DAMAGE[case]
    if "FIRST" in where:
        name = first_weight(path)
        where, problem = tuple(name if k == "FIRST" else k for k in where), problem.replace("FIRST", name)
    rewrite(path, where, value)
    return problem


@pytest.mark.parametrize("case", ["edited", "missing"])
def test_a_trained_tokenizer_damaged_in_a_checkpoint_is_one_line(bpe_trained_run, tmp_path, case):
    """The checkpoint carries its trained BPE whole: sampled from, it is checked against its checksum."""
    shutil.copytree(bpe_trained_run, tmp_path / "run")
    path = tmp_path / "run" / "best.pt"
    merges = load_checkpoint(path)["tokenizer"]["bpe"]["merges"]
    rewrite(path, ("tokenizer", "bpe") if case == "missing" else ("tokenizer", "bpe", "merges"),
            DELETE if case == "missing" else [[32, 32]] + merges[1:])
    proc = run_script("sample.py", f"--out_dir={tmp_path / 'run'}", "--num_samples=1", "--max_new_tokens=5")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {path} is damaged: tokenizer has no bpe; the run's latest state may "
                                       "still load: --checkpoint=latest" if case == "missing" else
                          "error: the checkpoint's tokenizer is damaged or was edited: it does not match its checksum*")


@pytest.mark.parametrize("case", DAMAGE)
def test_a_field_of_the_wrong_kind_is_named_on_load(run, case):
    """Every field a resume reads, broken in turn, in a file whose checksum is right: refused with one line
    naming the file and the field. Loaded for sampling, the file is refused too where the field is one
    sampling reads, and loads where it is not."""
    path = run / "latest.pt"
    problem = damage(path, case)
    with pytest.raises(UserError) as info:
        load_checkpoint(path, required=TRAINING_KEYS)
    assert str(info.value) == f"{path} is damaged: {problem}"
    if DAMAGE[case][0][0] in MODEL_KEYS:
        with pytest.raises(UserError, match="is damaged: "):
            load_checkpoint(path, required=MODEL_KEYS)
    else:  # a field sample.py never reads does not stop it
        load_checkpoint(path, required=MODEL_KEYS)


def test_a_saved_setting_that_may_be_none_is_of_its_type_or_none():
    """A config field annotated `X | None` or Optional[X] (a learner's new model option) is checked as an X that may
    be None, not left unchecked."""
    from test_settings import Window

    kinds = checkpoint.settings(Window)
    assert [kinds.problem({"window": value, "flag": None}, "") for value in (16, None)] == [None, None]
    assert kinds.problem({"window": "16"}, "model_args") == "model_args.window is '16', not a whole number or None"
    assert kinds.problem({"scale": True}, "") == "scale is True, not a number or None"


def test_a_tokenizer_with_more_tokens_than_the_model_has_ids_is_one_line(run):
    """Its tokens past the model's table would fail deep in the first forward pass of every tool."""
    from gptkit.run.run_folder import model_at

    path = run / "best.pt"
    vocab = load_checkpoint(path)["tokenizer"]["vocab"]
    rewrite(path, ("tokenizer", "vocab"), vocab + "".join(chr(0x4E00 + i) for i in range(len(vocab))))
    with pytest.raises(UserError, match=rf"^{path} is damaged: its tokenizer has {2 * len(vocab)} tokens, its model "
                                        rf"{len(vocab)} token ids$"):
        model_at(path)


@pytest.mark.parametrize("setting, value", [("n_layer", 10 ** 9), ("n_embd", 2 ** 40)])
def test_settings_asking_for_another_model_than_the_weights_hold_are_one_line_before_it_is_built(run, data_dir,
                                                                                                   setting, value):
    """Built first, a billion blocks took hours and a width of 2**40 all the memory there is: for sampling, and for
    a resume whose command line names no shape (the checkpoint's is the one it continues)."""
    from gptkit.run.run_folder import model_at

    for name in ("best.pt", "latest.pt"):
        held = load_checkpoint(run / name)["model_args"][setting]
        rewrite(run / name, ("model_args", setting), value)
    line = f"{run / 'best.pt'}'s weights do not fit its model settings: {setting}={value}, its weights {held}"
    with pytest.raises(UserError, match=f"^{re.escape(line)}$"):
        model_at(run / "best.pt")
    proc = run_script("train.py", f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={run}", "--device=cpu",
                      "--init_from=auto", "--max_iters=40", timeout=60)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {line.replace('best.pt', 'latest.pt')}")


def test_every_checkpoint_a_run_writes_passes_its_checks(run):
    for name in ("latest.pt", "latest.prev.pt"):
        load_checkpoint(run / name, required=TRAINING_KEYS)
    load_checkpoint(run / "best.pt", required=MODEL_KEYS)


def test_a_model_setting_no_model_takes_is_one_line_naming_the_file_to_every_reader(run):
    """A model setting of the right type but among no choice of its own (the schema checks types): sample.py,
    and the explorer's list of runs, each say it in one line naming the file."""
    path = run / "best.pt"
    rewrite(path, ("model_args", "pos_emb"), "bogus")
    line = (f"{path} was written with model settings this version cannot build (pos_emb must be one of learned, "
            "rope, none (got 'bogus'))")
    proc = run_script("sample.py", f"--out_dir={run}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {line}")
    # the explorer names the file from the folder it serves, never the server's path
    assert summarize("run", run).error == line.replace(str(path), "run/best.pt")


@pytest.mark.parametrize("edit", [None, "twice the update", "the update through tanh"])
def test_a_lora_checkpoint_loads_as_a_plain_model_with_its_adapters_merged(edit, monkeypatch, capsys):
    """Every reader of a trained model (sample.py, analyze.py, export.py, the explorer) builds it with
    model_from_checkpoint: a LoRA run's comes back a plain model, its adapters folded into its matrices, computing
    the same logits, LoRALinear.forward as the learner wrote it; one no matrix computes keeps its adapters, with
    a note."""
    from dataclasses import asdict

    import model as model_py
    from model import GPT, GPTConfig

    def edited(self, x):
        update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        return F.linear(x, self.weight, self.bias) + self.scale * (2 * update if edit == "twice the update" else
                                                                   torch.tanh(update))

    if edit:
        monkeypatch.setattr(model_py.LoRALinear, "forward", edited)
    torch.manual_seed(0)
    adapted = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=50, block_size=16, lora_rank=4,
                               tie_weights=False)).eval()
    with torch.no_grad():  # B starts at zero: drawn, the adapters change the output
        for name, p in adapted.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.05)
    ckpt = {"model": adapted.state_dict(), "model_args": asdict(adapted.config)}
    model = checkpoint.model_from_checkpoint(ckpt, "lora.pt").eval()
    kept = edit == "the update through tanh"
    assert capsys.readouterr().out == ("note: lora.pt's LoRA adapters stay beside their matrices: LoRALinear.forward "
                                       "is not a matrix times its input plus the bias, so no plain matrix computes "
                                       "it\n" if kept else "")
    assert (model.config.lora_rank == 0) != kept and any("lora" in name for name in model.state_dict()) == kept
    assert kept or all(p.requires_grad for p in model.parameters())
    idx = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = adapted(idx, idx)[0]
        torch.testing.assert_close(model(idx, idx)[0], want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_weights_holding_nan_are_one_line_for_every_reader():
    """A checkpoint whose checksum is right but whose weights hold NaN (written by hand, or damaged before it was
    summed): sample.py, chat.py, analyze.py, export.py and the explorer load through model_from_checkpoint."""
    from dataclasses import asdict

    from model import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=20, block_size=8, tie_weights=False))
    weights = model.state_dict()
    weights["lm_head.weight"][3, 1] = float("inf")
    with pytest.raises(UserError) as e:
        checkpoint.model_from_checkpoint({"model": weights, "model_args": asdict(model.config)}, "x.pt")
    assert str(e.value) == ("x.pt is damaged: non-finite values in lm_head.weight of its weights, which no training "
                            "run writes")


class RunsCode:
    """Unpickling this runs a shell command: what a hostile 'checkpoint' would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("form", ["torch.save", "with a valid checksum", "plain pickle"])
def test_hostile_checkpoint_is_refused_without_running_it(tmp_path, data_dir, form):
    """Neither sampling nor resuming runs a crafted checkpoint. A checksum proves a file undamaged, not harmless:
    one written by someone else with a correct header is still loaded with weights_only and refused."""
    out, marker = tmp_path / "out", tmp_path / "MARKER"
    out.mkdir()
    state = {"format_version": 1, "model": RunsCode(marker), "iter_num": 0}
    if form == "plain pickle":
        with open(out / "ckpt.pt", "wb") as f:
            pickle.dump(state, f)
    else:
        torch.save(state, out / "ckpt.pt")
    if form == "with a valid checksum":
        payload = (out / "ckpt.pt").read_bytes()
        (out / "ckpt.pt").write_bytes(checkpoint.HEADER % (hashlib.sha256(payload).hexdigest().encode(), len(payload))
                                      + payload)
    for command in [lambda: sample.main([f"--out_dir={out}", "--device=cpu"]),
                    lambda: train.main(train_args(data_dir, out, "--init_from=resume", "--max_iters=2"))]:
        with pytest.raises(UserError) as info:
            command()
        if form == "plain pickle":  # not a zip, not a header: not read any further
            assert str(info.value) == f"{out / 'ckpt.pt'} is damaged or not a checkpoint (it does not begin with " \
                                      "a checkpoint header)"
        else:
            assert str(info.value).startswith(f"refusing to load {out / 'ckpt.pt'}: it holds objects other than "
                                              "tensors") and "GLOBAL posix.system" in str(info.value)  # names it
        assert not marker.exists(), "the checkpoint ran code"
    with open(out / "ckpt.pt", "rb") as f:  # proof the file is hostile: plain unpickling runs it
        try:
            pickle.load(f) if form == "plain pickle" else torch.load(checkpoint.Payload(
                f, checkpoint.HEADER_SIZE if form == "with a valid checksum" else 0), weights_only=False)
        except Exception:
            pass
    assert marker.exists()


# ---------------------------------------------------------------------------------------------- atomic writes

def full_disk_file(limit):
    class Full(io.FileIO):
        def write(self, data):
            if self.tell() + len(data) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)
    return Full


@pytest.mark.parametrize("fault", ["write", "fsync", "replace"])
def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch, fault):
    """A full disk (during the writes or at fsync) or a failing rename: one clear error, old ckpt.pt intact."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"iter_num": 1, "w": torch.ones(4)}, path)
    real_open = open
    if fault == "write":
        full = full_disk_file(10_000)
        monkeypatch.setattr(base_files, "open", lambda p, mode="r", *a, **k:
                            full(p, "wb") if "w" in mode else real_open(p, mode, *a, **k), raising=False)
    elif fault == "fsync":
        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    else:
        def replace(src, dst):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(UserError) as info:
        save_checkpoint({"iter_num": 2, "w": torch.zeros(100_000)}, path)
    message = str(info.value)
    assert "\n" not in message and "the previous checkpoint is intact" in message
    if fault == "replace":
        assert message.startswith(f"could not write checkpoint {path} (") and "Permission denied" in message
    else:
        assert message == f"disk full while writing {path}; the previous checkpoint is intact"
    monkeypatch.undo()
    state = load_checkpoint(path)
    assert state["iter_num"] == 1 and torch.equal(state["w"], torch.ones(4))
    assert not path.with_name("ckpt.pt.tmp").exists()


def test_a_failed_rename_keeps_the_previous_state_and_resume_finds_it(tmp_path, monkeypatch, capsys):
    """The second rename of a save (latest.pt.tmp over latest.pt) fails after the first (latest.pt to
    latest.prev.pt) went through: the message says where the previous state is, and a resume finds it there."""
    rundir = RunDir(tmp_path)
    save_checkpoint({"iter_num": 1}, rundir.latest, previous=rundir.previous)
    real_replace = os.replace

    def replace(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(UserError) as info:
        save_checkpoint({"iter_num": 2}, rundir.latest, previous=rundir.previous)
    assert str(info.value) == (f"could not write checkpoint {rundir.latest} (Input/output error); the previous "
                               f"checkpoint is intact as {rundir.previous}")
    notes = []
    with pytest.raises(UserError, match="incomplete"):  # found (a bare dict, not a training state) and read
        resume_state(rundir, "auto", notes.append)
    assert notes == [] and not rundir.latest.exists() and load_checkpoint(rundir.previous)["iter_num"] == 1


def test_sigkill_while_saving_a_large_checkpoint(tmp_path):
    """A process SIGKILLed 1 MB into streaming a 64 MB state: the old file loads, the .tmp is ignored
    (and named when it is all there is), and the next save cleans up."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"iter_num": 1, "w": torch.ones(4)}, path)
    script = tmp_path / "big_save.py"
    script.write_text(f"""
import io, os, signal, sys
sys.path.insert(0, {str(REPO)!r})
import torch
from gptkit.base import files
from gptkit.run import checkpoint

class DiesMidWrite(io.FileIO):
    def write(self, data):
        if self.tell() > 1 << 20:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write(data)

files.open = lambda p, mode="r", *a, **k: DiesMidWrite(p, "wb")
torch.manual_seed(0)
checkpoint.save_checkpoint({{"iter_num": 2, "w": [torch.randn(4_000_000) for _ in range(4)]}}, {str(path)!r})
""", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    tmp = tmp_path / "ckpt.pt.tmp"
    assert tmp.stat().st_size > 1 << 20
    state = load_checkpoint(path)
    assert state["iter_num"] == 1 and torch.equal(state["w"], torch.ones(4))
    path.unlink()
    with pytest.raises(UserError, match=r"no checkpoint at .*ckpt\.pt \(ckpt\.pt\.tmp is an unfinished write"):
        load_checkpoint(path)
    save_checkpoint({"iter_num": 3}, path)
    assert load_checkpoint(path)["iter_num"] == 3 and not tmp.exists()


@pytest.mark.parametrize("name,nth,kept", [("best.pt", 1, ""), ("latest.pt", 2, "; the previous checkpoint is intact")])
def test_disk_full_while_saving_is_one_line_and_keeps_what_was_saved(tmp_path, data_dir, monkeypatch, name, nth, kept):
    """The disk fills while best.pt is first written at iteration 5 (there is no previous one to keep, and the
    message does not claim one), or while latest.pt is written at iteration 10 (iteration 5's is kept)."""
    out, real_open, full, opened = tmp_path / "out", open, full_disk_file(4096), []

    def open_filling_the_disk(path, mode="r", *args, **kwargs):
        if Path(path).name == name + ".tmp":
            opened.append(path)
            if len(opened) == nth:
                return full(path, "wb")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(base_files, "open", open_filling_the_disk, raising=False)
    with pytest.raises(UserError) as info:
        train.main(train_args(data_dir, out, "--max_iters=20", "--log_interval=1", "--eval_interval=5",
                              "--eval_iters=2", "--always_save_checkpoint=True", "--dropout=0.1",
                              "--warmup_iters=5"))
    assert str(info.value) == f"disk full while writing {out / name}{kept}"
    assert not (out / f"{name}.tmp").exists()
    if kept:
        assert load_checkpoint(out / name)["iter_num"] == 5
    else:
        assert not (out / "best.pt").exists() and not (out / "latest.pt").exists()


class InterruptedFile(io.FileIO):
    """A checkpoint file whose writes past its first 4 KiB raise `stop`, as a signal handler does."""
    stop = KeyboardInterrupt()

    def write(self, data):
        if self.tell() + len(data) > 4096:
            raise self.stop
        return super().write(data)


@pytest.fixture
def saved(tmp_path):
    """A folder with a saved latest.pt, and the state of a larger one to save over it."""
    path = tmp_path / "latest.pt"
    save_checkpoint({"w": torch.zeros(4)}, path)
    return path, {f"w{i}": torch.randn(1000) for i in range(8)}


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), RunStopped("stopped by SIGTERM while saving", signal.SIGTERM)])
def test_an_interrupt_inside_a_checkpoint_write_is_raised_as_itself(saved, monkeypatch, stop):
    """A signal handler's exception raised by the file's write: torch's zip writer turns it into a RuntimeError,
    which must not be reported as a failed write. The previous checkpoint is kept and the .tmp removed."""
    path, state = saved
    before = path.read_bytes()
    monkeypatch.setattr(InterruptedFile, "stop", stop)
    monkeypatch.setattr(base_files, "open", lambda p, mode, **kw: InterruptedFile(p, mode), raising=False)
    with pytest.raises(type(stop)):
        save_checkpoint(state, path, previous=path.with_name("latest.prev.pt"))
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


def test_an_interrupt_as_a_write_begins_is_raised_as_itself(saved, monkeypatch):
    """Where a signal comes while torch's own code runs, Python raises its handler's exception as the next write
    is entered, before the writer's code runs: still an interrupt, not a failed write."""
    path, state = saved
    before = path.read_bytes()
    real_write, calls = HashingWriter.write, []

    def write(self, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_write(self, data)

    monkeypatch.setattr(HashingWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(state, path, previous=path.with_name("latest.prev.pt"))
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


def test_an_interrupt_after_the_writes_removes_the_tmp(saved, monkeypatch):
    """Ctrl-C while the file is flushed to disk, outside torch's writer: raised as itself, nothing left behind."""
    path, state = saved
    before = path.read_bytes()

    def fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(state, path, previous=path.with_name("latest.prev.pt"))
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


def test_a_save_never_writes_through_a_link(tmp_path, outside):
    """Below the run's check at its start: a link at a save's .tmp name, made while the run runs, is refused and
    never written through."""
    (tmp_path / "best.pt.tmp").symlink_to(outside)
    with pytest.raises(UserError, match="best.pt.tmp is a link"):
        save_checkpoint({"iter_num": 1}, tmp_path / "best.pt")
    assert outside.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_in_a_checkpoints_place_is_one_true_line_and_never_opened(tmp_path, kind):
    """A FIFO would block the reader until something writes to it, /dev/zero never ends: each is named for what it
    is (the snapshot of a run, here), not taken for a checkpoint to train first."""
    path = tmp_path / "out" / "snapshots" / "iter_5.pt"
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = tmp_path / "out" / "best.pt"
        path.symlink_to("/dev/zero")  # a link where no run's rules refuse one: read through, but not a file
    what = "a FIFO (a named pipe)" if kind == "fifo" else "a character device"
    with pytest.raises(UserError) as info:
        load_checkpoint(path, required=MODEL_KEYS)
    assert str(info.value) == f"{path} is {what}, not a checkpoint file; remove it"
    if kind == "fifo":
        proc = run_here("sample.py", f"--out_dir={tmp_path / 'out'}", "--checkpoint=iter:5", "--device=cpu")
        assert_one_error_line(proc.stderr, f"error: {path} is {what}, not a checkpoint file; remove it")
