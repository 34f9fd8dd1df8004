"""
Turn a corpus into a dataset: its documents tokenized on every core into the train and val splits' token files
(shards where a split is big), and a meta.json that names them with their checksums and the sources read.

Memory stays bounded whatever the corpus size: documents are read in pieces, a few batches are in flight, and
tokens go straight to disk (uint16 when the vocabulary fits, uint32 otherwise). A prepare saves where it is as
it goes; stopped in any way (Ctrl-C, SIGTERM, SIGKILL), the same command continues from there, and the dataset
readers find is replaced only once the new one is whole (see gptkit/data/versions.py). A dataset made from other
text or with another tokenizer is never replaced unasked: runs trained on it need its token ids.

Splits: a corpus of text files only is cut by position, the last val_fraction of its tokens in val (as nanoGPT,
so tinyshakespeare's split is byte for byte the one it always was). A corpus with records (JSON Lines, Parquet)
is split by document, each document's side decided by a hash of its text, so adding files never moves one.
"""

import hashlib
import json
import os
import shutil
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np

from gptkit.base.errors import RunStopped, UserError
from gptkit.base.files import refuse_link, write_whole
from gptkit.base.progress import progress as bar_or_lines
from gptkit.base.settings import closest, comma_items
from gptkit.base.signals import StopSignals
from gptkit.data.chat_preparing import mixed_text, write_chat_dataset
from gptkit.data.conversations import is_conversation_file
from gptkit.data.bpe import (TOKENIZER_FILE, WordCounts, check_vocab_size, merges_table, save_tokenizer, saved_checksum,
                             tokenizer_fields, train_bpe)
from gptkit.data.shards import CHUNK_TOKENS, ShardWriter, token_dtype, tokenized
from gptkit.data.sources import (Reader, Tally, kind_of, read_record, same_source, sha256_of, shown, source_files,
                                 source_record)
from gptkit.data.synthetic import SYNTHETIC, write_source
from gptkit.data.tasks import TASKS
from gptkit.data.tokenizer import (TiktokenTokenizer, TrainedBPE, make_tokenizer, prepare_options, same_bpe,
                                   trained_size)
from gptkit.data.versions import (LINKED, bare, check_room, commit, dataset_lock, remove_bare, remove_leftovers,
                                  stopped_work, sync, work_folder)

PROJECT_DATA = Path(__file__).resolve().parents[2] / "data"
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394
CHAR_SEPARATOR = "\n\n"  # after each record's text, char-level: a blank line, from the characters text already has
BATCH_CHARS = 4 << 20  # text per batch sent to a tokenizing process
MOST_WORKERS = 512  # a process each: a typo'd count must not start thousands
SAVE_EVERY = 10.0  # seconds between saved states, besides one at every finished shard


@dataclass
class PrepareConfig:
    input: str = ""  # a text, .jsonl(.gz/.zst) or .parquet file, or a folder of them ('' = download tinyshakespeare)
    synthetic: str = ""  # instead of --input, text a seeded generator makes: 'repeats' or 'tasks' (gptkit/data/synthetic.py)
    name: str = ""  # output folder name under data_dir ('' = shakespeare_char, or the --synthetic corpus's name)
    tokenizer: str = "char"  # 'char', 'bpe' (trained on this corpus) or a tiktoken encoding (gpt2, cl100k_base, ...)
    vocab_size: int = 0  # with --tokenizer=bpe: the tokens to train, the 256 bytes and <|endoftext|> included
    show_merges: int = 0  # with --tokenizer=bpe: print the first K merges the tokenizer learned, with their counts
    data_dir: str = ""  # where dataset folders live ('' = this project's data/)
    val_fraction: float = 0.1  # the share of tokens (text files) or of documents (records) in the val split
    dtype: Literal["auto", "uint16", "uint32"] = "auto"  # token file type: 'auto' is uint16 when the vocabulary fits
    text_field: str = "text"  # the JSON field or Parquet column that holds each record's text
    skip_bad: bool = False  # skip records that cannot be read (and count them) instead of stopping at the first
    shard_tokens: int = 100_000_000  # tokens per shard file; a split that fits in one is a single train.bin/val.bin
    workers: int = 0  # processes that tokenize (0 = one per core)
    start_over: bool = False  # replace a dataset under --name made from other text or with another tokenizer (deleted)
    # chat: conversations (a .jsonl of {"messages": [...]}, or --synthetic=tasks), gptkit/data/conversations.py
    # sums take a small model the most examples to learn: six times the others' (docs/chat.md)
    tasks: str = "addition:150000,reverse,sort"  # --synthetic=tasks: of addition(_reversed), reverse, sort; NAME:COUNT
    problems: int = 25_000  # with --synthetic=tasks: training conversations of each task not given a count
    heldout: int = 1000  # with --synthetic=tasks: held-out problems of each task, never trained on (heldout.jsonl)
    mix: str = ""  # a chat dataset: plain text to mix in (e.g. the base model's), so that it keeps what it knew
    mix_share: float = 0.45  # with --mix: the share of training tokens that are that text (its pieces repeat)

    def __post_init__(self):
        if self.synthetic and self.synthetic not in SYNTHETIC:
            raise ValueError(f"unknown --synthetic={self.synthetic}{closest(self.synthetic, SYNTHETIC)} (known: "
                             f"{', '.join(SYNTHETIC)})")
        if self.synthetic and self.input:
            raise ValueError("--input and --synthetic each name the text to prepare: give one of them")
        self.name = self.name or self.synthetic or "shakespeare_char"
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be between 0 and 1 (got {self.val_fraction})")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name must be a plain folder name (got {self.name!r})")
        if self.shard_tokens < 1:
            raise ValueError(f"shard_tokens must be at least 1 (got {self.shard_tokens})")
        if not 0 <= self.workers <= MOST_WORKERS:
            raise ValueError(f"workers must be 0 (one per core) to {MOST_WORKERS} (got {self.workers})")
        if not self.text_field:
            raise ValueError("text_field must name a field")
        if self.tokenizer == "bpe":
            if not self.vocab_size:
                raise ValueError("--tokenizer=bpe trains a tokenizer: give its size with --vocab_size=N (e.g. 1024)")
            check_vocab_size(self.vocab_size)
        elif self.vocab_size or self.show_merges:
            raise ValueError(f"--vocab_size and --show_merges are for a trained tokenizer (--tokenizer=bpe); "
                             f"{self.tokenizer!r} has a vocabulary of its own")
        if self.show_merges < 0:
            raise ValueError(f"show_merges must be 0 or more (got {self.show_merges})")
        self.task_list()
        if self.problems < 1 or self.heldout < 1:
            raise ValueError(f"problems and heldout must be at least 1 (got {self.problems}, {self.heldout})")
        if not 0 < self.mix_share < 1:
            raise ValueError(f"mix_share must be between 0 and 1 (got {self.mix_share})")
        self.check_unused()
        self.check_counts()

    def check_unused(self):
        """A setting given away from its default where nothing reads it (--mix_share without --mix) is refused,
        rather than ignored as though it had worked."""
        needs = {"mix_share": ("--mix", bool(self.mix)),
                 **{key: ("--synthetic=tasks", self.synthetic == "tasks") for key in ("tasks", "problems", "heldout")}}
        for f in fields(self):
            if f.name in needs and not needs[f.name][1] and getattr(self, f.name) != f.default:
                raise ValueError(f"--{f.name} is read only with {needs[f.name][0]}: give that too, or leave out "
                                 f"--{f.name}")

    def task_list(self):
        """--tasks as [(task, training problems)], each task known: NAME takes --problems, NAME:COUNT its own."""
        found = []
        for item in comma_items(self.tasks):
            name, _, count = item.partition(":")
            if name not in TASKS:
                raise ValueError(f"unknown task {name!r}{closest(name, TASKS)} in --tasks (known: {', '.join(TASKS)})")
            if count and not (count.isdigit() and int(count) > 0):
                raise ValueError(f"--tasks: {item!r} must be NAME or NAME:COUNT, COUNT at least 1")
            if name in dict(found):  # its problems drawn twice from one seed: the same conversations again
                raise ValueError(f"--tasks names {name} twice; give it once, with the count it needs ({name}:COUNT)")
            found.append((name, int(count) if count else self.problems))
        if not found:
            raise ValueError("--tasks names no task")
        return found

    def check_counts(self):
        """More problems than a task has is one line before any is drawn, rather than a draw that could not end."""
        for task, count in self.task_list():
            most, most_heldout = TASKS[task].sizes["train"], TASKS[task].sizes["heldout"]
            if count > most:
                raise ValueError(f"--tasks: {task} has {most:,} distinct training problems, fewer than {count:,}: "
                                 f"give {task}:{most} or less")
            if self.heldout > most_heldout:
                raise ValueError(f"--heldout={self.heldout}: {task} has {most_heldout:,} distinct held-out problems: "
                                 f"give --heldout={most_heldout} or less")


def data_root(data_dir):
    return Path(data_dir) if data_dir else PROJECT_DATA


def download_shakespeare(dest):
    """Fetch tinyshakespeare once and check it is the exact char-rnn file."""
    if not dest.exists():
        print(f"downloading {SHAKESPEARE_URL}", flush=True)  # before the seconds it takes, or its error
        try:
            with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as r:
                body = r.read()
        except OSError as e:
            raise UserError(f"could not download tinyshakespeare ({getattr(e, 'reason', e)}); "
                            "pass a local copy with --input=PATH/input.txt") from None
        write_whole(dest, body)
    digest = sha256_of(dest)
    if digest != SHAKESPEARE_SHA256:
        raise UserError(f"{shown(dest)} is not the tinyshakespeare file (sha256 {digest}); delete it and run again")
    return dest


def keep_a_copy(files, out_dir):
    """The default dataset prepared offline from a copy of tinyshakespeare (--input=PATH/input.txt) keeps one where
    the download puts it, so that the folder holds what it would online: the chat lesson's
    --mix=data/shakespeare_char/input.txt reads it. A file already there is never replaced."""
    dest = out_dir / "input.txt"
    if os.path.lexists(dest) or len(files) != 1 or files[0].stat().st_size != SHAKESPEARE_BYTES:
        return
    data = files[0].read_bytes()  # once: checked, then written
    if hashlib.sha256(data).hexdigest() != SHAKESPEARE_SHA256:
        return
    write_whole(dest, data)
    given = files[0].stat()  # its time too: a later prepare from the copy is of the same text, as same_text reads it
    os.utime(dest, ns=(given.st_atime_ns, given.st_mtime_ns))
    print(f"kept a copy of {shown(files[0])} as {shown(dest)}, where the download puts it", flush=True)


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
    return bar_or_lines(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, desc=desc)


def prepare(cfg):
    """Write the dataset data_dir/name, replacing the one there as a whole (one that other text or another tokenizer
    made only with start_over); return the folder and the metadata. One that makes no dataset leaves no lock or
    folder of its own behind, so that train.py's hint for a missing dataset is the one it shows."""
    out_dir = data_root(cfg.data_dir) / cfg.name
    if not (cfg.input or cfg.synthetic) and cfg.name != "shakespeare_char":
        raise UserError(f"pass the text to prepare with --input=PATH, or --synthetic={'|'.join(SYNTHETIC)}")
    files = source_files(cfg.input) if cfg.input else None
    if cfg.mix:  # read once before anything is written, so that a mix it cannot use leaves nothing behind
        mixed_text(cfg)
    check_room(out_dir)
    made = bare(out_dir)  # missing, or as a prepare that failed left it: this one's to remove (a user's stays)
    root_made = not os.path.lexists(out_dir.parent)  # a --data_dir this prepare makes
    try:
        with dataset_lock(out_dir):
            try:
                meta = prepare_locked(cfg, out_dir, files)
            finally:
                if bare(out_dir):
                    remove_bare(out_dir, folder_too=made)
    finally:
        if root_made and out_dir.parent.is_dir() and not any(out_dir.parent.iterdir()):
            out_dir.parent.rmdir()
    return out_dir, meta


def prepare_locked(cfg, out_dir, files):
    """prepare's work, holding the dataset's lock: the metadata. A stop signal before the new dataset is swapped in
    (while a synthetic text is drawn too) is one line, and the same command then continues."""
    with StopSignals() as stop, continued_by_rerun():
        stop.doing = "preparing"
        drawn = None  # a synthetic corpus this prepare wrote, which goes again if it fails
        if not files and cfg.synthetic:
            source, fresh = write_source(cfg.synthetic, out_dir, cfg)
            files, drawn = [source], source if fresh else None
        files = files or [download_shakespeare(out_dir / "input.txt")]
        with dropped_on_failure(drawn):
            meta, work = written_aside(cfg, out_dir, files)
    commit(out_dir, work)
    remove_leftovers(out_dir)
    if cfg.input and cfg.name == "shakespeare_char":
        keep_a_copy(files, out_dir)
    return meta


@contextmanager
def dropped_on_failure(path):
    """A file this prepare wrote is removed where it fails (a folder left with nothing else then goes too, as
    prepare's promise has it); a stop keeps it, for the same command to continue from."""
    try:
        yield
    except RunStopped:
        raise
    except BaseException:
        if path is not None:
            path.unlink(missing_ok=True)
        raise


def written_aside(cfg, out_dir, files):
    """The dataset of the source files, written in a work folder beside the one readers find: (its metadata, the
    work folder), for commit to swap in."""
    chat = len(files) == 1 and is_conversation_file(files[0])
    if cfg.mix and not chat:
        raise UserError("--mix mixes plain text into a chat dataset: give conversations (a .jsonl of "
                        "{\"messages\": [...]}) or --synthetic=tasks")
    if sum(f.stat().st_size for f in files) == 0:
        raise UserError(f"input {shown(cfg.input or files[0])} is empty")
    check_replacing(cfg, files, out_dir)
    work = work_folder(out_dir, settings_key(cfg, files))
    if stopped_work(out_dir, work):
        print(f"note: the work of a stopped prepare of {shown(out_dir)} with other settings is deleted; "
              "this prepare starts afresh")
    remove_leftovers(out_dir, keep=work)
    write = (lambda: chat_dataset(cfg, files[0], work)) if chat else lambda: write_dataset(cfg, files, work)
    return kept_or_cleared(write, work, out_dir), work


def check_replacing(cfg, files, out_dir):
    """Refuse to replace a dataset that other text or another tokenizer made (a run trained on it could no longer
    resume), as train.py refuses a new run into a folder holding another, unless start_over says to. The same
    text and settings prepared again (to repair it, or in other shards or token type) go ahead."""
    otherwise = made_otherwise(cfg, files, out_dir)
    if otherwise and not cfg.start_over:
        raise UserError(f"{shown(out_dir)} holds a dataset {otherwise}; prepare this one under another --name, or "
                        "replace that dataset with --start_over=True (it is deleted)")
    if otherwise:
        print(f"note: {shown(out_dir)} holds a dataset {otherwise}; --start_over=True: it is deleted once this one "
              "is whole")
    was = existing_meta(out_dir).get("heldout_per_task")
    if not otherwise and cfg.synthetic == "tasks" and type(was) is int and was != cfg.heldout:
        print(f"note: {shown(out_dir)}'s held-out problems change from {was:,} a task to {cfg.heldout:,} (what it "
              "trains on stays the same): a score chat.py --eval gave before was on the earlier ones")


def existing_meta(out_dir):
    """The dataset's meta.json there as a dict: {} where there is none, and where it cannot be read or is no
    object (made_otherwise says so)."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def made_otherwise(cfg, files, out_dir):
    """How the dataset in out_dir differs from the one cfg makes of files ('made from other text (...), with
    --tokenizer=char'); None where there is none, or it was made the same way."""
    if not (out_dir / "meta.json").exists():
        found = [n for n in sorted(os.listdir(out_dir)) if LINKED.fullmatch(n) and (out_dir / n).exists()]
        return f"without a meta.json to say what made it ({', '.join(found)})" if found else None
    meta = existing_meta(out_dir)
    if not meta:
        return "whose meta.json cannot be read to say what made it"
    source = f"({meta['source']} as it was then)" if "source" in meta else "(its meta.json names none)"
    ways = [] if same_text(meta, files) else [f"from other text {source}"]
    if not same_tokenizer(meta, cfg):
        ways.append(f"with {prepare_options(meta)}")
    ways += [f"with --{key}={meta[key]}" for key in ("val_fraction", "text_field")
             if key in meta and meta[key] != getattr(cfg, key)]
    ways += mixed_otherwise(meta, cfg)
    return f"made {', '.join(ways)}" if ways else None


def mixed_otherwise(meta, cfg):
    """How a chat dataset's plain text mixed in differs from what cfg mixes in: [] where it does not (or the
    dataset is not a chat dataset, whose text made_otherwise compares already)."""
    was = meta.get("mix")
    if "chat" not in meta or not (was or cfg.mix):
        return []
    if not isinstance(was, dict):
        return ["without --mix"]
    if not cfg.mix:
        return [f"with --mix={was.get('path')}"]
    try:  # a dataset prepared before its meta.json kept the file's size and time: by the path given
        same = same_source(was, Path(cfg.mix)) if "bytes" in was else was.get("path") == shown(cfg.mix)
    except OSError:  # a --mix that cannot be read is said as the prepare reads it
        return []
    ways = [] if same else [f"with other text mixed in ({was.get('path')} as it was then)"]
    return ways + ([f"with --mix_share={was.get('share')}"] if was.get("share") != cfg.mix_share else [])


def same_text(meta, files):
    """Whether a dataset was made of these files as they are now: each the same (same_source), in order (wherever
    they are found: the same file may be given by another path, or copied again)."""
    was = meta.get("sources")
    return isinstance(was, list) and len(was) == len(files) and all(map(same_source, was, files))


def same_tokenizer(meta, cfg):
    """Whether cfg's tokenizer gives the token ids of a dataset's (a trained BPE: of the same size, from the same
    text, which same_text and the val_fraction check)."""
    if cfg.tokenizer in ("char", "bpe"):
        return meta.get("tokenizer") == cfg.tokenizer and (cfg.tokenizer == "char"
                                                            or trained_size(meta) == cfg.vocab_size)
    return same_bpe(meta, {"tokenizer": "tiktoken", "encoding": cfg.tokenizer})  # a chat dataset's has markers


@contextmanager
def continued_by_rerun():
    """A prepare stopped by a signal says so in one line, and that the same command continues it: the work
    written so far is kept (kept_or_cleared), and a text drawn only in part is drawn again."""
    try:
        yield
    except RunStopped as e:
        raise RunStopped(f"{e}; run the same command again to continue where this prepare stopped",
                         e.exit_code - 128) from None
    except KeyboardInterrupt:  # a second Ctrl-C
        raise RunStopped("interrupted; run the same command again to continue where this prepare stopped") from None


def kept_or_cleared(write, work, out_dir):
    """Run write(): stopped by a signal, its work is kept for the same command to continue; failed on bad input
    or a full disk, nothing it wrote is left behind."""
    try:
        return write()
    except RunStopped:  # a UserError too, but its work is kept
        raise
    except UserError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    except OSError as e:  # reading errors are UserErrors already: this is the dataset's own writing
        shutil.rmtree(work, ignore_errors=True)
        raise UserError(f"could not write the dataset to {shown(out_dir)} ({e.strerror or e})") from None


def settings_key(cfg, files):
    """What makes a stopped prepare's work reusable: the same settings and the same source files, unchanged."""
    ignored = ("data_dir", "name", "workers", "show_merges", "start_over")
    settings = {k: v for k, v in asdict(cfg).items() if k not in ignored}
    stats = [(shown(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return hashlib.sha256(json.dumps([settings, stats]).encode("utf-8")).hexdigest()[:16]


class Progress:
    """A stopped prepare's saved state, in its work folder: where reading stopped, what the writers hold, the
    vocabulary, the counts. Saved after the token files are flushed, so it never names more than is on disk."""

    def __init__(self, work):
        self.path = work / "state.json"
        try:
            self.saved = json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else {}
        except ValueError:  # not JSON, or not UTF-8: damaged, which open_work says
            self.saved = None
        self.last = time.monotonic()

    def get(self, key, default=None):
        return self.saved.get(key, default)

    def save(self, **state):
        self.saved.update(state)
        write_whole(self.path, json.dumps(self.saved))
        self.last = time.monotonic()

    def due(self):
        return time.monotonic() - self.last >= SAVE_EVERY


def as_saved(saved):
    """Whether a stopped prepare's saved state is of the shape Progress.save writes it in (a hand edit or a
    damaged file, None where it was no JSON, is not)."""
    try:
        if "position" in saved:
            file_index, offset = saved["position"]
            np.dtype(saved["dtype"])
            Tally(**saved.get("tally", {}))
            parts = [saved[split] for split in ("train", "val")]
            if not (isinstance(file_index, int) and isinstance(offset, int) and
                    all(isinstance(part["done"], list) and isinstance(part["part"], int) for part in parts) and
                    all(isinstance(n, int) for n in saved["docs"].values())):
                return False
        return all(isinstance(saved.get(key, ""), str) for key in ("vocab", "tokenizer_sha256"))
    except (TypeError, ValueError, KeyError, AttributeError):
        return False


def unusable_work(work, progress):
    """What keeps a stopped prepare's work from being continued, in words, or None."""
    if not as_saved(progress.saved):
        return "saved state is damaged"
    if progress.get("position") and not all(
            ShardWriter.matches(work, split, np.dtype(progress.get("dtype")).itemsize, progress.get(split))
            for split in ("train", "val")):
        return "files do not match its saved state"
    saved_tokenizer = progress.get("tokenizer_sha256")
    if saved_tokenizer and saved_checksum(work / TOKENIZER_FILE) != saved_tokenizer:
        return f"{TOKENIZER_FILE} is missing or does not match its checksum"
    return None


def open_work(work):
    """The work folder and its saved state: a stopped prepare's, to continue, or a fresh one."""
    refuse_link(work)  # a folder it points at would be written into, and deleted
    if work.is_dir() and not (work / "state.json").is_file():
        shutil.rmtree(work)  # stopped before its first saved state: nothing to continue from
    work.mkdir(parents=True, exist_ok=True)
    progress = Progress(work)
    unusable = unusable_work(work, progress)
    if unusable:
        print(f"the stopped prepare's {unusable}; starting again")
        shutil.rmtree(work)
        return open_work(work)
    if progress.get("position"):
        file_index, _ = progress.get("position")
        print(f"continuing the prepare that was stopped (at file {file_index + 1}, "
              f"{sum(progress.get('docs', {}).values()):,} documents read)")
    return progress


def write_dataset(cfg, files, work):
    """Tokenize the corpus into the work folder's token files and meta.json, flushed to disk before they can
    become the dataset readers find; the metadata."""
    progress = open_work(work)
    by_document = any(kind_of(f) != "text" for f in files)
    tok = choose_tokenizer(cfg, files, progress, by_document, work)
    dtype = token_dtype(cfg, tok)
    writers = {split: ShardWriter(work, split, dtype, cfg.shard_tokens, progress.get(split)) for split in ("train", "val")}
    tally, docs = Tally(**progress.get("tally", {})), dict(progress.get("docs", {"train": 0, "val": 0}))
    reader = Reader(cfg.text_field, cfg.skip_bad, cfg.val_fraction if by_document else None,
                    bpe_cut if isinstance(tok, TiktokenTokenizer) else len, tally)
    start = progress.get("position", [0, 0])
    setup = (tok.to_meta(), cfg.text_field, cfg.val_fraction if by_document else None, dtype,
             separators(tok, files, by_document))
    with progress_bar(files, "tokenizing") as bar:
        for batch, out in tokenized(batches(reader, files, start, bar), setup, cfg.workers or cores()):
            shards = sum(len(w.done) for w in writers.values())
            for index, problem in out["passed_over"]:
                reader.passed_over(batch[index], problem)
            for side in ("train", "val"):
                writers[side].write(out[side])
                docs[side] += out["documents"][side]
            due = progress.due() or sum(len(w.done) for w in writers.values()) > shards
            if due and batch[-1].resumable:  # never inside a long record: it is tokenized again from its start
                progress.save(position=batch[-1].position, tally=asdict(tally), docs=docs, dtype=dtype,
                              **{split: w.state() for split, w in writers.items()})
    check_documents(cfg, files, docs, tally, by_document)
    if not by_document:
        writers["train"].split_off(position_split(writers["train"].tokens(), cfg.val_fraction), writers["val"])
    shards = {split: w.finish() for split, w in writers.items()}
    return write_meta(cfg, files, work, tok, dtype, shards, docs, tally, by_document)


def chat_dataset(cfg, path, work):
    """A chat dataset in the work folder (gptkit/data/chat_preparing.py), with its meta.json; the metadata."""
    open_work(work)
    tok, meta = write_chat_dataset(cfg, path, work)
    meta["sha256"] = meta_checksum(meta)
    write_whole(work / "meta.json", json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    (work / "state.json").unlink(missing_ok=True)
    sync([*work.iterdir(), work, work.parent])
    return as_read(meta, tok)


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def batches(reader, files, start, bar):
    """Lists of Pieces of about BATCH_CHARS of text, from file start[0] at position start[1] on; each Piece's
    position becomes [file index, position in that file]."""
    batch, size = [], 0
    bar.update(sum(f.stat().st_size for f in files[:start[0]]))
    for index in range(start[0], len(files)):
        for piece in reader.pieces(files[index], start[1] if index == start[0] else 0, bar):
            piece.position = [index, piece.position]
            batch.append(piece)
            size += len(piece.text or "")  # a Parquet row's null text is None: read_record names it
            if size >= BATCH_CHARS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def choose_tokenizer(cfg, files, progress, by_document, work):
    """The tokenizer; char-level, its vocabulary is every character of the corpus (one pass over it, kept in the
    saved state so a continued prepare does not read it twice)."""
    if cfg.tokenizer == "bpe":
        return trained_tokenizer(cfg, files, progress, by_document, work)
    if cfg.tokenizer != "char":
        return make_tokenizer(cfg.tokenizer)
    chars = progress.get("vocab")
    if chars is None:
        seen = set(CHAR_SEPARATOR) if by_document else set()
        with progress_bar(files, "vocabulary") as bar:
            for text in corpus_texts(cfg, files, bar):
                seen.update(text)
        chars = "".join(sorted(seen))
        progress.save(vocab=chars)
    return make_tokenizer("char", chars)


def corpus_texts(cfg, files, bar, split=None):
    """Every document's text, in pieces; given how the corpus is split ('by document' or 'by position'), only the
    text of its train split: the records and files whose hash keeps them out of val, or the first
    1 - val_fraction of the bytes of text files (the val split is their tail)."""
    by_hash = cfg.val_fraction if split == "by document" else None
    reader = Reader(cfg.text_field, cfg.skip_bad, by_hash, bpe_cut)
    room = (1 - cfg.val_fraction) * sum(f.stat().st_size for f in files)  # bytes of train text, by position
    for path in files:
        for piece in reader.pieces(path, 0, bar):
            text, val, problem = read_record(piece.text, cfg.text_field, by_hash) if piece.record else \
                (piece.text, piece.val, None)
            if problem:
                reader.passed_over(piece, problem)
            if split == "by position":
                data = text.encode("utf-8")
                if len(data) >= room:
                    yield data[:int(room)].decode("utf-8", "ignore")
                    return
                room -= len(data)
            if text and not val:
                yield text


def trained_tokenizer(cfg, files, progress, by_document, work):
    """A byte-level BPE of vocab_size tokens trained on the corpus's train split, written to the work folder; a
    stopped prepare's, which open_work checked against its checksum, is used again."""
    path = work / TOKENIZER_FILE
    if progress.get("tokenizer_sha256"):
        tok = TrainedBPE(json.loads(path.read_text(encoding="utf-8")))
    else:
        words = WordCounts() if cfg.show_merges else None
        content = corpus_bpe(cfg, files, by_document, words)
        tok = TrainedBPE(content)
        save_tokenizer(path, content)
        counts = words.merge_counts(tok.merges, cfg.show_merges) if words else []
        progress.save(tokenizer_sha256=tok.sha256, merge_counts=counts)
    if cfg.show_merges:
        print("\n".join(merges_table(tok, progress.get("merge_counts")[:cfg.show_merges])))
    return tok


def corpus_bpe(cfg, files, by_document, words=None):
    """The content of a BPE of cfg.vocab_size tokens trained on the corpus's train split, read as a prepare reads
    it; with `words` (a WordCounts), its words counted on the way. bench.py tokenizers times this alone."""
    with progress_bar(files, f"training a {cfg.vocab_size:,}-token BPE") as bar:
        texts = corpus_texts(cfg, files, bar, "by document" if by_document else "by position")
        content = train_bpe(then_merging(texts, bar), cfg.vocab_size, words)
    return content


def then_merging(texts, bar):
    """texts, and once the trainer has read them all, the bar full (the val split's bytes are not read) and saying
    that the merges are learned now: on a large corpus that takes as long as the reading, with nothing to count."""
    yield from texts
    bar.update(bar.total - bar.n)
    bar.set_postfix_str("read; learning the merges")


def separators(tok, files, by_document):
    """The tokens after each document, (after a text file, after a record): BPE's end-of-text (as nanoGPT),
    where the corpus has more than one document; char-level, a blank line after each record (a text file ends
    as it ends)."""
    if isinstance(tok, TiktokenTokenizer):
        eot = [tok.eot_token] if by_document or len(files) > 1 else []
        return eot, eot
    return [], tok.encode(CHAR_SEPARATOR) if by_document else []


def check_documents(cfg, files, docs, tally, by_document):
    """A corpus with documents in it, and (split by document) some in each split."""
    source = shown(cfg.input or files[0])
    if not sum(docs.values()):
        raise UserError(f"input {source} holds no documents ({tally.empty:,} empty, {tally.bad:,} skipped as bad)")
    if by_document and not all(docs.values()):
        empty = "val" if not docs["val"] else "train"
        raise UserError(f"none of the {sum(docs.values()):,} documents of {source} fell in the {empty} split "
                        f"(val_fraction {cfg.val_fraction}, each document's side set by its hash); "
                        "a corpus split by document needs more documents")


def position_split(n_tokens, val_fraction):
    """How many tokens go to train when the tail is val, as nanoGPT: int(n * 0.9)."""
    if n_tokens < 2:
        raise UserError(f"input has only {n_tokens} token(s): too little text to split into train and val")
    return min(int(n_tokens * (1 - val_fraction)), n_tokens - 1)


def write_meta(cfg, files, work, tok, dtype, shards, docs, tally, by_document):
    """meta.json: the tokenizer, the token files with their counts and checksums, what was read and passed over."""
    counts = tok.char_counts()  # each token's characters, for both splits
    meta = dict(tokenizer_fields(tok), vocab_size=tok.vocab_size, dtype=dtype,
                train_tokens=sum(s["tokens"] for s in shards["train"]),
                val_tokens=sum(s["tokens"] for s in shards["val"]),
                **{f"{split}_chars": characters(work, shards[split], dtype, counts) for split in ("train", "val")},
                train_shards=shards["train"], val_shards=shards["val"],
                split="by document" if by_document else "by position", val_fraction=cfg.val_fraction,
                documents=sum(docs.values()),
                **({"val_documents": docs["val"], "text_field": cfg.text_field} if by_document else {}),
                skipped={"empty": tally.empty, "bad": tally.bad}, source=shown(cfg.input or files[0]),
                sources=[source_record(f) for f in files])
    meta["sha256"] = meta_checksum(meta)
    write_whole(work / "meta.json", json.dumps(meta, indent=1, ensure_ascii=False) + "\n")  # synced, as the tokenizer
    (work / "state.json").unlink(missing_ok=True)
    sync([*(work / s["file"] for split in shards.values() for s in split), work, work.parent])
    return as_read(meta, tok)


def as_read(meta, tok):
    """A dataset's metadata as load_meta reads it: a trained BPE's merges, from their own file, in it."""
    return dict(meta, bpe=tok.content) if tok.kind == "bpe" else meta


def characters(work, shards, dtype, counts):
    """The characters of text a split's tokens spell (bits per character = nats / (ln 2 × characters)), each
    token's count of them given (the tokenizer's char_counts)."""
    total = 0
    for shard in shards:
        tokens = np.memmap(work / shard["file"], dtype=dtype, mode="r")
        for at in range(0, len(tokens), CHUNK_TOKENS):
            total += int(counts[tokens[at:at + CHUNK_TOKENS]].sum())
        del tokens
    return total


def meta_checksum(meta):
    """A dataset's meta.json checks itself: sha256 of its other fields as compact JSON with sorted keys."""
    fields = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
