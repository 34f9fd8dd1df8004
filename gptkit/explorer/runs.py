"""The runs in the explorer's folder: which are runs, which checkpoint each opens, and each one's summary for
the page (its shape, its scores, its health); a request for one it cannot open is an ApiError."""

import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gptkit.base.errors import UserError, first_line
from gptkit.data.conversations import MARKERS
from gptkit.data.dataset import file_identity
from gptkit.data.tokenizer import describe_vocabulary
from gptkit.lab.ladder import RUNGS
from gptkit.run.checkpoint import MODEL_KEYS, load_checkpoint, model_config
from gptkit.run.metrics import read_metrics
from gptkit.run.run_folder import RunDir
from gptkit.sampling.decoding import why_it_sees_ahead
from gptkit.training.starting import lora_line
from model import GPT, GPTConfig, count_params


class ApiError(Exception):
    """A request the explorer refuses: an HTTP status and one line."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------- runs


def checkpoint_of(folder):
    """The checkpoint the explorer opens of a run folder (RunDir.shown), or None."""
    return RunDir(folder).shown()


def child_run(root, child):
    """The resolved folder of root's child when it is a run of root (a link leading out of root is not), the
    child itself when it cannot be read (its summary says why), else None."""
    try:
        if not child.is_dir() or not child.resolve().is_relative_to(root):
            return None
        return child.resolve() if checkpoint_of(child) else None
    except OSError:
        return child


def find_runs(root):
    """{name: folder} as the root is now: the root itself when it is a run (named as its folder), else every run
    folder directly inside it. Raises OSError when the root cannot be read."""
    root = Path(root).resolve()
    if checkpoint_of(root):
        return {root.name: root}
    found = {child.name: child_run(root, child) for child in sorted(root.iterdir())}
    return {name: folder for name, folder in found.items() if folder is not None}


def find_run(root, name):
    """The folder of the run named name as the root is now, or None: one name, never a path."""
    root = Path(root).resolve()
    if checkpoint_of(root):
        return root if name == root.name else None
    if name in ("", ".", "..") or "/" in name or "\0" in name or not can_name_a_folder(name):
        return None
    return child_run(root, root / name)


NAME_MAX = 255  # bytes in one folder's name, on the file systems of Linux, macOS and Windows


def can_name_a_folder(name):
    """Whether name can be a folder's name here: one the file system can spell (not a lone surrogate, which a
    page's JSON may hold) of at most NAME_MAX bytes. Another is no run's, and asking the system for it fails."""
    try:
        return len(os.fsencode(name)) <= NAME_MAX
    except UnicodeEncodeError:
        return False


# an absolute path in a line: one after a space, a quote or a parenthesis ('/home/...', 'C:\\Users\\...')
ABSOLUTE_PATH = re.compile(r"""(?<![^\s'"(])(?:/|[A-Za-z]:\\)[^\s'"()]+""")


def without_paths(line, folder=None):
    """line as an answer may hold it: a path inside folder's parent from there (runs/x/best.pt), any other
    absolute path by its last name alone. An answer says where in the runs a problem is, never where this machine
    keeps them: the page may be reached from another machine, and paths name users and folders."""
    base = Path(folder).resolve().parent if folder is not None else None
    if base is not None and base != base.parent:  # the file system's root is every path's start
        line = line.replace(str(base) + os.sep, "")
    return ABSOLUTE_PATH.sub(lambda m: re.split(r"[\\/]", m.group().rstrip("\\/"))[-1] or m.group(), line)


def inside(path, folder):
    """path, refused in one line when it is a link leading out of folder: a run's files are read from its own."""
    if not path.resolve().is_relative_to(Path(folder).resolve()):
        raise UserError(f"{path.name} is a link leading out of the run's folder; the explorer reads only the files "
                        "inside it")
    return path


def shown(name):
    """A folder's name as the page shows it: a name that is not UTF-8 text (Linux allows any bytes) with its
    bad bytes replaced, which JSON and URLs can carry."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def number(value):
    """A finite number, else None: a hand-edited metrics.jsonl may hold NaN, Infinity or text where one goes."""
    return value if type(value) in (int, float) and math.isfinite(value) else None


def attention_note(model):
    """What the page says of a model's attention: none, the future seen (causal=False, or a model.py whose mask an
    edit took out, its settings causal), equal weights; None for the rest."""
    c = model.config
    if c.n_layer == 0:
        return "a bigram model has no attention: each prediction comes from the current token alone"
    if why := why_it_sees_ahead(model):
        return (f"{why}: each token also attends to the tokens after it, the very ones it must predict, so it "
                "learned to copy the answer; that is cheating, and it fails when the model writes, where no later "
                "token exists yet")
    if c.attention == "uniform":
        return "uniform attention: every token a position can see gets the same weight, 1 / (how many it sees)"
    return None


def holds_chat_markers(chars):
    """Whether a char-level vocabulary (a string, or a tokenizer's stoi) holds the three chat markers of
    gptkit/data/conversations.py: a chat run's, which the Write panel talks to (a question in, an answer out)."""
    return all(c in chars for c in MARKERS.values())


@dataclass
class Summary:
    """What the runs list shows of a run, read from its checkpoint and metrics.jsonl."""

    name: str
    folder: Path
    checkpoint: Path = None
    config: GPTConfig = None
    params: int = 0
    tokenizer: str = ""
    tokenizer_kind: str = ""  # 'char', 'bpe' or 'tiktoken'
    error: str = None
    identity: tuple = None  # the checkpoint file's identity when read: another one is read again
    iter_num: int = None  # the step its weights are of, where the checkpoint says
    chat: bool = False  # a chat run: its char-level vocabulary holds the chat markers
    lora: str = None  # a LoRA run's: train.py's line on what its adapters trained

    def to_json(self):
        out = {"name": shown(self.name), "error": self.error, "settings": None, "params": None, "iterations": None,
               "final_val_loss": None, "bits_per_char": None, "tokenizer": self.tokenizer,
               "tokenizer_kind": self.tokenizer_kind, "rung": lab_rung(self.folder), "health": None,
               "checkpoint": None, "step": None, "metrics_error": None, "chat": self.chat, "lora": self.lora,
               "written": None}
        if self.error is None:
            # which write of the checkpoint file it is: a run trained again to the same step is another model
            written = ":".join(map(str, self.identity[1])) if self.identity else None
            out.update(settings=self.config.describe(), params=self.params, checkpoint=self.checkpoint.name,
                       step=self.iter_num, written=written,
                       **finished(self.folder, self.tokenizer_kind))
        return out


def finished(folder, tokenizer_kind):
    """The last iteration and the final val loss (the whole-split score, else the last evaluation) a run logged,
    its final score in bits per character, what its health record said (train.py's overfitting warning), if it
    wrote one, and why its metrics.jsonl cannot be read, if it cannot: the run still opens."""
    try:
        records = run_records(folder)
    except UserError as e:
        return {"metrics_error": without_paths(first_line(e), folder)}
    iters = [r["iter"] for r in records if type(r.get("iter")) is int]
    losses = {kind: [v for r in records if r.get("kind") == kind and (v := number(r.get("val_loss"))) is not None]
              for kind in ("final", "eval")}
    health = [r for r in records if r.get("kind") == "health"]
    finals = [r for r in records if r.get("kind") == "final"]
    return {"iterations": max(iters, default=None),
            "final_val_loss": (losses["final"] or losses["eval"] or [None])[-1],
            "bits_per_char": final_bits_per_char(finals[-1], tokenizer_kind) if finals else None,
            "health": health_note(health[-1]) if health else None}


def final_bits_per_char(record, tokenizer_kind):
    """A final score in bits per character: what train.py logged beside it (gptkit.data.dataset.bits_per_char, from
    the dataset's characters), or for a char-level run from before it logged that, the loss over ln 2 (a token
    is a character); None where the run's dataset did not count its characters."""
    logged, loss = number(record.get("bits_per_char")), number(record.get("val_loss"))
    if logged is None and tokenizer_kind == "char" and loss is not None:
        return loss / math.log(2)
    return logged


# why a run shows no curves and no timeline where its folder has no metrics.jsonl (run_records gives [] then)
NO_METRICS = "its folder has no metrics.jsonl, where train.py records it (deleted, or not copied with the checkpoint)"


def run_records(folder):
    """The records of a run's metrics.jsonl, none when it has none; one line when they cannot be read. The run may be
    training: a last line it is writing now is not one yet."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    inside(path, folder)
    return read_metrics(folder, writing=True)


def health_note(record):
    """The health record as the run card's note; None for one not of the shape train.py writes."""
    it, best_iter, best_loss, why = (record.get(k) for k in ("iter", "best_iter", "best_val_loss", "overfitting"))
    if type(it) is not int or type(best_iter) is not int or number(best_loss) is None or not isinstance(why, str):
        return None
    return f"overfitting from iteration {it:,}: {why}. best.pt keeps iteration {best_iter:,} (val loss {best_loss:.4f})"


def lab_rung(folder):
    """{'name', 'step', 'adds', 'cheats'} of the attention lab's rung this run folder is (its lab.json names it),
    step counted along the lab's path from the bigram; None for any other run. A rung cheats as the lab's table
    says: the encoder, and any whose model saw the tokens after each position (a mask taken out of model.py)."""
    try:
        row = json.loads(inside(folder / "lab.json", folder).read_text(encoding="utf-8"))
        step, rung = next((i, r) for i, r in enumerate(RUNGS) if r.name == row["rung"])
    except (OSError, UserError, ValueError, KeyError, TypeError, StopIteration, RecursionError):
        return None
    return {"name": rung.name, "step": step, "adds": rung.adds, "cheats": rung.cheats or row.get("sees_ahead") is True}


def identity_of(folder):
    """(path, file identity) of the checkpoint a run opens, or None when it cannot be told."""
    try:
        path = checkpoint_of(folder)
        return (path, file_identity(path.stat())) if path else None
    except OSError:
        return None


def merged_count(config):
    """(the parameters of a LoRA run's model as the explorer runs it, its adapters merged into their matrices, and
    train.py's line on what the adapters trained), counted by model.py on models of its shape on torch's meta
    device: no weights are made."""
    with torch.device("meta"):
        return GPT(replace(config, lora_rank=0)).num_params(), lora_line(GPT(config))


def summarize(name, folder):
    """A run's summary, or its error as one line: a damaged, foreign or unreadable run does not stop the others."""
    identity = None
    try:
        if shown(name) != name:
            raise UserError("its folder's name is not UTF-8 text, which the page cannot ask for; rename the folder")
        path = checkpoint_of(folder)
        if path is None:
            raise UserError(f"no checkpoint in {folder} any more")
        inside(path, folder)
        identity = identity_of(folder)
        ckpt = load_checkpoint(path, required=MODEL_KEYS)
        config = model_config(ckpt, path)
        params, lora = merged_count(config) if config.lora_rank else (count_params(ckpt["model"], config), None)
        step, meta = ckpt.get("iter_num"), ckpt["tokenizer"]
        chat = (holds_chat_markers(meta["vocab"]) if meta["tokenizer"] == "char" and isinstance(meta.get("vocab"), str)
                else bool(meta.get("chat")))  # a BPE's markers: tokens of their own, named in its "chat"
        return Summary(name, folder, path, config, params, describe_vocabulary(meta), meta["tokenizer"],
                       identity=identity, iter_num=step if type(step) is int else None, chat=chat, lora=lora)
    except OSError as e:
        return Summary(name, folder, error=without_paths(f"cannot read {e.filename or folder} ({e.strerror or e})",
                                                         folder))
    except (UserError, ValueError, KeyError, TypeError) as e:
        return Summary(name, folder, error=without_paths(str(e).splitlines()[0] if str(e) else type(e).__name__,
                                                         folder), identity=identity)

