"""
Turn a text file (or a folder of them) into train.bin, val.bin and meta.json.

Text is streamed in chunks, so memory stays bounded whatever the file size; tokens go
to disk as uint16 when the vocabulary fits and uint32 otherwise.

A dataset is replaced as a whole. Its train.bin, val.bin and meta.json are links through `.current`, itself a
link to one folder under `.versions/`: prepare writes the new dataset into a folder of its own there and then
renames a new `.current` over the old one, so a prepare killed at any moment leaves the old dataset or the new
one, complete, and never a mix. `.prepare.lock` keeps a second prepare of the same dataset out meanwhile.
"""

import codecs
import hashlib
import json
import os
import secrets
import shutil
import stat
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from gptkit.errors import UserError
from gptkit.locks import exclusive
from gptkit.tokenizer import make_tokenizer

PROJECT_DATA = Path(__file__).resolve().parent.parent / "data"
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
CHUNK_BYTES = 1 << 20
TOKEN_DTYPES = {"uint16": 2 ** 16, "uint32": 2 ** 32}  # token file types, and the largest vocabulary each holds


@dataclass
class PrepareConfig:
    input: str = ""  # text file or folder of text files ('' = download tinyshakespeare)
    name: str = "shakespeare_char"  # output folder name under data_dir
    tokenizer: str = "char"  # 'char' or a tiktoken encoding name (gpt2, r50k_base, cl100k_base, ...)
    data_dir: str = ""  # where dataset folders live ('' = this project's data/)
    val_fraction: float = 0.1  # the last this fraction of tokens is the validation split
    dtype: Literal["auto", "uint16", "uint32"] = "auto"  # token file type: 'auto' is uint16 when the vocabulary fits

    def __post_init__(self):
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be between 0 and 1 (got {self.val_fraction})")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name must be a plain folder name (got {self.name!r})")


def data_root(data_dir):
    return Path(data_dir) if data_dir else PROJECT_DATA


def shown(path):
    """A path as text that prints and stores anywhere: bytes of the name that are not UTF-8 appear escaped (\\xff),
    where str() would hold lone surrogates that no UTF-8 file or terminal takes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def sha256_of(paths):
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK_BYTES), b""):
                h.update(block)
    return h.hexdigest()


def download_shakespeare(dest):
    """Fetch tinyshakespeare once and check it is the exact char-rnn file."""
    if not dest.exists():
        print(f"downloading {SHAKESPEARE_URL}")
        try:
            with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
                body = r.read()
        except OSError as e:
            raise UserError(f"could not download tinyshakespeare ({getattr(e, 'reason', e)}); "
                            "pass a local copy with --input=PATH/input.txt") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".part")
        tmp.write_bytes(body)
        os.replace(tmp, dest)
    digest = sha256_of([dest])
    if digest != SHAKESPEARE_SHA256:
        raise UserError(f"{shown(dest)} is not the tinyshakespeare file (sha256 {digest}); delete it and run again")
    return dest


def source_files(path):
    """The documents to read: the file itself, or every file under a folder in sorted order. Only regular files:
    prepare reads its input more than once (vocabulary, tokens, checksum), which a pipe cannot give, and its size
    reads as 0."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise UserError(f"input folder {shown(path)} holds no files")
        return files
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"input file not found: {shown(path)}") from None
    except OSError as e:
        raise UserError(f"could not read {shown(path)} ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        kind = "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise UserError(f"input {shown(path)} is {kind}, not a regular file: prepare reads its input more than "
                        "once; save the text to a file and pass that")
    return [path]


def read_text(path, progress, cut=len):
    """Yield the file's text in pieces of about CHUNK_BYTES, checking that it is UTF-8. Each piece ends where
    cut(text) says, the rest carried to the next; where cut finds no place (0) the piece is cut at its end
    anyway, so memory stays bounded however long the lines are."""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    carry, offset = "", 0
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK_BYTES), b""):
                if b"\x00" in block:
                    raise UserError(f"{shown(path)} looks like a binary file (NUL byte at offset "
                                    f"{offset + block.index(0)}), not UTF-8 text")
                try:
                    text = carry + utf8.decode(block)
                except UnicodeDecodeError as e:
                    raise UserError(f"{shown(path)} is not UTF-8 text: byte 0x{block[e.start]:02x} at offset "
                                    f"{offset + e.start}") from None
                offset += len(block)
                progress.update(len(block))
                at = cut(text) or len(text)
                yield text[:at]
                carry = text[at:]
    except OSError as e:
        raise UserError(f"could not read {shown(path)} ({e.strerror or e})") from None
    try:
        carry += utf8.decode(b"", final=True)
    except UnicodeDecodeError:
        raise UserError(f"{shown(path)} is not UTF-8 text: it ends in the middle of a character") from None
    if carry:
        yield carry


def bpe_cut(text):
    """Where a piece of text may end without changing its BPE tokens: before the last whitespace that follows a
    letter or digit. Every tiktoken encoding's pre-tokenizer starts a new piece there (a word never runs
    into the whitespace after it, and whitespace is matched looking forward only), so encoding the pieces
    one by one gives the tokens of the whole. 0 where there is no such place."""
    end = len(text)
    while True:
        at = max(text.rfind(c, 0, end) for c in " \t\n\r")
        if at <= 0 or text[at - 1].isalnum():
            return max(at, 0)
        end = at


def progress_bar(files, desc):
    # only on a terminal: piped or logged stderr gets just the one-line error, not bar redraws
    return tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, desc=desc, disable=None)


def corpus_chars(files):
    chars = set()
    with progress_bar(files, "vocabulary") as bar:
        for path in files:
            for text in read_text(path, bar):
                chars.update(text)
    return chars


def encode_to_file(files, tok, dtype, out_path):
    """Encode every document into one flat token file; BPE documents are separated by end-of-text."""
    count = 0
    eot = getattr(tok, "eot_token", None) if len(files) > 1 else None
    cut = bpe_cut if tok.kind == "tiktoken" else len
    with open(out_path, "wb") as out, progress_bar(files, "tokenizing") as bar:
        for path in files:
            for text in read_text(path, bar, cut):
                ids = np.asarray(tok.encode(text), dtype=dtype)
                out.write(ids.tobytes())
                count += len(ids)
            if eot is not None:
                out.write(np.asarray([eot], dtype=dtype).tobytes())
                count += 1
    return count


def split_tokens(all_path, outputs, dtype, n_tokens, val_fraction):
    """Cut the token file in two: the head becomes the train file, the tail the val file."""
    n_train = min(int(n_tokens * (1 - val_fraction)), n_tokens - 1)  # as nanoGPT: int(n * 0.9)
    itemsize = np.dtype(dtype).itemsize
    tokens = np.memmap(all_path, dtype=dtype, mode="r")
    with open(outputs["val.bin"], "wb") as f:
        for start in range(n_train, n_tokens, CHUNK_BYTES):
            f.write(tokens[start:min(start + CHUNK_BYTES, n_tokens)].tobytes())
    del tokens
    os.truncate(all_path, n_train * itemsize)
    os.replace(all_path, outputs["train.bin"])
    return n_train, n_tokens - n_train


OUTPUTS = ("train.bin", "val.bin", "meta.json")
CURRENT, VERSIONS, LOCK = ".current", ".versions", ".prepare.lock"


def prepare(cfg):
    """Write data_dir/name/{train.bin,val.bin,meta.json}, replacing the dataset there as a whole; return the
    folder and the metadata."""
    out_dir = data_root(cfg.data_dir) / cfg.name
    if not cfg.input and cfg.name != "shakespeare_char":
        raise UserError("pass the text to prepare with --input=PATH")
    files = source_files(cfg.input) if cfg.input else None
    check_room(out_dir)
    with dataset_lock(out_dir):
        files = files or [download_shakespeare(out_dir / "input.txt")]
        if sum(f.stat().st_size for f in files) == 0:
            raise UserError(f"input {shown(cfg.input or files[0])} is empty")
        version = new_version(out_dir)
        try:
            meta = write_dataset(cfg, files, version)
            commit(out_dir, version)
        finally:
            remove_leftovers(out_dir)
    return out_dir, meta


def check_room(out_dir):
    """out_dir is a folder (or can become one) and no folder stands where the dataset's files go; checked before
    anything is written there."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"cannot write the dataset to {shown(out_dir)} (a file of that name is in the way)")
    for name in OUTPUTS:
        if (out_dir / name).is_dir():
            raise UserError(f"{shown(out_dir / name)} is a folder where the dataset's {name} goes; "
                            "move it out of the way")


def dataset_lock(out_dir):
    """Hold the dataset folder's lock for the whole prepare: a second prepare of the same dataset stops at once
    with one line instead of writing over the first one's files."""
    return exclusive(out_dir / LOCK, f"cannot write the dataset to {shown(out_dir)}",
                     lambda holder: f"{shown(out_dir)} is being prepared by another data/prepare.py{holder}; "
                                    "wait for it to end or pick another --name")


def new_version(out_dir):
    """A new, empty folder under out_dir/.versions to hold one whole dataset."""
    path = out_dir / VERSIONS / secrets.token_hex(8)
    path.mkdir(parents=True)
    return path


def commit(out_dir, version):
    """Make `version` the dataset readers find, in one step: with train.bin, val.bin and meta.json links through
    .current, renaming a new .current into place swaps all three at once."""
    link_names(out_dir)
    point(out_dir / CURRENT, f"{VERSIONS}/{version.name}")
    sync([out_dir])  # a prepare that returned stays done after a power cut


def link_names(out_dir):
    """Make train.bin, val.bin and meta.json links through .current without changing what a reader finds at any
    moment. Files at those names (from a prepare before versions, or a copy that followed the links) are first
    kept, by hard links, as a version of their own that .current points to."""
    through = {name: f"{CURRENT}/{name}" for name in OUTPUTS}
    if all(os.path.islink(out_dir / name) and os.readlink(out_dir / name) == to for name, to in through.items()):
        return
    kept = new_version(out_dir)
    for name in OUTPUTS:
        if (out_dir / name).is_file():
            os.link(out_dir / name, kept / name)
    current = out_dir / CURRENT
    if current.is_dir() and not current.is_symlink():  # a copy made it a folder; the names above are kept
        shutil.rmtree(current)
    point(current, f"{VERSIONS}/{kept.name}")
    for name, to in through.items():
        point(out_dir / name, to)


def point(link, target):
    """Make `link` a symbolic link to `target` in one step: a new link renamed over the name."""
    tmp = link.with_name(f"{link.name}.tmp")
    tmp.unlink(missing_ok=True)  # left by a prepare killed here
    os.symlink(target, tmp)
    os.replace(tmp, link)


def remove_leftovers(out_dir):
    """Delete every version but the one readers find (older datasets, and what failed or killed prepares left),
    and any half-made link."""
    current = os.path.realpath(out_dir / CURRENT)
    for version in (out_dir / VERSIONS).iterdir():
        if os.path.realpath(version) != current:
            shutil.rmtree(version)
    for name in (CURRENT, *OUTPUTS):
        (out_dir / f"{name}.tmp").unlink(missing_ok=True)


def sync(paths):
    """Flush files or folders to disk (fsync)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_dataset(cfg, files, version):
    """Tokenize files into the version folder's train.bin, val.bin and meta.json, flushed to disk before they
    can become the dataset readers find; the metadata."""
    tok = make_tokenizer(cfg.tokenizer, corpus_chars(files) if cfg.tokenizer == "char" else None)
    dtype = cfg.dtype if cfg.dtype != "auto" else "uint16" if tok.vocab_size <= TOKEN_DTYPES["uint16"] else "uint32"
    if tok.vocab_size > TOKEN_DTYPES[dtype]:
        raise UserError(f"the vocabulary has {tok.vocab_size:,} tokens, more than {dtype} holds "
                        f"({TOKEN_DTYPES[dtype]:,}); use --dtype=uint32 or --dtype=auto")
    all_path, outputs = version / "all.bin", {name: version / name for name in OUTPUTS}
    n_tokens = encode_to_file(files, tok, dtype, all_path)
    if n_tokens < 2:
        raise UserError(f"input has only {n_tokens} token(s): too little text to split into train and val")
    n_train, n_val = split_tokens(all_path, outputs, dtype, n_tokens, cfg.val_fraction)
    meta = dict(tok.to_meta(), vocab_size=tok.vocab_size, dtype=dtype, train_tokens=n_train, val_tokens=n_val,
                train_sha256=sha256_of([outputs["train.bin"]]), val_sha256=sha256_of([outputs["val.bin"]]),
                source=shown(cfg.input or files[0]), source_sha256=sha256_of(files))
    meta["sha256"] = meta_checksum(meta)
    outputs["meta.json"].write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    sync([*outputs.values(), version, version.parent])
    return meta


def meta_checksum(meta):
    """A dataset's meta.json checks itself: sha256 of its other fields as compact JSON with sorted keys."""
    fields = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
