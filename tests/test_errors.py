"""Errors a user can cause (gptkit/base/errors.py) and bad input through the command lines: each is one `error:` line on
stderr, a non-zero exit, no traceback, and every file written before it is left as it was; a failed allocation,
however the allocator says it, is one line naming the settings that size the command's memory.

The hand-written table names each message in full. Three generated sweeps cover the kinds of bad input: a value
out of range for every numeric option of every script, random damage to each file of a dataset, and the paths a
script reads or writes replaced by a file, a folder or a place nobody here can write. Everything runs in one module
fixture, each script's cases in one process of its own (see DRIVER); each case then checks its own result."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import chat
import export
import plot
import sample
import train
from benchmarks.prepare_cost import PrepareBenchConfig
from benchmarks.sample_speed import SampleBenchConfig
from benchmarks.throughput import ThroughputBenchConfig
from benchmarks.tokenizers import TokenizersBenchConfig
from benchmarks.train_speed import TrainBenchConfig
from conftest import (BPE_VOCAB, MODEL, REPO, assert_one_error_line, check_ok, make_text, mixed_script_text,
                      run_here, train_args)
from gptkit.base.errors import run_main
from gptkit.base.settings import settings
from gptkit.chat.reinforce import RLConfig
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.run.checkpoint import load_checkpoint
from gptkit.training.train_config import TrainConfig
from test_layout import SCRIPTS as ROOT_SCRIPTS

PROMPT = "Zebra ~ 😀 ROMEO"

# id: (script, arguments, the message expected as stderr's one line, its start followed by *, or *a word* it must
# hold; {w} is the work folder, {t} a short trained run there (see make_inputs), {u} a folder nobody here can write to)
CASES = {
    "empty input": ("prepare", ["--input={w}/empty.txt"], "error: input {w}/empty.txt is empty"),
    "binary input": ("prepare", ["--input={w}/image.png"],
                     "error: {w}/image.png looks like a binary file (NUL byte at offset 8), not UTF-8 text"),
    "latin-1 input": ("prepare", ["--input={w}/latin1.txt"],
                      "error: {w}/latin1.txt is not UTF-8 text: byte 0xe9 at offset 3"),
    "missing input": ("prepare", ["--input={w}/nope.txt"], "error: input file not found: {w}/nope.txt"),
    "uint16 too small": ("prepare", ["--input={w}/wide.txt", "--dtype=uint16"],
                         "error: the vocabulary has 66,000 tokens, more than uint16 holds (65,536); "
                         "use --dtype=uint32 or --dtype=auto"),
    "vocab_size past the trainer's memory": ("prepare", ["--input={w}/short.txt", "--name=huge", "--data_dir={w}/data",
                                                         "--tokenizer=bpe", "--vocab_size=1000000000"],
                                             "error: vocab_size must be at most 16,777,216 (got 1,000,000,000): the "
                                             "trainer sets aside about 70 bytes for each token asked for, 70 GB for "
                                             "these, before it reads the text"),
    "prepare over another dataset": ("prepare", ["--input={w}/short.txt", "--name=other", "--data_dir={w}/data"],
                                     "error: {w}/data/other holds a dataset made from other text ({w}/input.txt as "
                                     "it was then); prepare this one under another --name, or replace that dataset "
                                     "with --start_over=True (it is deleted)"),
    "unknown dtype": ("prepare", ["--input={w}/input.txt", "--dtype=int8"],
                      "error: command line: dtype must be one of auto, uint16, uint32 (got 'int8')"),
    "prepare unknown key": ("prepare", ["--input={w}/input.txt", "--nme=x"],
                            "error: command line: unknown config key 'nme' (did you mean 'name'?)"),
    "prepare wrong type": ("prepare", ["--input={w}/input.txt", "--val_fraction=lots"],
                           "error: command line: val_fraction must be float, got 'lots'"),
    "missing dataset": ("train", ["--dataset=nope"],
                        "error: dataset folder {w}/data/nope not found; create it with "
                        "`python data/prepare.py --input=YOUR.txt --name=nope --data_dir={w}/data`"),
    "split too short": ("train", ["--dataset=short"],
                        "error: {w}/data/short/train.bin has 10 tokens, fewer than block_size + 1 = 17; "
                        "use a smaller --block_size or more text"),
    "meta dtype too small": ("train", ["--dataset=widemeta"],
                             "error: {w}/data/widemeta/meta.json: a vocabulary of 70000 tokens does not fit uint16 "
                             "token files (at most 65,536); run data/prepare.py again"),
    "meta vocab_size lies": ("train", ["--dataset=liarmeta"],
                             "error: {w}/data/liarmeta/meta.json: vocab_size is 99 but the vocabulary has 65 "
                             "characters; run data/prepare.py for this dataset again"),
    "meta vocab_size a string": ("train", ["--dataset=textmeta"],
                                 "error: {w}/data/textmeta/meta.json: vocab_size is \"65\", not a whole number; run "
                                 "data/prepare.py for this dataset again"),
    "train.bin of odd length": ("train", ["--dataset=oddbin"],
                                "error: {w}/data/oddbin/train.bin has 10,943 bytes, not a whole number of uint16 "
                                "tokens; run data/prepare.py for this dataset again"),
    "token id outside the vocabulary": ("train", ["--dataset=bigid"],
                                        "error: {w}/data/bigid/val.bin holds token id 65, outside the vocabulary of "
                                        "65; run data/prepare.py for this dataset again"),
    "out_dir is a file": ("train", ["--out_dir={w}/input.txt"],
                          "error: cannot use {w}/input.txt as out_dir (a file of that name is in the way)"),
    "unknown key": ("train", ["--n_layers=2"],
                    "error: command line: unknown config key 'n_layers' (did you mean 'n_layer'?)"),
    "wrong type": ("train", ["--batch_size=four"], "error: command line: batch_size must be int, got 'four'"),
    "n_embd vs n_head": ("train", ["--n_embd=33"], "error: n_embd (33) must be divisible by n_head (2)"),
    "choice typo": ("train", ["--pos_emb=rop"],
                    "error: command line: pos_emb must be one of learned, rope, none (got 'rop'; did you mean 'rope'?)"),
    "init_from typo": ("train", ["--init_from=resum"],
                       "error: init_from must be one of scratch, resume, auto, gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
                       "a run's folder or one saved by save_pretrained (got 'resum'; did you mean 'resume'?)"),
    "init_from empty": ("train", ["--init_from="],
                        "error: init_from is empty: name a run's folder to start from (e.g. out), or one of scratch, "
                        "resume, auto, gpt2, gpt2-medium, gpt2-large, gpt2-xl"),
    "beta1 of 2": ("train", ["--beta1=2"], "error: beta1 must be in [0, 1) (got 2.0)"),
    "dataset empty": ("train", ["--dataset="],
                      "error: dataset is empty: name a folder data/prepare.py made (e.g. shakespeare_char)"),
    "retime with nothing to measure": ("train", ["--retime=True", "--attention_path=written"],
                                       "error: retime=True measures the choices left to auto again, but dtype and "
                                       "attention_path are both set: drop --retime, or leave one of them to auto"),
    "fit_shapes not shapes": ("train", ["--fit_shapes=4 layers"],
                              "error: fit_shapes must list shapes as LAYERSxWIDTH, e.g. '4x128, 3x128' "
                              "(got '4 layers')"),
    "eval_iters of 10**9": ("train", ["--eval_iters=1000000000"],
                            "error: eval_iters must be at most 100,000 (got 1,000,000,000): each evaluation scores "
                            "that many batches of each split, drawn before the first step; the whole val split is "
                            "scored once at the end anyway"),
    # the data is read before the model is built: its length is the first thing such a block cannot fit
    "block_size of 10**15": ("train", ["--block_size=1000000000000000"],
                             "error: *tokens, fewer than block_size + 1 = 1000000000000001; use a smaller "
                             "--block_size or more text*"),
    "evaluation windows past the bound": ("train", ["--batch_size=3000000"],
                                          "error: eval_iters x batch_size must be at most 10,000,000 windows of each "
                                          "split, drawn before the first step for the evaluations (got 60,000,000); "
                                          "lower eval_iters or batch_size"),
    "resume without checkpoint": ("train", ["--out_dir={w}/fresh", "--init_from=resume"],
                                  "error: nothing to resume in {w}/fresh (no latest.pt, latest.prev.pt or ckpt.pt); "
                                  "start the run with --init_from=scratch or --init_from=auto"),
    "resume truncated": ("train", ["--out_dir={w}/truncated", "--init_from=resume"],
                         "error: {w}/truncated/ckpt.pt is damaged: it holds 2,884 bytes after its header, the header "
                         "says *"),
    "resume version 999": ("train", ["--out_dir={w}/v999", "--init_from=resume"],
                           "error: {w}/v999/ckpt.pt has checkpoint format 999, this tool reads 1 to 2"),
    "resume incomplete": ("train", ["--out_dir={w}/nokeys", "--init_from=resume"],
                          "error: {w}/nokeys/ckpt.pt is incomplete: it lacks model_args, optimizer"),
    "resume larger block": ("train", ["--out_dir={t}", "--init_from=resume", "--block_size=64"],
                            "error: block_size=64 differs from {t}/latest.pt's 16; a resumed run keeps its model's "
                            "shape and optimizer (start a new out_dir to change them)"),
    "resume smaller block": ("train", ["--out_dir={t}", "--init_from=auto", "--block_size=8"],
                             "error: block_size=8 differs from {t}/latest.pt's 16; *"),
    "resume another shape": ("train", ["--out_dir={t}", "--init_from=auto", "--n_embd=64"],
                             "error: n_embd=64 differs from {t}/latest.pt's 32; *"),
    "resume another optimizer": ("train", ["--out_dir={t}", "--init_from=auto", "--optimizer=muon"],
                                 "error: optimizer='muon' differs from {t}/latest.pt's 'adamw'; *"),
    "resume another vocabulary": ("train", ["--out_dir={t}", "--init_from=auto", "--dataset=other",
                                            "--max_iters=1000000"],  # more to do: a finished run just says so
                                  "error: dataset 'other' has a vocabulary of 62 characters, but {t}/latest.pt was "
                                  "trained on a vocabulary of 65 characters; a resumed run must see the token ids it "
                                  "learned: resume on the dataset it was trained on with --dataset=tiny, or start a "
                                  "new out_dir"),
    "sample without checkpoint": ("sample", ["--out_dir={w}/none"],
                                  "error: no checkpoint in {w}/none (no best.pt or ckpt.pt); train one first with "
                                  "`python train.py CONFIG --out_dir={w}/none`, CONFIG being the config file of the "
                                  "run you meant to train there (e.g. config/shakespeare_char.py)"),
    "sample latest without checkpoint": ("sample", ["--out_dir={w}/none", "--checkpoint=latest"],
                                         "error: no latest.pt in {w}/none; train one first with `python train.py "
                                         "CONFIG --out_dir={w}/none`, CONFIG being the config file of the run you "
                                         "meant to train there (e.g. config/shakespeare_char.py)"),
    "sample latest with best only": ("sample", ["--out_dir={w}/bestonly", "--checkpoint=latest"],
                                     "error: no latest.pt in {w}/bestonly, only best.pt; leave out "
                                     "--checkpoint=latest to use best.pt"),
    "sample before any evaluation": ("sample", ["--out_dir={w}/latestonly"],
                                     "error: no best.pt in {w}/latestonly yet (the run has not finished an "
                                     "evaluation); use its latest state with --checkpoint=latest"),
    "sample truncated": ("sample", ["--out_dir={w}/truncated"],
                         "error: {w}/truncated/ckpt.pt is damaged: it holds 2,884 bytes after its header, *"),
    "sample empty file": ("sample", ["--out_dir={w}/emptyfile"],
                          "error: {w}/emptyfile/ckpt.pt is damaged or not a checkpoint (it is empty)"),
    "sample text file": ("sample", ["--out_dir={w}/textfile"],
                         "error: {w}/textfile/ckpt.pt is damaged or not a checkpoint (it does not begin with a "
                         "checkpoint header)"),
    "sample version 999": ("sample", ["--out_dir={w}/v999"],
                           "error: {w}/v999/ckpt.pt has checkpoint format 999, this tool reads 1 to 2"),
    "sample incomplete": ("sample", ["--out_dir={w}/nokeys"], "error: {w}/nokeys/ckpt.pt is incomplete: it lacks model_args"),
    "sample unknown model setting": ("sample", ["--out_dir={w}/newer"],
                                     "error: {w}/newer/ckpt.pt was trained with model settings model.py's GPTConfig "
                                     "does not define (flash_kernels): an option taken out of model.py since, or "
                                     "another version's; put it back in GPTConfig to use this run"),
    "sample float16 on cpu": ("sample", ["--out_dir={t}", "--dtype=float16"],
                              "error: dtype float16 is not supported on CPU; use bfloat16 or float32"),
    "prompt outside vocabulary": ("sample", ["--out_dir={t}", f"--start={PROMPT}"], None),  # see below
    "plot: a list, not a record": ("plot", ["loss", "--out_dir={w}/badmetrics/list"],
                                   "error: {w}/badmetrics/list/metrics.jsonl has a line that has a record of the wrong "
                                   "shape (line 2: a list, not an object); was it written by train.py?"),
    "plot: iter is text": ("plot", ["loss", "--out_dir={w}/badmetrics/itertext"],
                           "error: {w}/badmetrics/itertext/metrics.jsonl has a line that has a record of the wrong "
                           "shape (line 1: iter is 'five', not an iteration number); was it written by train.py?"),
    "plot: no loss": ("plot", ["loss", "--out_dir={w}/badmetrics/noloss"],
                      "error: {w}/badmetrics/noloss/metrics.jsonl has a line that has a record of the wrong shape "
                      "(line 1: a record of kind 'train' without loss); was it written by train.py?"),
    "plot: loss is a list": ("plot", ["loss", "--out_dir={w}/badmetrics/losslist"],
                             "error: {w}/badmetrics/losslist/metrics.jsonl has a line that has a record of the wrong "
                             "shape (line 1: loss is [1.0], not a number); was it written by train.py?"),
    "bench targets": ("bench", ["train", "--targets=low"],
                      "error: targets must be positive val losses, comma-separated (got 'low')"),
}
BAD_METRICS = {  # metrics.jsonl lines that are JSON, but not records train.py writes
    "list": ['{"kind": "train", "iter": 1, "loss": 2.0}', "[1, 2]"],
    "itertext": ['{"kind": "eval", "iter": "five", "val_loss": 2.0}'],
    "noloss": ['{"kind": "train", "iter": 5}'],
    "losslist": ['{"kind": "train", "iter": 5, "loss": [1.0]}'],
}

# ---------------------------------------------------------------------------------------------- out-of-range sweep

# every numeric option of every script, and values outside its range (each is refused naming the option); every
# float option is also given 1e999 and -1e999 (infinity) and every integer one 2**63, which the parser refuses
SCRIPT_OPTIONS = [("train", [], TrainConfig), ("sample", [], sample.SampleConfig), ("plot", ["loss"], plot.PlotConfig),
                  ("prepare", [], PrepareConfig), ("export", [], export.ExportConfig),
                  ("bench", ["sample"], SampleBenchConfig), ("bench", ["train"], TrainBenchConfig),
                  ("bench", ["throughput"], ThroughputBenchConfig), ("bench", ["prepare"], PrepareBenchConfig),
                  ("bench", ["tokenizers"], TokenizersBenchConfig), ("chat", [], chat.ChatConfig), ("rl", [], RLConfig)]
OUT_OF_RANGE = {
    "TrainConfig": {
        **dict.fromkeys(["eval_interval", "log_interval", "gradient_accumulation_steps", "batch_size", "max_iters",
                         "block_size", "n_head", "n_embd", "processes"], [0, -1]),
        "eval_iters": [0, -1, 100_001],
        **dict.fromkeys(["warmup_iters", "lr_decay_iters", "threads", "final_eval_tokens", "n_layer", "snapshots"],
                        [-1]),
        **dict.fromkeys(["learning_rate", "embedding_lr", "min_lr", "muon_lr", "weight_decay", "muon_weight_decay",
                         "grad_clip", "max_time", "logit_softcap", "min_tokens_per_param"], [-1e-3]),
        **dict.fromkeys(["beta1", "beta2", "muon_momentum", "ema_decay", "dropout"], [-0.1, 1.0, 2]),
        "warmdown_frac": [-0.1, 1.5], "seed": [-1, 2 ** 31], "rope_base": [0, -1], "stop_pass_at_1": [0, -0.1, 1.5],
        "smaller_muon_weight_decay": [],  # below 0 means the configured decay
        "lora_rank": [-1, 100_000], "lora_alpha": [],  # lora_alpha is checked where lora_rank > 0 uses it
    },
    "SampleConfig": {"num_samples": [0], "max_new_tokens": [-1], "temperature": [-0.1], "top_k": [-1],
                     "top_p": [0, 1.5], "seed": [-1, 2 ** 31], "threads": [-1]},
    "PlotConfig": {"dpi": [19, 601, 0]},
    "PrepareConfig": {"val_fraction": [0, 1, -0.5], "shard_tokens": [0, -1], "workers": [-1, 513],
                      "vocab_size": [-1, 256], "show_merges": [-1], "problems": [0], "heldout": [0],
                      "mix_share": [0, 1]},
    "ExportConfig": {},
    "SampleBenchConfig": {**dict.fromkeys(["n_head", "n_embd", "block_size", "vocab_size", "max_new_tokens",
                                           "batch_size", "repeats"], [0]), "n_layer": [-1],
                          **dict.fromkeys(["warmup_tokens", "temperature", "threads"], [-1]), "seed": [-1, 2 ** 31]},
    "TrainBenchConfig": {},
    "ThroughputBenchConfig": {**dict.fromkeys(["n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size",
                                               "steps", "rounds"], [0]), "warmup": [-1]},
    "PrepareBenchConfig": {"size_gb": [0, 10_001], "workers": [-1, 513], "train_iters": [-1], "val_fraction": [0, 1],
                           "vocab_size": [-1, 256],
                           "huge_docs": [-1, 100_001], "huge_mb": [-1, 100_001]},
    "TokenizersBenchConfig": {"max_time": [0, -1], "char_block": [7, 65_537], "val_fraction": [0, 1],
                              "size_gb": [0, 10_001], "speed_vocab": [256, 2 ** 32], "encode_mb": [0, -1],
                              "rounds": [0, 101]},
    "ChatConfig": {"samples": [-1, 1025], "max_new_tokens": [0], "limit": [-1], "temperature": [-0.1], "top_k": [-1],
                   "top_p": [0, 1.5], "seed": [-1, 2 ** 31], "threads": [-1]},
    "RLConfig": {**dict.fromkeys(["problems_per_step", "max_new_tokens", "max_iters", "eval_interval", "eval_problems",
                                  "eval_samples"], [0]), "samples": [0, 1],
                 **dict.fromkeys(["temperature", "learning_rate", "embedding_lr", "weight_decay", "grad_clip"],
                                 [-1e-3]), "threads": [-1],
                 **dict.fromkeys(["beta1", "beta2"], [-0.1, 1.0]), "seed": [-1, 2 ** 31]},
}


def numeric_options(cls):
    return {k: s for k, s in settings(cls).items() if s.type in (int, float)}


def range_cases():
    cases = {}
    for script, prefix, cls in SCRIPT_OPTIONS:
        for key, setting in numeric_options(cls).items():
            generic = ["1e999", "-1e999"] if setting.type is float else [str(2 ** 63)]
            for value in [*map(str, OUT_OF_RANGE[cls.__name__].get(key, [])), *generic]:
                where = ["--out_dir={t}"] if script in ("train", "sample") else []
                cases[f"{' '.join([script, *prefix])} --{key}={value}"] = (
                    script, [*prefix, *where, f"--{key}={value}"], f"error: *{key}*")
    return cases


def test_every_numeric_option_has_its_range_swept():
    """A new numeric option needs its out-of-range values in OUT_OF_RANGE (an empty list where any value that fits
    its type is allowed, as with seeds of the parser's 64 bits)."""
    for _, _, cls in SCRIPT_OPTIONS:
        assert set(numeric_options(cls)) <= set(OUT_OF_RANGE[cls.__name__]), cls.__name__
        assert set(OUT_OF_RANGE[cls.__name__]) <= set(numeric_options(cls)), cls.__name__


# ---------------------------------------------------------------------------------------------- dataset damage

DAMAGES = ["flip", "cut", "append", "empty"]
DATASET_FILES = ["train.bin", "val.bin", "meta.json"]
DAMAGE_CASES = {f"damaged {name}: {damage} #{i}": ("train", [f"--data_dir={{w}}/damaged/{name}-{damage}-{i}",
                                                             "--out_dir={t}", "--init_from=auto", "--max_iters=40"],
                                                   f"error: *{name}*")
                for name in DATASET_FILES for damage in DAMAGES for i in range(3)}


def damage_dataset(source, folder, name, damage, seed):
    """A copy of the dataset with one file damaged so that it differs from the original as data (a meta.json
    whose JSON means the same, e.g. after a space became a tab, is drawn again)."""
    rng = random.Random(f"{name}-{damage}-{seed}")
    shutil.copytree(source, folder)
    path, data = folder / name, (source / name).read_bytes()
    while True:
        damaged = bytearray(data)
        if damage == "flip":
            damaged[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        elif damage == "cut":
            damaged = damaged[:rng.randrange(len(data))]
        elif damage == "append":
            damaged += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        else:
            damaged = bytearray()
        if name != "meta.json" or not means_the_same(bytes(damaged), data):
            break
    path.write_bytes(bytes(damaged))


def means_the_same(a, b):
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------- paths

def unwritable(w):
    """An existing folder this process cannot write to: a read-only one, or, for root (whom permissions do not
    stop), one of the kernel's."""
    if os.geteuid() == 0:
        return Path("/sys/kernel")
    folder = w / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def replaced(w, name, path, by):
    """A copy of folder `name` under w/paths with `path` in it replaced by a folder or a file; returns the copy."""
    copy = w / "paths" / name
    shutil.copytree(w / name.split("-")[0], copy)
    target = copy / path
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    if by == "folder":
        (target / "inside").mkdir(parents=True)
    else:
        target.write_text("in the way\n")
    return copy


# id: function of (w, u) setting the case up and returning (script, arguments, expected line or prefix*, the folder
# whose files must not change); run{...} is a copy of the trained run, data its dataset
PATH_CASES = {
    "train: out_dir a file": lambda w, u: ("train", ["--out_dir={w}/input.txt"], "error: cannot use *", w / "run"),
    "train: out_dir unwritable": lambda w, u: ("train", [f"--out_dir={u}"], f"error: cannot write to out_dir {u} (*",
                                               None),
    "train: out_dir cannot be made": lambda w, u: ("train", [f"--out_dir={u}/out"],
                                                   f"error: cannot write to out_dir {u}/out (*", None),
    "train: data_dir a file": lambda w, u: ("train", ["--data_dir={w}/input.txt"],
                                            "error: data_dir {w}/input.txt is a file, not a folder of datasets", None),
    "train: dataset a file": lambda w, u: ("train", ["--dataset={w}/input.txt"],
                                           "error: dataset {w}/input.txt is a file, not a folder made by "
                                           "data/prepare.py", None),
    "train: config file a folder": lambda w, u: ("train", ["{w}/data.py"],
                                                  "error: config file {w}/data.py is a folder, not a file", None),
    **{f"train: {f} a folder": (lambda f: lambda w, u: (
        "train", [f"--out_dir={replaced(w, 'run-' + f, f, 'folder')}", "--init_from=auto"],
        f"error: {w}/paths/run-{f}/{f} is a folder where the run writes a file; move it out of the way",
        w / "paths" / f"run-{f}"))(f) for f in ["latest.pt", "best.pt", "metrics.jsonl", "run.lock"]},
    "train: snapshots a file": lambda w, u: (
        "train", [f"--out_dir={replaced(w, 'run-snapshots', 'snapshots', 'file')}", "--init_from=auto"],
        "error: {w}/paths/run-snapshots/snapshots is a file where the run keeps its snapshots, a folder; move it out "
        "of the way", w / "paths" / "run-snapshots"),
    **{f"train: dataset's {f} a folder": (lambda f: lambda w, u: (
        "train", [f"--dataset={replaced(w, 'data-' + f, 'tiny/' + f, 'folder')}/tiny", "--out_dir={t}",
                  "--init_from=auto", "--max_iters=1000000"], f"error: *{f}*", w / "paths" / f"data-{f}"))(f)
       for f in DATASET_FILES},
    "sample: out_dir a file": lambda w, u: ("sample", ["--out_dir={w}/input.txt"],
                                            "error: out_dir {w}/input.txt is a file, not a run folder", None),
    "sample: best.pt a folder": lambda w, u: ("sample", [f"--out_dir={replaced(w, 'run-sample', 'best.pt', 'folder')}"],
                                              "error: {w}/paths/run-sample/best.pt is a folder, not a checkpoint file",
                                              w / "paths" / "run-sample"),
    "sample: prompt file a folder": lambda w, u: ("sample", ["--out_dir={t}", "--start=FILE:{w}"],
                                                  "error: could not read prompt file {w} (Is a directory)", None),
    "plot: metrics.jsonl a folder": lambda w, u: (
        "plot", ["loss", f"--out_dir={replaced(w, 'run-plot', 'metrics.jsonl', 'folder')}"],
        "error: could not read {w}/paths/run-plot/metrics.jsonl (Is a directory)", w / "paths" / "run-plot"),
    "plot: output a folder": lambda w, u: ("plot", ["loss", "--out_dir={t}", "--output={w}/picture.png"],
                                           "error: output {w}/picture.png is a folder, not a picture file*", None),
    "plot: output unwritable": lambda w, u: ("plot", ["loss", "--out_dir={t}", f"--output={u}/loss.png"],
                                             f"error: could not write {u}/loss.png (*", None),
    "plot: attention's best.pt a folder": lambda w, u: (
        "plot", ["attention", f"--out_dir={replaced(w, 'run-attention', 'best.pt', 'folder')}"],
        "error: {w}/paths/run-attention/best.pt is a folder, not a checkpoint file", w / "paths" / "run-attention"),
    "export: out_dir a file": lambda w, u: ("export", ["--out_dir={w}/input.txt", "--hf_dir={w}/hf"],
                                            "error: out_dir {w}/input.txt is a file, not a run folder", None),
    "export: hf_dir a file": lambda w, u: ("export", ["--out_dir={t}", "--hf_dir={w}/input.txt"],
                                           "error: --hf_dir={w}/input.txt exists and is not a folder", None),
    "prepare: input folder empty": lambda w, u: ("prepare", ["--input={w}/none"],
                                                  "error: input folder {w}/none holds no files", None),
    "prepare: data_dir a file": lambda w, u: ("prepare", ["--input={w}/input.txt", "--data_dir={w}/input.txt"],
                                              "error: cannot write the dataset to {w}/input.txt/x (*", None),
    "prepare: dataset folder a file": lambda w, u: ("prepare", ["--input={w}/input.txt", "--data_dir={w}",
                                                                "--name=input.txt"],
                                                    "error: cannot write the dataset to {w}/input.txt (a file of that "
                                                    "name is in the way)", None),
    "prepare: data_dir unwritable": lambda w, u: ("prepare", ["--input={w}/input.txt", f"--data_dir={u}"],
                                                  f"error: cannot write the dataset to {u}/x (*", None),
    **{f"prepare: {f} a folder": (lambda f: lambda w, u: (
        "prepare", ["--input={w}/input.txt", f"--data_dir={replaced(w, 'data-prepare-' + f, 'tiny/' + f, 'folder')}",
                    "--name=tiny"],
        f"error: {w}/paths/data-prepare-{f}/tiny/{f} is a folder where the dataset's {f} goes; move it out of the way",
        w / "paths" / f"data-prepare-{f}"))(f) for f in DATASET_FILES},
    "bench: out_dir a file": lambda w, u: ("bench", ["sample", "--out_dir={w}/input.txt"],
                                           "error: out_dir {w}/input.txt is a file, not a run folder", None),
    "bench: config a folder": lambda w, u: ("bench", ["throughput", "--config={w}/data.py"],
                                            "error: config file {w}/data.py is a folder, not a file", None),
}


# ---------------------------------------------------------------------------------------------- running them all

SCRIPTS = {"prepare": "data/prepare.py", "train": "train.py", "sample": "sample.py", "plot": "plot.py",
           "export": "export.py", "bench": "bench.py", "chat": "chat.py", "rl": "rl.py"}
BASE_ARGS = {
    "prepare": ["--name=x", "--data_dir={w}/prepared"],
    "train": ["--data_dir={w}/data", "--dataset=tiny", "--out_dir={w}/out", *MODEL, "--max_iters=2"],
    "sample": ["--device=cpu", "--max_new_tokens=5"],
}

# Runs entry scripts the way `python SCRIPT ARGS...` does (its `if __name__ == "__main__"` block, sys.argv,
# stderr, exit status, and a traceback for anything uncaught), once per case, so that the table pays for
# importing torch once per driver rather than once per case. Around each case it takes a digest of every file
# under the folders the case watches (but run.lock, which holds the pid of the run that last took it), and
# reports those that changed. Writes {case: {rc, stderr, changed}} as JSON.
DRIVER = """
import contextlib, hashlib, io, json, runpy, sys, traceback, warnings
from pathlib import Path
sys.path.insert(0, REPO)
warnings.simplefilter("always")  # each case shows its own warnings, as a fresh process would


def digest(folder):
    h = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if "run.lock" not in path.parts:
            h.update(str(path).encode() + (path.read_bytes() if path.is_file() else b"/"))
    return h.hexdigest()


results = {}
for case, (script, argv, watched) in json.loads(sys.stdin.read()).items():
    before = [digest(f) for f in watched]
    err = io.StringIO()
    sys.argv = [script, *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(script, run_name="__main__")
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            rc = 1
    changed = [f for f, d in zip(watched, before) if digest(f) != d]
    results[case] = {"rc": rc, "stderr": err.getvalue(), "changed": changed}
print(json.dumps(results))
"""


def run_table(w, cases):
    """Every case, in two driver processes side by side (train.py's cases, and the other scripts').
    cases: {id: (script, argv, watched folders)}."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    driver = w / "driver.py"
    driver.write_text(f"REPO = {str(REPO)!r}\n" + DRIVER, encoding="utf-8")
    procs = []
    for group in (True, False):
        mine = {case: (str(REPO / SCRIPTS[script]), argv, watched)
                for case, (script, argv, watched) in cases.items() if (script == "train") == group}
        proc = subprocess.Popen([sys.executable, str(driver)], cwd=w, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8")
        proc.stdin.write(json.dumps(mine))
        proc.stdin.close()
        procs.append(proc)
    results = {}
    for proc in procs:
        out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(timeout=300) == 0 and err == "", f"driver failed\n{err}"
        results.update(json.loads(out))
    return results


def make_inputs(w, data_dir):
    """The bad inputs the hand-written table names, and {t}: a short run of the table's model on data/tiny (the
    session's dataset), with its latest.pt, latest.prev.pt, best.pt and metrics.jsonl."""
    (w / "input.txt").write_text(make_text(), encoding="utf-8")
    (w / "empty.txt").write_bytes(b"")
    (w / "none").mkdir()
    (w / "data.py").mkdir()
    (w / "picture.png").mkdir()
    (w / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (w / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c <= 0xDFFF][:65999]  # + "\n"
    (w / "wide.txt").write_text("\n".join("".join(chars[i:i + 200]) for i in range(0, len(chars), 200)),
                                encoding="utf-8")
    (w / "short.txt").write_text("hello world\n", encoding="utf-8")
    shutil.copytree(data_dir / "tiny", w / "data" / "tiny")
    for name, text in [("other", "input.txt"), ("short", "short.txt")]:
        prepare(PrepareConfig(input=str(w / text), name=name, data_dir=str(w / "data")))
    tiny = w / "data" / "tiny"
    meta = json.loads((tiny / "meta.json").read_text(encoding="utf-8"))
    for name, change in [("widemeta", dict(vocab_size=70000, dtype="uint16")), ("liarmeta", dict(vocab_size=99)),
                         ("textmeta", dict(vocab_size="65"))]:
        shutil.copytree(tiny, w / "data" / name)
        (w / "data" / name / "meta.json").write_text(json.dumps(dict(meta, **change)))
    for name in ("oddbin", "bigid"):
        shutil.copytree(tiny, w / "data" / name)
    (w / "data" / "oddbin" / "train.bin").write_bytes((tiny / "train.bin").read_bytes()[:-1])
    (w / "data" / "bigid" / "val.bin").write_bytes((tiny / "val.bin").read_bytes()[:-2] + bytes([65, 0]))
    for name, lines in BAD_METRICS.items():
        (w / "badmetrics" / name).mkdir(parents=True)
        (w / "badmetrics" / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")

    t = w / "run"
    train.main([a.format(w=w) for a in BASE_ARGS["train"]] + [f"--out_dir={t}", "--max_iters=10",
                                                             "--eval_interval=5", "--eval_iters=1"])
    ckpt = load_checkpoint(t / "latest.pt")
    for name, data in [("truncated", (t / "latest.pt").read_bytes()[:3000]), ("emptyfile", b""),
                       ("textfile", b"this is not a checkpoint\n")]:
        (w / name).mkdir()
        (w / name / "ckpt.pt").write_bytes(data)
    (w / "v999").mkdir()
    torch.save(dict(ckpt, format_version=999), w / "v999" / "ckpt.pt")
    (w / "nokeys").mkdir()
    torch.save({k: v for k, v in ckpt.items() if k not in ("model_args", "optimizer")}, w / "nokeys" / "ckpt.pt")
    (w / "newer").mkdir()
    torch.save(dict(ckpt, model_args=dict(ckpt["model_args"], flash_kernels=True)), w / "newer" / "ckpt.pt")
    for name, kept in [("latestonly", "latest.pt"), ("bestonly", "best.pt")]:
        (w / name).mkdir()
        shutil.copy(t / kept, w / name / kept)
    return t, ckpt


def all_cases():
    """{case: (script, arguments, expected)} of the table and the two sweeps whose ids need no set-up."""
    return {**CASES, **range_cases(), **DAMAGE_CASES}


@pytest.fixture(scope="module")
def results(tmp_path_factory, data_dir):
    """Build every bad input, then run every case. Returns (w, t, t's checkpoint, {case: result},
    {case: expected line})."""
    w = tmp_path_factory.mktemp("errors")
    t, ckpt = make_inputs(w, data_dir)
    u = unwritable(w)
    cases = {case: (script, args, [t]) for case, (script, args, _) in all_cases().items()}
    expected = {case: line for case, (_, _, line) in all_cases().items()}
    for case in DAMAGE_CASES:
        name, damage, i = DAMAGE_CASES[case][1][0].rsplit("/", 1)[1].split("-")
        damage_dataset(w / "data" / "tiny", w / "damaged" / f"{name}-{damage}-{i}" / "tiny", name, damage, int(i))
    for case, setup in PATH_CASES.items():
        script, args, expected[case], watched = setup(w, u)
        cases[case] = (script, args, [t] + ([watched] if watched else []))
    table = {case: (script, [a.format(w=w, t=t, u=u) for a in BASE_ARGS.get(script, []) + args],
                    [str(f) for f in watched]) for case, (script, args, watched) in cases.items()}
    return w, t, ckpt, run_table(w, table), expected


@pytest.mark.parametrize("case", [*all_cases(), *PATH_CASES])
def test_bad_input_is_one_error_line(results, case):
    w, t, ckpt, table, expected = results
    rc, stderr, changed = table[case]["rc"], table[case]["stderr"], table[case]["changed"]
    line = expected[case]
    if case == "prompt outside vocabulary":  # name every character the model has never seen
        missing = sorted(set(PROMPT) - set(ckpt["tokenizer"]["vocab"]))
        assert {"Z", "~", "😀"} <= set(missing)
        line = ("error: the text has characters outside the training vocabulary: "
                + ", ".join(repr(c) for c in missing))
    if line is not None and line.startswith("error: *") and line.endswith("*"):  # just a word the line must hold
        assert line[8:-1].format(w=w, t=t) in assert_one_error_line(stderr), stderr
    else:
        assert_one_error_line(stderr, line and line.format(w=w, t=t))
    assert rc == 1
    assert not changed, f"a failed command changed files written before it, under {changed}"


@pytest.mark.slow
def test_a_resume_refused_for_its_replaced_dataset_names_commands_that_work(tmp_path):
    """A dataset prepared again with other merges (--start_over=True) no longer gives the run trained on it its
    token ids: the refusal names the prepare that makes them again, from the checkpoint's tokenizer settings, and
    the --dataset to resume on; run as said, both work."""
    text = tmp_path / "input.txt"
    text.write_text(mixed_script_text(), encoding="utf-8")
    data = tmp_path / "data"
    args = [f"--data_dir={data}", "--dataset=d", f"--out_dir={tmp_path / 'out'}", *MODEL, "--eval_interval=2",
            "--eval_iters=1", "--log_interval=2"]
    for vocab_size, start_over in ((BPE_VOCAB, False), (BPE_VOCAB - 20, True)):
        prepare(PrepareConfig(input=str(text), name="d", tokenizer="bpe", vocab_size=vocab_size, data_dir=str(data),
                              workers=1, start_over=start_over))
        if not start_over:
            train.main([*args, "--max_iters=2"])
    proc = run_here("train.py", *args, "--init_from=resume", "--max_iters=4")
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr, f"error: dataset 'd' has a trained BPE of {BPE_VOCAB - 20} tokens *")
    command, dataset = re.fullmatch(r".*: prepare its text again with its tokenizer, `python (data/prepare.py [^`]*)`, "
                                    r"TEXT being the text it was trained on, and resume with (--dataset=\S+); or "
                                    r"start a new out_dir", line).groups()
    assert command == (f"data/prepare.py --input=TEXT --name=d_bpe{BPE_VOCAB} --tokenizer=bpe "
                       f"--vocab_size={BPE_VOCAB} --data_dir={data}")
    check_ok(run_here(*command.replace("TEXT", str(text)).split()))
    check_ok(run_here("train.py", *args, "--init_from=resume", "--max_iters=4", dataset))


# ---------------------------------------------------------------------------------------------- memory

# runs a script with its address space capped at 8 GiB: should a change make the first allocation a small one,
# the test fails on its size instead of filling this machine's memory
LIMITED = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
TRAIN_SIZES = "(batch_size, block_size, n_embd, n_layer, n_head, eval_iters)"


@pytest.mark.parametrize("script,args,settings", [
    ("train.py", ["--n_embd=2**44", "--n_head=1"], TRAIN_SIZES),
    ("sample.py", ["--num_samples=10**15"], "(num_samples, max_new_tokens)"),
    ("bench.py", ["sample", "--vocab_size=10**15"], "(batch_size, block_size, n_embd, n_layer, vocab_size, "
                                                   "max_new_tokens)"),
])
def test_a_size_no_memory_holds_is_one_line_naming_the_settings(trained_run, data_dir, tmp_path, script, args,
                                                                 settings):
    """Sizes of petabytes: the first tensor they shape fails at once, before anything else is allocated (so the
    test itself takes no memory), and the line names the settings that size this command's memory."""
    args = [a.replace("10**15", str(10 ** 15)).replace("2**44", str(2 ** 44)) for a in args]
    if script == "train.py":
        args = train_args(data_dir, tmp_path / "out", "--max_iters=2", *args)
    elif script == "sample.py":
        # measured choices off: on a CPU with nothing to time, sample.py prints its choice before decoding fails
        args = [f"--out_dir={trained_run[0]}", "--device=cpu", "--dtype=float32", "--threads=1", *args]
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(REPO / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr)
    assert re.fullmatch(r"error: out of memory: tried to allocate [0-9.,]+ [PE]iB; lower the sizes of this run "
                        + re.escape(settings), line), line


@pytest.mark.parametrize("error,expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
                            "79.11 GiB of which 3.50 GiB is free."),
     "error: out of memory: tried to allocate 20.0 GiB; lower the sizes of this run (batch_size)"),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GiB, other allocations: 2.00 MiB, max allowed: "
                  "9.07 GiB). Tried to allocate 256.00 MiB on private pool."),
     "error: out of memory: tried to allocate 256.0 MiB; lower the sizes of this run (batch_size)"),
    (MemoryError(), "error: out of memory; lower the sizes of this run (batch_size)"),
    (RuntimeError("std::bad_alloc"), "error: out of memory; lower the sizes of this run (batch_size)"),
    (RuntimeError("Storage size calculation overflowed with sizes=[1000000000000000, 1000000000000000]"),
     "error: out of memory; lower the sizes of this run (batch_size)"),
])
def test_every_allocator_s_failure_is_the_same_one_line(capsys, error, expected):
    """CUDA's, MPS's and Python's ways of running out, which this CPU machine cannot produce, and a size whose
    byte count overflows 64 bits (its end-to-end case is in test_errors' table)."""
    def main():
        raise error

    with pytest.raises(SystemExit) as info:
        run_main(main, memory_settings=("batch_size",))
    assert info.value.code == 1
    assert_one_error_line(capsys.readouterr().err, expected)


def test_another_runtime_error_is_not_called_out_of_memory():
    def main():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        run_main(main, memory_settings=("batch_size",))


# ----------------------------------------------------------------------------------------- the learner's model.py

def in_model_py(source):
    """Code compiled as if it were model.py's, as a learner's edit to it would be."""
    from gptkit.base.errors import MODEL_PY
    return compile(source, str(MODEL_PY), "exec")


def learner_function(source, name):
    namespace = {"torch": torch}
    exec(in_model_py(source), namespace)
    return namespace[name]


def raised(call):
    try:
        call()
    except Exception as e:
        return e
    raise AssertionError("nothing was raised")


def test_a_model_py_that_does_not_compile_or_import_is_one_line_naming_its_line():
    from gptkit.base.errors import model_py_error
    line = model_py_error(raised(lambda: in_model_py("import torch\n\ndef token_shift(h, share)\n    return h\n")))
    assert line.startswith("model.py, line 3: SyntaxError: expected ':'"), line  # the code too, read from a file
    assert model_py_error(raised(lambda: exec(in_model_py("import math\nx = math.tau\ny = undefined\n"), {}))) == \
        "model.py, line 3: NameError: name 'undefined' is not defined"
    assert model_py_error(raised(lambda: compile("def f(:\n", "other.py", "exec"))) is None


def test_a_model_py_without_a_name_the_tools_import_or_missing_is_one_line():
    from gptkit.base.errors import model_py_error

    def import_missing_name():
        from model import NoSuchBlock  # as gptkit imports MLP from a model.py where it was renamed
        return NoSuchBlock

    line = model_py_error(raised(import_missing_name))
    assert line == ("model.py has no NoSuchBlock, which tests/test_errors.py imports from it: the tools use the model "
                    "through that name; keep it (a renamed class may keep its old name too, as `OldName = NewName`)")
    assert model_py_error(ModuleNotFoundError("No module named 'model'", name="model")) == \
        "model.py is missing: every tool builds its model from it; put it back"
    assert model_py_error(raised(lambda: __import__("no_such_module_here"))) is None


def test_a_model_py_function_whose_signature_no_longer_fits_its_callers_is_one_line(monkeypatch):
    """token_shift called by model.py's Block, and GPT.forward called through nn.Module by the sampler: each line
    names the definition, its signature now, and the call that expects the old one (the file, line and code)."""
    import model as model_py
    from conftest import random_tokens, tiny_model
    from gptkit.base.errors import model_py_error
    from gptkit.sampling.decoding import generate
    monkeypatch.setattr(model_py, "token_shift", learner_function("def token_shift(h, share):\n    return h\n",
                                                                  "token_shift"))
    model = tiny_model(token_shift=True)
    line = model_py_error(raised(lambda: model(random_tokens((1, 4)))))
    assert re.fullmatch(r"model\.py, line 1: token_shift\(h, share\) cannot take what model\.py, line \d+ "
                        r"\(`return self\.shift\(h, self\.shares\[branch\],.*`\) gives it: "
                        r"token_shift\(\) takes 2 positional arguments but 3 were given; keep its parameters, or "
                        r"give a new one a default", line), line
    forward = "def forward(self, idx):\n    return self.head(self.embed(idx)[0]), None\n"
    monkeypatch.setattr(model_py.GPT, "forward", learner_function(forward, "forward"))
    monkeypatch.setattr(model_py.GPT.forward, "__qualname__", "GPT.forward")
    line = model_py_error(raised(lambda: generate(tiny_model(), random_tokens((1, 4)), 3)))
    assert re.fullmatch(r"model\.py, line 1: GPT\.forward\(self, idx\) cannot take what "
                        r"gptkit/sampling/decoding\.py, line \d+ \(`.*model\(idx, idx\).*`\) gives it: "
                        r"GPT\.forward\(\) takes 2 positional arguments but 3 were given; .*", line), line


def test_a_tool_reading_a_model_py_method_an_edit_renamed_is_one_line(monkeypatch):
    """GPT.flops_per_token removed (or renamed), as train.py's report reads it: the line names the class, the name
    and the tool's line that reads it. A slip in model.py's own code (a forward reading an attribute its __init__
    no longer sets) keeps its traceback, which shows the learner their code."""
    import model as model_py
    from conftest import random_tokens, tiny_model
    from gptkit.base.errors import model_py_error
    model = tiny_model()
    monkeypatch.delattr(model_py.GPT, "flops_per_token")
    line = model_py_error(raised(lambda: model.flops_per_token(8)))  # as gptkit/training/reporting.py reads it
    assert re.fullmatch(r"model\.py: GPT has no flops_per_token, which tests/test_errors\.py, line \d+ "
                        r"\(`.*model\.flops_per_token.*`\) reads: an edit renamed or removed it; keep it \(a renamed "
                        r"method may keep its old name too, as `flops_per_token = new_name`\)", line), line
    del model.transformer.h[0].mlp.act  # read by MLP.forward, model.py's own code
    assert model_py_error(raised(lambda: model(random_tokens((1, 4))))) is None
    assert model_py_error(raised(lambda: object().flops_per_token)) is None  # not a model.py class


def test_a_gpt_config_field_named_as_a_training_setting_is_one_line(monkeypatch):
    """A field the learner adds to GPTConfig under the name of one of train.py's own settings (seed): one line
    naming both, not two settings under one name."""
    from dataclasses import field, make_dataclass
    from gptkit.base.errors import UserError
    from gptkit.base.settings import settings
    from gptkit.training.train_config import TrainConfig
    from model import GPTConfig
    edited = make_dataclass("GPTConfig", [("seed", int, field(default=0))], bases=(GPTConfig,))
    edited.__module__ = "model"
    monkeypatch.setitem(TrainConfig.__annotations__, "model", edited)
    with pytest.raises(UserError, match=r"^model\.py: GPTConfig\.seed has the name of another setting of "
                                        r"TrainConfig \(train_config\.py\): the command line and config files name "
                                        r"each setting once; give it another name$"):
        settings(TrainConfig)


def test_an_error_inside_a_model_py_function_or_elsewhere_keeps_its_traceback():
    """A TypeError that a learner's function body raises shows their code in a traceback; so does one of a function
    that is not model.py's."""
    from gptkit.base.errors import model_py_error
    shift = learner_function("def token_shift(h, share, before=None):\n    return torch.lerp(h)\n", "token_shift")
    assert model_py_error(raised(lambda: shift(torch.ones(2), torch.ones(2)))) is None

    def token_shift(h, share):
        return h

    assert model_py_error(raised(lambda: token_shift(1, 2, 3))) is None


# a Ctrl-C while torch loads (the first second of every script that uses it), raised where `import torch` runs
INTERRUPTED_IMPORT = """
import runpy, sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
sys.argv = [sys.argv[1], "--help"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(f"{name}.py" for name in ROOT_SCRIPTS))
def test_a_ctrl_c_while_torch_loads_is_one_line_and_the_interrupts_status(script):
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, script], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stderr == "error: interrupted\n" and proc.returncode in (130, -signal.SIGINT), (proc.returncode,
                                                                                                proc.stderr)


BROKEN = ("def token_shift(h, share, before=None):", "def token_shift(h, share, before=None)")


@pytest.mark.slow
def test_every_script_says_in_one_line_where_model_py_does_not_run(tmp_path, trained_run, data_dir):
    """The project copied and its model.py edited: a syntax error is one line naming model.py's line in every
    script that imports it, `--help` included (before run_main, through the excepthook); and a token_shift whose
    signature no longer fits its caller, or a forward that returns the loss alone, is one line in training (and
    the latter in analysis)."""
    project = tmp_path / "project"
    project.mkdir()
    scripts = ("train", "sample", "analyze", "explore", "plot", "lab", "export", "bench")
    for part in ("model.py", *(f"{s}.py" for s in scripts), "gptkit", "benchmarks", "config"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, project / part)
    source = (REPO / "model.py").read_text()
    (project / "model.py").write_text(source.replace(*BROKEN))
    line = source[:source.index(BROKEN[0])].count("\n") + 1
    run = str(trained_run[0])
    for command in (["train.py", "--help"], ["sample.py", "--help"], ["analyze.py", "heads", run],
                    ["explore.py", run], ["plot.py", "attention", f"--out_dir={run}"], ["lab.py", "--help"],
                    ["export.py", "--help"], ["bench.py", "--help"]):
        proc = subprocess.run([sys.executable, *command], cwd=project, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, (command, proc.stderr)
        assert_one_error_line(proc.stderr, f"error: model.py, line {line}: SyntaxError: expected ':' "
                                           f"({BROKEN[1]})")
    (project / "model.py").write_text(re.sub(r"\bMLP\b", "FeedForward", source))  # a class renamed
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=project, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, "error: model.py has no MLP, which gptkit/machine/stand_ins.py imports *")
    (project / "model.py").write_text(source.replace(BROKEN[0], "def token_shift(h, share):"))
    args = train_args(data_dir, tmp_path / "out", "--token_shift=True", "--attention_path=fused", "--max_iters=2")
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=project, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: model.py, line {line}: token_shift(h, share) cannot take what *")
    returns = "        return logits, self.token_loss(logits, targets)"
    (project / "model.py").write_text(source.replace(returns, "        return self.token_loss(logits, targets)"))
    new_machine = {**os.environ, "GPTKIT_WISDOM_DIR": str(tmp_path / "new-machine")}
    proc = subprocess.run([sys.executable, "train.py", *args[:-2], "--max_iters=2"], cwd=project,
                          capture_output=True, text=True, timeout=120, env=new_machine)
    assert proc.returncode == 1  # on a machine not yet measured, the measuring is the first to run forward
    assert_one_error_line(proc.stderr, "error: model.py's GPT.forward(idx, targets) returned Tensor: the tools *")
    proc = subprocess.run([sys.executable, "analyze.py", "heads", run], cwd=project, capture_output=True, text=True,
                          timeout=120)
    # its one line alone: the note that model.py changed since the run trained comes only with a model that builds
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, "error: model.py's GPT.forward(idx, targets) returned Tensor: the tools *")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=["INT", "TERM", "USR1"])
def test_a_stop_signal_as_a_finished_script_exits_is_ignored(signum):
    """A scheduler's stop in the last moments of a finished run, while torch cleans up at exit: a traceback from
    torch's atexit callback and status 130, 143 or 138 for a job that was done. The signal here comes from an
    atexit callback that runs after run_main's, as torch's do."""
    code = ("import atexit, os, signal; from gptkit.base.errors import run_main; "
            f"atexit.register(lambda: os.kill(os.getpid(), {int(signum)})); run_main(lambda: print('done'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done\n", "")


def test_sigterm_outside_a_training_loop_is_one_line_and_its_status(trained_run, tmp_path):
    """A scheduler's stop while sample.py writes (or chat.py scores, analyze.py measures): one line and status
    143, as Ctrl-C's is `error: interrupted` and 130, not a silent end."""
    import time

    from conftest import Run
    run = Run([sys.executable, "sample.py", f"--out_dir={trained_run[0]}", "--num_samples=1000",
               "--max_new_tokens=10000", "--device=cpu"], tmp_path / "logs")
    deadline = time.time() + 60
    while not run.stdout.strip() and time.time() < deadline and run.proc.poll() is None:
        time.sleep(0.1)
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 128 + signal.SIGTERM
    assert run.stderr.endswith("error: stopped by SIGTERM\n"), run.stderr
