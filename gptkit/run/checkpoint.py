"""One checkpoint file: written atomically with a checksum of every byte, read back verified and
without running any pickled code.

The file is one header line, `gptkit-checkpoint sha256=<hex> size=<bytes>`, then the bytes torch.save
wrote. The checksum covers all of them (zip headers and padding included), so a flipped byte anywhere is
caught before torch parses anything; a flip in the header line breaks the line itself. Files written before
the header existed (torch.save's zip alone) still load, unchecked.
"""

import errno
import hashlib
import io
import math
import os
import pickle
import random
import re
import stat
import typing
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from gptkit.base import files
from gptkit.base.errors import RunStopped, UserError, first_line, what_does_not_fit
from gptkit.base.settings import field_type
from gptkit.machine.model_contract import check_forward, merged_lora
from gptkit.machine.stand_ins import ATTENTION_PATHS, KERNELS, install
from gptkit.run.formats import CHECKPOINT_FORMAT, upgraded_checkpoint
from model import GPT, GPTConfig

HEADER = b"gptkit-checkpoint sha256=%s size=%020d\n"
HEADER_SIZE = len(HEADER % (b"0" * 64, 0))
HEADER_PATTERN = re.compile(rb"gptkit-checkpoint sha256=([0-9a-f]{64}) size=([0-9]{20})\n")
ZIP_MAGIC = b"PK\x03\x04"  # how torch.save's files begin: the unchecked format before the header
BLOCK = 1 << 20


def save_checkpoint(state, path, previous=None):
    """Written whole (gptkit/base/files.py): a crash leaves the old file or the new, never half of one.
    With previous (a path), the file being replaced is kept there instead of deleted."""
    path = Path(path)
    writer = None
    try:
        # failed reads writer when the write fails: by then it holds the error torch's zip writer hid
        with files.written_whole(path, "wb", previous=previous,
                                 failed=lambda path, e: write_error(e, writer, path, previous)) as f:
            f.write(bytes(HEADER_SIZE))  # its place; the real line goes in once the checksum is known
            writer = HashingWriter(f)
            torch.save(dict(state, format_version=CHECKPOINT_FORMAT), writer)
            f.seek(0)
            f.write(HEADER % (writer.sha256.hexdigest().encode(), writer.size))
    except (RuntimeError, KeyboardInterrupt) as e:  # the temporary file is gone already
        stop = interruption(e, writer)
        if stop is not None:
            raise stop from None
        raise write_error(e, writer, path, previous) from None
    sync_folder(path.parent)


def interruption(e, writer):
    """What stopped a save that is no failure to write: a KeyboardInterrupt (a second Ctrl-C) or a RunStopped
    from a signal handler. Raised inside a write, torch's zip writer replaces it with a RuntimeError; the writer
    keeps it, and one raised as a write begins (where Python runs the handler of a signal that came while
    torch's own code ran) is the RuntimeError's context."""
    if isinstance(e, KeyboardInterrupt):
        return e
    if writer is not None and writer.error is not None:
        return None if isinstance(writer.error, OSError) else writer.error
    return e.__context__ if isinstance(e.__context__, (KeyboardInterrupt, RunStopped)) else None


def write_error(e, writer, path, previous):
    """One line for a failed save, saying the previous checkpoint is intact only where there is one."""
    if writer is not None and writer.error is not None:
        e = writer.error  # the real cause, e.g. ENOSPC, which torch's zip writer reports as "enforce fail"
    kept = next((p for p in (path, previous) if p is not None and p.is_file()), None)
    intact = f"; the previous checkpoint is intact{f' as {kept}' if kept not in (None, path) else ''}" if kept else ""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space" in str(e):
        return UserError(f"disk full while writing {path}{intact}")
    detail = e.strerror if isinstance(e, OSError) and e.strerror else first_line(e)
    return UserError(f"could not write checkpoint {path} ({detail}){intact}")


class AnotherToolsState(UserError):
    """A checkpoint another tool saved (rl.py's state where train.py's is required): not damage, so a resume never
    falls back past it to an older state, whose saves would then replace it."""


class HashingWriter:
    """Pass writes on to the file, hashing and counting them, and keep the first exception a write raised
    (an OSError, or a KeyboardInterrupt from a signal handler): torch.save replaces it with a RuntimeError
    of its own."""

    def __init__(self, f):
        self.f, self.error = f, None
        self.sha256, self.size = hashlib.sha256(), 0

    def write(self, data):
        try:
            written = self.f.write(data)
            self.sha256.update(data)
            self.size += len(data)
            return written
        except BaseException as e:
            self.error = self.error or e
            raise

    def flush(self):
        self.f.flush()


def sync_folder(folder):
    """Make the renames themselves durable (a power cut after them keeps the new file); not possible everywhere."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Payload(io.RawIOBase):
    """The file from `start` on, as a file of its own: what torch.load reads after the header line."""

    def __init__(self, f, start):
        super().__init__()
        self.f, self.start = f, start
        f.seek(start)

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, buffer):
        return self.f.readinto(buffer)

    def seek(self, offset, whence=io.SEEK_SET):
        return self.f.seek(offset + self.start if whence == io.SEEK_SET else offset, whence) - self.start

    def tell(self):
        return self.f.tell() - self.start


def verified_start(f, path):
    """Where torch.save's bytes begin in f, after checking the header's checksum and size against them;
    0 for a file from before the header."""
    head = f.read(HEADER_SIZE)
    if head.startswith(ZIP_MAGIC):
        return 0
    m = HEADER_PATTERN.fullmatch(head)
    if not m:
        what = "it is empty" if not head else "it does not begin with a checkpoint header"
        raise UserError(f"{path} is damaged or not a checkpoint ({what})")
    expected, size = m.group(1).decode(), int(m.group(2))
    actual_size = os.fstat(f.fileno()).st_size - HEADER_SIZE
    if actual_size != size:
        raise UserError(f"{path} is damaged: it holds {actual_size:,} bytes after its header, "
                        f"the header says {size:,} (truncated or appended to)")
    sha = hashlib.sha256()
    for block in iter(lambda: f.read(BLOCK), b""):
        sha.update(block)
    if sha.hexdigest() != expected:
        raise UserError(f"{path} is damaged: its contents do not match the checksum written with them")
    return HEADER_SIZE


# ---------------------------------------------------------------------------------------------- its fields

def shown(value):
    """A value as an error line shows it: plain data as written (cut short), anything else by its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    name = "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


class Kind:
    """What one value must be: `words` say it in an error line, `test` tells."""

    def __init__(self, words, test):
        self.words, self.test = words, test

    def problem(self, value, where):
        return None if self.test(value) else f"{where} is {shown(value)}, not {self.words}"


class Fields:
    """A dict whose named fields are each of their kind; those in `optional` may be missing. Fields no reader
    uses are not named, so not checked. Iterated, the names a dict must have."""

    def __init__(self, kinds, optional=()):
        self.kinds, self.optional = kinds, set(optional)

    def __iter__(self):
        return (key for key in self.kinds if key not in self.optional)

    def problem(self, value, where):
        if not isinstance(value, dict):
            return f"{where} is {shown(value)}, not a dict"
        for key, kind in self.kinds.items():
            if key not in value:
                if key not in self.optional:
                    return f"{where or 'it'} has no {key}"
            elif problem := kind.problem(value[key], f"{where}.{key}" if where else key):
                return problem
        return None


class Each:
    """A list (or with keyed=True, a dict) each of whose items is of one kind; with least, of at least that many."""

    def __init__(self, kind, keyed=False, least=0):
        self.kind, self.keyed, self.least = kind, keyed, least

    def problem(self, value, where):
        if not isinstance(value, dict if self.keyed else (list, tuple)):
            return f"{where} is {shown(value)}, not a {'dict' if self.keyed else 'list'}"
        if len(value) < self.least:
            return f"{where} is empty"
        for key, item in value.items() if self.keyed else enumerate(value):
            if problem := self.kind.problem(item, f"{where}[{key!r}]"):
                return problem
        return None


class Tagged:
    """A dict whose field `tag` names which Fields the rest of it must have."""

    def __init__(self, tag, variants):
        self.tag, self.variants = tag, variants

    def problem(self, value, where):
        if not isinstance(value, dict):
            return f"{where} is {shown(value)}, not a dict"
        if self.tag not in value:
            return f"{where} has no {self.tag}"
        variant = value[self.tag]
        if not isinstance(variant, str) or variant not in self.variants:
            return f"{where}.{self.tag} is {shown(variant)}, not {' or '.join(map(repr, self.variants))}"
        return self.variants[variant].problem(value, where)


def one_of(choices):
    return Kind(f"one of {', '.join(choices)}", lambda v: isinstance(v, str) and v in choices)


def maybe(**kinds):
    """Fields that may each be missing."""
    return Fields(kinds, optional=kinds)


def plain(words, *types):
    """The Kind of values of these types; a bool is not a number here, though Python counts it one."""
    return Kind(words, lambda v: isinstance(v, types) and (bool in types or not isinstance(v, bool)))


def restorable(words, restore):
    """The Kind of a saved random generator state: one a fresh generator takes."""
    def test(value):
        try:
            restore(value)
        except Exception:  # whatever the generator raises, the state cannot be restored
            return False
        return True
    return Kind(words, test)


NUMBER = Kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v))
COUNT = Kind("a whole number of at least 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
SECONDS = Kind("a number above 0", lambda v: NUMBER.test(v) and v > 0)
TEXT, FLAG, TENSOR = plain("a string", str), plain("True or False", bool), plain("a tensor", torch.Tensor)
DICT = Fields({})
SETTING_KINDS = {int: plain("a whole number", int), float: NUMBER, bool: FLAG, str: TEXT}


def settings(cls):
    """The Fields of a config dataclass saved with asdict: each field of its declared type, or None where it may be
    None (a Literal's choices are left to the dataclass's own checks), and every one optional, since a missing one
    takes its default."""
    hints, kinds = typing.get_type_hints(cls), {}
    for f in fields(cls):
        typed = field_type(hints[f.name])
        if typed is None:  # a type of another kind is left to the dataclass's own checks
            continue
        kind = SETTING_KINDS[typed[0]]
        kinds[f.name] = Kind(f"{kind.words} or None", lambda v, kind=kind: v is None or kind.test(v)) \
            if typed[2] else kind
    return maybe(**kinds)


TORCH_RANDOM = restorable("a torch random state", lambda v: torch.Generator().set_state(v))
RANDOM_STATES = Fields({
    "torch": TORCH_RANDOM,
    "python": restorable("a Python random state", lambda v: random.Random().setstate(v)),
    # saved as gptkit/training/state.py saves it: the key array as an int64 tensor
    "numpy": restorable("a numpy random state", lambda v: np.random.RandomState().set_state(
        (v[0], v[1].numpy().astype(np.uint32), *v[2:]))),
    "sampler": Fields({"generator": TORCH_RANDOM, "position": COUNT}, optional=("position",)),
    "cuda": TENSOR,
}, optional=("cuda",))
OPTIMIZER_STATE = Fields({"state": Each(DICT, keyed=True), "param_groups": Each(Fields({"params": Each(COUNT)}))})
# what load_checkpoint's required= takes: the fields each reader uses, and what each must be
MODEL_KEYS = Fields({
    "model": Each(TENSOR, keyed=True),
    "model_args": settings(GPTConfig),
    "tokenizer": Tagged("tokenizer", {"char": Fields({"vocab": TEXT}), "tiktoken": Fields({"encoding": TEXT}),
                                      "bpe": Fields({"tokenizer_sha256": TEXT, "bpe": DICT})}),
    "model_code": Each(TEXT, keyed=True),  # the fingerprint of each piece of model.py it was trained with
}, optional=("model_code",))
SNAPSHOT_KEYS = Fields({**MODEL_KEYS.kinds, "iter_num": COUNT}, optional=("model_code",))
TRAINING_KEYS = Fields({
    **MODEL_KEYS.kinds,
    "trained": Each(TENSOR, keyed=True),  # with an EMA, which "model" then holds: the weights trained on
    "optimizer": Each(OPTIMIZER_STATE, least=1),  # every model trains through one at least
    "scaler": maybe(scale=NUMBER, growth_factor=NUMBER, backoff_factor=NUMBER, growth_interval=COUNT,
                    _growth_tracker=COUNT),
    "config": maybe(model=DICT),  # its model settings are model_args's
    "iter_num": COUNT,
    "best_val_loss": Kind("a loss (a number of at least 0)", lambda v: NUMBER.test(v) and v >= 0),
    "rng": Each(RANDOM_STATES, least=1),
    "seconds_spent": NUMBER, "loop_seconds": NUMBER, "train_time": NUMBER,  # the last two: earlier versions'
    "wandb_id": Kind("a string or None", lambda v: v is None or isinstance(v, str)),
    # what the run chose for its speed: a resume takes the same, and so continues exactly
    "measured": maybe(dtype=one_of(("float32", "bfloat16", "float16")), attention_path=one_of(ATTENTION_PATHS),
                      threads=COUNT, fitted_from=DICT,
                      # the plan a resume's pace check reads; plans saved before `measuring` was kept lack it
                      planned=Fields({"steps": COUNT, "step": SECONDS, "eval": NUMBER, "final": NUMBER,
                                      "idle_seconds": NUMBER, "measuring": NUMBER}, optional=("measuring",)),
                      kernels=Each(one_of(KERNELS))),
    "best_iter": COUNT,
    "global_batch": COUNT,  # sequences per optimizer step, over every process
    # where stop_task ended the run, else None
    "stopped_by_score": Kind("None or {'task', 'pass_at_1', 'iter'}", lambda v: v is None or Fields(
        {"task": TEXT, "pass_at_1": NUMBER, "iter": COUNT}).problem(v, "") is None),
    # the dataset's tokens_checksum: a resume tells the dataset prepared again under the same name
    "tokens": Kind("a string or None", lambda v: v is None or isinstance(v, str)),
}, optional=("trained", "seconds_spent", "loop_seconds", "train_time", "wandb_id", "measured", "best_iter",
             "global_batch", "model_code", "stopped_by_score", "tokens"))


def load_checkpoint(path, map_location="cpu", required=None):
    """The checkpoint's dict, verified against its checksum and loaded without running code; with required
    (MODEL_KEYS, TRAINING_KEYS), refuses one lacking a field its reader uses or holding one of another kind."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a checkpoint file")
    if path.exists() and not path.is_file():  # never opened: a FIFO would wait for a writer, a device never ends
        raise UserError(f"{path} is {special_kind(path)}, not a checkpoint file; remove it")
    if not path.is_file():
        tmp = path.with_name(path.name + ".tmp")
        unfinished = f" ({tmp.name} is an unfinished write and is never loaded)" if tmp.exists() else ""
        raise UserError(f"no checkpoint at {path}{unfinished}; train one first with `python train.py ...`")
    try:
        with open(path, "rb") as f:
            state = torch_load(Payload(f, verified_start(f, path)), path, map_location)
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise UserError(f"{path} is not a checkpoint written by this tool")
    if state["format_version"] not in range(1, CHECKPOINT_FORMAT + 1):
        raise UserError(f"{path} has checkpoint format {state['format_version']}, this tool reads 1 to "
                        f"{CHECKPOINT_FORMAT}")
    state = upgraded_checkpoint(state)
    if required is not None:
        missing = [key for key in required if key not in state]
        if missing and "rl" in state:  # rl.py's saved state: it lacks what train.py's loop keeps
            raise AnotherToolsState(f"{path} is the state of an rl.py run, which train.py cannot continue; continue "
                                    "it with rl.py, or pick another --out_dir")
        if missing:
            raise UserError(f"{path} is incomplete: it lacks {', '.join(missing)}")
        problem = required.problem(state, "")
        if problem:  # the checksum proves the file is as written, not that what wrote it wrote this tool's fields
            raise UserError(f"{path} is damaged: {problem}")
    return state


def model_header(path, required=MODEL_KEYS):
    """A checkpoint's fields, checked as load_checkpoint checks them, with its weights left unread (torch's meta
    device keeps their shapes alone): what a file is compared with (its model_args, its step) costs no weights."""
    return load_checkpoint(path, map_location="meta", required=required)


def special_kind(path):
    """What a path that is neither a file nor a folder is, in words."""
    mode = path.stat().st_mode
    kinds = [(stat.S_ISFIFO, "a FIFO (a named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def torch_load(f, path, map_location):
    try:
        with warnings.catch_warnings():  # e.g. about a pickle protocol: the error below says all there is
            warnings.simplefilter("ignore")
            return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message starts with advice to load it unsafely; show only what was refused
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line or "nsupported" in line), first_line(e))
        raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain data "
                        f"({detail.rstrip('.')})") from None
    except Exception as e:  # a damaged file fails in many ways: zip, pickle or tensor storage errors
        detail = first_line(e) if isinstance(e, (RuntimeError, OSError, ValueError)) else type(e).__name__
        raise UserError(f"{path} is truncated or not a checkpoint ({detail})") from None


def model_config(ckpt, path, weighed=True, **overrides):
    """The GPTConfig of a checkpoint's model_args (with overrides, e.g. dropout), or one line naming the file,
    where this version cannot build them or (weighed) they ask for another shape than the weights hold."""
    settings = dict(ckpt["model_args"], **overrides)
    # a setting dropped silently would build a different model: one this version does not know is refused
    unknown = sorted(set(settings) - {f.name for f in fields(GPTConfig)})
    if unknown:
        raise UserError(f"{path} was trained with model settings model.py's GPTConfig does not define "
                        f"({', '.join(unknown)}): an option taken out of model.py since, or another version's; "
                        "put it back in GPTConfig to use this run")
    try:
        config = GPTConfig(**settings)
    except (ValueError, TypeError) as e:  # written by another version of this tool
        raise UserError(f"{path} was written with model settings this version cannot build ({e})") from None
    if weighed:
        check_shape(config, ckpt["model"], path)
    return config


# what shapes a model's weights: dropout has none, and a resume may change it
SHAPE_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name != "dropout")


def model_shape(model_args):
    """A checkpoint's model_args as far as they shape its weights; a setting newer than the checkpoint at the default
    it was built with."""
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    return {key: model_args.get(key, defaults[key]) for key in SHAPE_KEYS}


def shape_words(model_args, other):
    """A model's shape beside another's, in words: blocks x width, and where those are the same, the settings
    that tell the two apart."""
    mine, theirs = model_shape(model_args), model_shape(other)
    words = f"{mine['n_layer']} x {mine['n_embd']}"
    apart = [f"{key}={value!r}" for key, value in mine.items() if value != theirs[key]]
    return f"{words} ({', '.join(apart)})" if apart and words == f"{theirs['n_layer']} x {theirs['n_embd']}" \
        else words


def check_finite(weights, path):
    """One line where a checkpoint's weights hold NaN or infinity, which no training run saves (a state written
    by hand, or damaged before its checksum was): every tool would otherwise fail deep in its first pass."""
    bad = next((name for name, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise UserError(f"{path} is damaged: non-finite values in {bad} of its weights, which no training run writes")


def model_from_checkpoint(ckpt, path, **overrides):
    """The GPT a checkpoint's model_args (with overrides, e.g. dropout) and weights describe; LoRA's adapters
    merged into the matrices they adapt, so that every reader (sampling, analysis, export) gets a plain model."""
    config = model_config(ckpt, path, **overrides)
    check_finite(ckpt["model"], path)
    try:
        weights, config = merged_lora(ckpt["model"], config)
    except (RuntimeError, KeyError) as e:  # an adapter missing, or of another shape than its matrix
        raise UserError(f"{path}'s weights do not fit its model settings ({what_does_not_fit(e)})") from None
    except ValueError as e:  # model.py's adapter, as edited, computes what no plain matrix does: it runs as written
        print(f"note: {path}'s LoRA adapters stay beside their matrices: {e}", flush=True)
        weights = ckpt["model"]
    model = GPT(config)
    load_weights(model, weights, path)
    install(model, [])  # the written-out attention where the learner edited it: what they write is what runs
    check_forward(model)
    return model


BLOCK_KEY = re.compile(r"transformer\.h\.(\d+)\.")  # a block's weights


def check_shape(config, weights, path):
    """One line where the settings ask for more blocks or another width than the weights hold (a hand edit):
    n_layer=10**9 would spend hours building the model before its weights were found not to fit, n_embd=2**40
    all the memory there is."""
    blocks = {int(m.group(1)) for key in weights if (m := BLOCK_KEY.match(key))}
    table = weights.get("transformer.wte.weight")
    held = (max(blocks) + 1 if blocks else None, table.shape[-1] if torch.is_tensor(table) and table.ndim else None)
    for name, wanted, found in zip(("n_layer", "n_embd"), (config.n_layer, config.n_embd), held):
        if found is not None and wanted != found:
            raise UserError(f"{path}'s weights do not fit its model settings: {name}={wanted}, its weights "
                            f"{found}")


def load_weights(model, weights, path, what="weights"):
    """Load a checkpoint's weights into model, or one line naming the file."""
    try:
        model.load_state_dict(weights)
    except (RuntimeError, AttributeError) as e:
        raise UserError(f"{path}'s {what} do not fit its model settings ({what_does_not_fit(e)})") from None
