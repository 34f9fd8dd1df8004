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
import os
import pickle
import re
import warnings
from pathlib import Path

import torch

from gptkit.errors import UserError, first_line, no_links
from model import GPT, GPTConfig

FORMAT_VERSION = 1
HEADER = b"gptkit-checkpoint sha256=%s size=%020d\n"
HEADER_SIZE = len(HEADER % (b"0" * 64, 0))
HEADER_PATTERN = re.compile(rb"gptkit-checkpoint sha256=([0-9a-f]{64}) size=([0-9]{20})\n")
ZIP_MAGIC = b"PK\x03\x04"  # how torch.save's files begin: the unchecked format before the header
BLOCK = 1 << 20


def save_checkpoint(state, path, previous=None):
    """Write to a temporary file, fsync, then rename: a crash leaves the old file or the new, never half of one.
    With previous (a path), the file being replaced is kept there instead of deleted."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    writer = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb", opener=no_links) as f:
            f.write(bytes(HEADER_SIZE))  # its place; the real line goes in once the checksum is known
            writer = HashingWriter(f)
            torch.save(dict(state, format_version=FORMAT_VERSION), writer)
            f.seek(0)
            f.write(HEADER % (writer.sha256.hexdigest().encode(), writer.size))
            f.flush()
            os.fsync(f.fileno())
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        raise write_error(e, writer, path, previous) from None
    sync_folder(path.parent)


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


class HashingWriter:
    """Pass writes on to the file, hashing and counting them, and keep the first OSError: torch.save
    replaces it with a message of its own."""

    def __init__(self, f):
        self.f, self.error = f, None
        self.sha256, self.size = hashlib.sha256(), 0

    def write(self, data):
        try:
            written = self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        self.sha256.update(data)
        self.size += len(data)
        return written

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


MODEL_KEYS = ("model", "model_args", "tokenizer")
TRAINING_KEYS = MODEL_KEYS + ("optimizer", "scaler", "config", "iter_num", "best_val_loss", "rng")


def load_checkpoint(path, map_location="cpu", required=()):
    """The checkpoint's dict, verified against its checksum and loaded without running code;
    refuses one lacking a required key."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a checkpoint file")
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
    if state["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {state['format_version']}, this tool reads {FORMAT_VERSION}")
    missing = [key for key in required if key not in state]
    if missing:
        raise UserError(f"{path} is incomplete: it lacks {', '.join(missing)}")
    return state


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


def model_from_checkpoint(ckpt, path, **overrides):
    """The GPT a checkpoint's model_args (with overrides, e.g. dropout) and weights describe."""
    try:
        config = GPTConfig.from_dict(dict(ckpt["model_args"], **overrides))
    except (ValueError, TypeError) as e:  # written by another version of this tool
        raise UserError(f"{path} was written with model settings this version cannot build ({e})") from None
    model = GPT(config)
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, AttributeError) as e:
        raise UserError(f"{path}'s weights do not fit its model settings ({first_line(e)})") from None
    return model
