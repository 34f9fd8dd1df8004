"""
Token files too big for one piece: a split is written as shards (train_000.bin, train_001.bin, ...) of a fixed
number of tokens, one after another, and read back as one stream. A split that fits in one shard is the
single file it always was (train.bin).

Tokenizing runs on every core, in processes: faster than tiktoken's own threads
(docs/corpora.md#speed-and-memory).
"""

import hashlib
import os
import signal
import threading
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gptkit.base.errors import UserError
from gptkit.base.files import no_links, refuse_link
from gptkit.data.sources import hashed, read_record, sha256_of
from gptkit.data.tokenizer import tokenizer_from_meta

CHUNK_TOKENS = 1 << 20
TOKEN_DTYPES = {"uint16": 2 ** 16, "uint32": 2 ** 32}  # token file types, and the largest vocabulary each holds


def token_dtype(cfg, tok):
    dtype = cfg.dtype if cfg.dtype != "auto" else "uint16" if tok.vocab_size <= TOKEN_DTYPES["uint16"] else "uint32"
    if tok.vocab_size > TOKEN_DTYPES[dtype]:
        raise UserError(f"the vocabulary has {tok.vocab_size:,} tokens, more than {dtype} holds "
                        f"({TOKEN_DTYPES[dtype]:,}); use --dtype=uint32 or --dtype=auto")
    return dtype


class ShardWriter:
    """One split's tokens, appended into shards of shard_tokens each. The shard being filled is a .part file,
    renamed to its name once full and flushed; state() flushes too, so a saved state (the finished shards'
    token counts and checksums, the part's length) names exactly what is on disk to continue from. Checksums are
    taken as the tokens are written, so finishing does not read the shards again. A link among the split's files
    (put in a stopped prepare's work folder) is refused: they are written, truncated and renamed over."""

    def __init__(self, folder, split, dtype, shard_tokens, state=None):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, np.dtype(dtype), shard_tokens
        self.done = list(state["done"]) if state else []
        self.sums = list(state["sums"]) if state else []
        self.part = state["part"] if state else 0
        for path in folder.glob(f"{split}*.bin*"):
            refuse_link(path)
        k = len(self.done)
        if not self.path(k, ".part").exists() and self.path(k).exists():
            os.replace(self.path(k), self.path(k, ".part"))  # finished after the saved state: it continues
        for later in folder.glob(f"{split}_*.bin*"):
            if int(later.name[len(split) + 1:].split(".")[0]) > k:
                later.unlink()
        self.file = open(self.path(k, ".part"), "ab", opener=no_links)
        self.file.truncate(self.part * self.dtype.itemsize)  # what was written after the saved state goes
        self.hash = hashed(self.path(k, ".part"), hashlib.sha256())

    @classmethod
    def matches(cls, folder, split, itemsize, state):
        """Whether a saved state's files are on disk as it says (they are, unless edited): every finished shard
        of its size, and the part (or, finished since, its shard) at least as long as saved."""
        sizes = [n * itemsize for n in state["done"]]
        finished = [folder / f"{split}_{k:03d}.bin" for k in range(len(sizes) + 1)]
        part = finished[-1].with_name(finished[-1].name + ".part")
        part = part if part.exists() else finished[-1]
        return (all(p.is_file() and p.stat().st_size == n for p, n in zip(finished, sizes))
                and (state["part"] == 0 or part.is_file() and part.stat().st_size >= state["part"] * itemsize))

    def path(self, k, suffix=""):
        return self.folder / f"{self.split}_{k:03d}.bin{suffix}"

    def write(self, ids):
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            take = ids[:self.shard_tokens - self.part]
            data = take.tobytes()
            self.file.write(data)
            self.hash.update(data)
            self.part += len(take)
            ids = ids[len(take):]
            if self.part == self.shard_tokens:
                self.close_shard()

    def close_shard(self):
        self.flush()
        self.file.close()
        os.replace(self.path(len(self.done), ".part"), self.path(len(self.done)))
        self.done.append(self.part)
        self.sums.append(self.hash.hexdigest())
        self.part, self.hash = 0, hashlib.sha256()
        self.file = open(self.path(len(self.done), ".part"), "ab", opener=no_links)

    def flush(self):
        self.file.flush()
        os.fsync(self.file.fileno())

    def state(self):
        self.flush()
        return {"done": list(self.done), "sums": list(self.sums), "part": self.part}

    def tokens(self):
        return sum(self.done) + self.part

    def split_off(self, keep, other):
        """Keep the first `keep` tokens; write the rest to `other` (a ShardWriter), in order."""
        if self.part:
            self.close_shard()
        start = 0
        for k, n in enumerate(self.done):
            if start + n > keep:
                tokens = np.memmap(self.path(k), dtype=self.dtype, mode="r")
                for i in range(max(0, keep - start), n, CHUNK_TOKENS):
                    other.write(tokens[i:min(i + CHUNK_TOKENS, n)])
                del tokens
            start += n
        start, kept = 0, []
        for k, n in enumerate(self.done):
            if start >= keep:
                self.path(k).unlink()
            else:
                kept.append(min(n, keep - start))
                if kept[-1] < n:
                    os.truncate(self.path(k), kept[-1] * self.dtype.itemsize)
                    self.sums[k] = sha256_of(self.path(k))
            start += n
        self.file.close()  # the empty part follows the shards kept, not those that went
        self.path(len(self.done), ".part").unlink()
        self.done, self.sums = kept, self.sums[:len(kept)]
        self.file = open(self.path(len(self.done), ".part"), "ab", opener=no_links)

    def finish(self):
        """Close the last shard and name them: `train.bin` where one shard holds the split. The shards, each
        {file, tokens, sha256}."""
        if self.part or not self.done:
            self.close_shard()
        self.file.close()
        self.path(len(self.done), ".part").unlink()
        names = [f"{self.split}.bin"] if len(self.done) == 1 else [self.path(k).name for k in range(len(self.done))]
        if len(self.done) == 1:
            os.replace(self.path(0), self.folder / names[0])
        return [{"file": name, "tokens": n, "sha256": sha}
                for name, n, sha in zip(names, self.done, self.sums)]


WORKER = {}  # a tokenizing process's settings, set once as it starts


def start_worker(setup):
    """setup: (tokenizer metadata, the records' text field, val_fraction or None, token dtype, the tokens after a
    text file and after a record)."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # the main process's to handle, once; it ends the workers
        signal.signal(signum, signal.SIG_IGN)
    threading.Thread(target=exit_with_parent, args=(os.getppid(),), daemon=True).start()
    set_up(setup)


def set_up(setup):
    meta, field, val_fraction, dtype, (after_text, after_record) = setup
    dtype = np.dtype(dtype)
    WORKER.update(tok=tokenizer_from_meta(meta), field=field, val_fraction=val_fraction, dtype=dtype,
                  after={False: np.asarray(after_text, dtype=dtype), True: np.asarray(after_record, dtype=dtype)})


def exit_with_parent(parent):
    """A worker whose prepare was killed (SIGKILL: no clean-up) would wait for work forever."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def encode_pieces(items):
    """A batch's tokens, each document's followed by its separator: {'train': tokens, 'val': tokens, 'documents':
    each split's count, 'passed_over': [(index, what is wrong, or None for an empty record)]}. A record's text is
    found here (JSON parsed, checked, hashed for its split), so the main process only reads and writes; each
    item is (text or what holds a record, whether it is a record, whether it ends its document, in val, whether
    it ends with a record's separator)."""
    sides = {"train": [], "val": []}
    out = {"documents": {"train": 0, "val": 0}, "passed_over": []}
    for index, (text, record, ends, val, of_record) in enumerate(items):
        if record:
            text, val, problem = read_record(text, WORKER["field"], WORKER["val_fraction"])
            if not text:
                out["passed_over"].append((index, problem))
                continue
        side = "val" if val else "train"
        sides[side].append(WORKER["tok"].encode_array(text, WORKER["dtype"]))
        if ends:
            sides[side].append(WORKER["after"][record or of_record])
            out["documents"][side] += 1
    for side, parts in sides.items():
        out[side] = np.concatenate(parts) if parts else np.zeros(0, WORKER["dtype"])
    return out


def tokenized(batches, setup, workers):
    """Yield (batch, encode_pieces of it) for each batch (a list of Pieces), in order, on `workers` processes with
    a few batches in flight, so memory stays bounded however long the corpus is. setup: see start_worker."""
    if workers <= 1:
        set_up(setup)
        for batch in batches:
            yield batch, encode_pieces(work_of(batch))
        return
    with ProcessPoolExecutor(workers, initializer=start_worker, initargs=(setup,)) as pool:
        flight = deque()
        for batch in batches:
            flight.append((batch, pool.submit(encode_pieces, work_of(batch))))
            if len(flight) > 2 * workers:
                done, future = flight.popleft()
                yield done, future.result()
        while flight:
            done, future = flight.popleft()
            yield done, future.result()


def work_of(batch):
    """What a tokenizing process needs of each Piece (see encode_pieces)."""
    return [(p.text, p.record, p.ends_document, p.val, p.of_record) for p in batch]
