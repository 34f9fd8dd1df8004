"""Write checkpoints atomically and read them back without running any pickled code."""

import errno
import os
import pickle
import warnings
from pathlib import Path

import torch

from gptkit.errors import UserError, first_line
from gptkit.tokenizer import tokenizer_from_meta
from model import GPT, GPTConfig

FORMAT_VERSION = 1


def save_checkpoint(state, path):
    """Write to a temporary file, fsync, then rename: a crash leaves the old file or the new, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    writer = None
    try:
        with open(tmp, "wb") as f:
            writer = Writer(f)
            torch.save(dict(state, format_version=FORMAT_VERSION), writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        if writer is not None and writer.error is not None:
            e = writer.error  # the real cause, e.g. ENOSPC, which torch's zip writer reports as "enforce fail"
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space" in str(e):
            raise UserError(f"disk full while writing {path}; the previous checkpoint is intact") from None
        raise UserError(f"could not write checkpoint {path} ({first_line(e)}); "
                        "the previous checkpoint is intact") from None
    sync_folder(path.parent)


class Writer:
    """Pass writes on to the file, keeping the first OSError: torch.save replaces it with a message of its own."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data):
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self):
        self.f.flush()


def sync_folder(folder):
    """Make the rename itself durable (a power cut after it keeps the new file); not possible everywhere."""
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


MODEL_KEYS = ("model", "model_args", "tokenizer")
TRAINING_KEYS = MODEL_KEYS + ("optimizer", "scaler", "config", "iter_num", "best_val_loss", "rng")


def load_checkpoint(path, map_location="cpu", required=()):
    """The checkpoint's dict, loaded without running code; refuses one lacking a required key."""
    path = Path(path)
    if not path.is_file():
        tmp = path.with_name(path.name + ".tmp")
        unfinished = f" ({tmp.name} is an unfinished write and is never loaded)" if tmp.exists() else ""
        raise UserError(f"no checkpoint at {path}{unfinished}; train one first with `python train.py ...`")
    try:
        with warnings.catch_warnings():  # e.g. about a pickle protocol: the error below says all there is
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message starts with advice to load it unsafely; show only what was refused
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line or "nsupported" in line), first_line(e))
        raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain data "
                        f"({detail.rstrip('.')})") from None
    except Exception as e:  # a damaged file fails in many ways: zip, pickle or tensor storage errors
        detail = first_line(e) if isinstance(e, (RuntimeError, OSError, ValueError)) else type(e).__name__
        raise UserError(f"{path} is truncated or not a checkpoint ({detail})") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise UserError(f"{path} is not a checkpoint written by this tool")
    if state["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {state['format_version']}, this tool reads {FORMAT_VERSION}")
    missing = [key for key in required if key not in state]
    if missing:
        raise UserError(f"{path} is incomplete: it lacks {', '.join(missing)}")
    return state


def model_from_checkpoint(ckpt, path, **overrides):
    """The GPT a checkpoint's model_args (with overrides, e.g. dropout) and weights describe."""
    try:
        config = GPTConfig.from_dict(dict(ckpt["model_args"], **overrides))
    except ValueError as e:  # written by another version of this tool
        raise UserError(f"{path} was written with model settings this version cannot build ({e})") from None
    model = GPT(config)
    model.load_state_dict(ckpt["model"])
    return model


def load_model(out_dir, device):
    """The trained model (in eval mode) and its tokenizer, from out_dir/ckpt.pt alone."""
    path = Path(out_dir) / "ckpt.pt"
    ckpt = load_checkpoint(path, required=MODEL_KEYS)
    return model_from_checkpoint(ckpt, path).to(device).eval(), tokenizer_from_meta(ckpt["tokenizer"])
