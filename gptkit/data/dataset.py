"""A prepared dataset: its metadata and token files, and the training and evaluation batches drawn from them."""

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from gptkit.base.errors import UserError, first_line
from gptkit.data.chat_preparing import HELDOUT_FILE, MIXED_VAL_FILE, PREPARE_TASKS
from gptkit.data.conversations import MARKERS, PROMPT, ROLE_NAMES
from gptkit.data.preparing import data_root, meta_checksum
from gptkit.data.shards import TOKEN_DTYPES
from gptkit.data.synthetic import SYNTHETIC
from gptkit.data.tokenizer import tokenizer_from_meta, trained_bpe
from gptkit.data.versions import DATASET_FILE


def dataset_folder(data_dir, dataset):
    """Where a dataset is: a path as given, a name under data_dir (this project's data/ when empty)."""
    return Path(dataset) if "/" in dataset else data_root(data_dir) / dataset


def load_meta(data_dir, dataset):
    """The dataset's folder and its metadata, checked: the fields training reads, agreeing with one another
    and with the checksum prepare wrote."""
    if data_dir and Path(data_dir).exists() and not Path(data_dir).is_dir():
        raise UserError(f"data_dir {data_dir} is a file, not a folder of datasets")
    folder = dataset_folder(data_dir, dataset)
    if not folder.is_dir():
        if folder.exists():
            raise UserError(f"dataset {folder} is a file, not a folder made by data/prepare.py")
        # with no --input, prepare.py downloads tinyshakespeare into exactly this folder
        how = ("python data/prepare.py" if folder.name == "shakespeare_char" else
               PREPARE_TASKS if folder.name == "tasks" else
               f"python data/prepare.py --synthetic={folder.name}" if folder.name in SYNTHETIC else
               f"python data/prepare.py --input=YOUR.txt --name={folder.name}")
        how += f" --data_dir={data_dir}" if data_dir and "/" not in dataset else ""  # where this run looks
        raise UserError(f"dataset folder {folder} not found; create it with `{how}`")
    path = folder / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} not found; run data/prepare.py for this dataset again") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: JSON nested too deeply
        raise UserError(f"{path} is damaged: not valid JSON ({first_line(e)}); run data/prepare.py again") from None
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    check_meta(meta, path)
    if meta["tokenizer"] == "bpe":
        meta["bpe"] = read_tokenizer(folder / meta["tokenizer_file"], meta)
    return folder, meta


def bits_per_char(val_loss, meta):
    """A val loss (nats per token) as bits per character of the val text, the measure that compares tokenizers:
    nats / (ln 2 × characters). None where the dataset does not say how many characters its val tokens spell
    (prepared before it counted them, and not char-level, where a token is a character)."""
    chars = meta.get("val_chars", meta["val_tokens"] if meta["tokenizer"] == "char" else None)
    return val_loss * meta["val_tokens"] / (math.log(2) * chars) if chars else None


def read_tokenizer(path, meta):
    """A dataset's trained tokenizer: its file, checked against the checksum meta.json holds."""
    again = "run data/prepare.py for this dataset again"
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing: this dataset's trained tokenizer; {again}") from None
    except (ValueError, RecursionError) as e:
        raise UserError(f"{path} is damaged: not valid JSON ({first_line(e)}); {again}") from None
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    trained_bpe(dict(meta, bpe=content), where=str(path))
    return content


def check_meta(meta, path):
    """The fields training reads, a token type that can hold every token id, a vocabulary of the size stated,
    and (in datasets written with one) the checksum of all of it."""
    again = "run data/prepare.py for this dataset again"
    missing = [k for k in ("tokenizer", "vocab_size", "dtype") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; {again}")
    dtype, vocab = meta["dtype"], meta["vocab_size"]
    if dtype not in TOKEN_DTYPES:
        raise UserError(f"{path}: token dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
    if type(vocab) is not int:
        raise UserError(f"{path}: vocab_size is {json.dumps(vocab)[:40]}, not a whole number; {again}")
    if not 0 < vocab <= TOKEN_DTYPES[dtype]:
        raise UserError(f"{path}: a vocabulary of {vocab} tokens does not fit {dtype} token files "
                        f"(at most {TOKEN_DTYPES[dtype]:,}); run data/prepare.py again")
    if meta["tokenizer"] == "char":
        chars = meta.get("vocab")
        if not isinstance(chars, str) or len(set(chars)) != len(chars):
            raise UserError(f"{path}: 'vocab' must be a string of distinct characters; {again}")
        if len(chars) != vocab:
            raise UserError(f"{path}: vocab_size is {vocab} but the vocabulary has {len(chars)} characters; {again}")
    elif meta["tokenizer"] == "bpe":
        if meta.get("tokenizer_file") != "tokenizer.json" or not isinstance(meta.get("tokenizer_sha256"), str):
            raise UserError(f"{path}: a trained BPE's dataset names its tokenizer.json and its tokenizer_sha256; "
                            f"{again}")
    elif meta["tokenizer"] != "tiktoken" or not isinstance(meta.get("encoding"), str):
        raise UserError(f"{path}: tokenizer must be 'char', 'bpe' or 'tiktoken' with an encoding name; {again}")
    for name in ("train", "val"):
        check_shards(meta, name, path, again)
    check_chat(meta, path, again)
    if "sha256" in meta and meta["sha256"] != meta_checksum(meta):
        raise UserError(f"{path} is damaged or was edited: it does not match its checksum; {again}")


def check_shards(meta, name, path, again):
    """A split's list of token files, where meta.json has one: plain file names of this split, token counts
    that add up to the split's, checksums as text."""
    shards = meta.get(f"{name}_shards")
    if shards is None:
        return
    fine = isinstance(shards, list) and shards and all(
        isinstance(s, dict) and isinstance(s.get("file"), str) and DATASET_FILE.fullmatch(s["file"])
        and s["file"].startswith(name) and type(s.get("tokens")) is int and s["tokens"] >= 0
        and isinstance(s.get("sha256"), str) for s in shards)
    if not fine:
        raise UserError(f"{path}: '{name}_shards' must list the split's token files, each with its file, tokens "
                        f"and sha256; {again}")
    if sum(s["tokens"] for s in shards) != meta.get(f"{name}_tokens"):
        raise UserError(f"{path}: the {name} shards hold {sum(s['tokens'] for s in shards):,} tokens, but "
                        f"{name}_tokens says {meta.get(f'{name}_tokens')!r}; {again}")


def check_chat(meta, path, again):
    """A chat dataset's fields, where meta.json has them: the markers' token ids, each split's roles file (which
    tokens are answers), and the files chat.py and rl.py score on, with their checksums."""
    chat, roles, mix, sums = (meta.get(k) for k in ("chat", "roles", "mix", "text_sha256"))
    fine = {"chat": isinstance(chat, dict) and chat.keys() == MARKERS.keys()
            and all(type(i) is int and 0 <= i < meta["vocab_size"] for i in chat.values()),
            "roles": isinstance(roles, dict) and all(
                isinstance(roles.get(s), dict) and roles[s].get("file") == f"{s}_roles.bin"
                and type(roles[s].get("tokens")) is int and isinstance(roles[s].get("sha256"), str)
                for s in ("train", "val")),
            "heldout_file": meta.get("heldout_file") == HELDOUT_FILE,
            "mix": isinstance(mix, dict) and mix.get("val_file", MIXED_VAL_FILE) == MIXED_VAL_FILE,
            "text_sha256": isinstance(sums, dict) and all(isinstance(v, str) for v in sums.values())}
    needs = {"chat": "map each chat marker to its token id",
             "roles": "list each split's roles file, with its tokens and sha256",
             "heldout_file": f"be {HELDOUT_FILE!r}",
             "mix": f"describe the text mixed in, its val_file {MIXED_VAL_FILE!r}",
             "text_sha256": "map each file beside the tokens to its checksum"}
    for key, good in fine.items():
        if key in meta and not good:
            raise UserError(f"{path}: '{key}' must {needs[key]}; {again}")


class Split:
    """One split's tokens on disk: its token file, or its shards read as one stream, each checked once when
    opened (size, token ids within the vocabulary, the checksum and count the metadata gives) and mapped afresh
    per read so the memmaps never pin memory however many tokens a run reads."""

    def __init__(self, folder, name, meta, block_size, train_on="answers"):
        self.path = Path(folder) / f"{name}.bin"
        self.dtype = np.dtype(meta["dtype"])
        self.shards = [Shard(Path(folder) / s["file"], self.dtype, s, meta["vocab_size"])
                       for s in shards_of(meta, name)]
        # a chat dataset's roles (gptkit/data/conversations.py): the targets the loss skips are -1
        self.roles = None
        if "roles" in meta and train_on == "answers":
            self.roles = Shard(Path(folder) / meta["roles"][name]["file"], np.dtype(np.uint8), meta["roles"][name],
                               len(ROLE_NAMES), unit="role")
            if self.roles.length != self.shards[0].length or len(self.shards) != 1:
                raise UserError(f"{self.roles.path} does not match {self.path}; run data/prepare.py again")
        self.starts = np.cumsum([0] + [shard.length for shard in self.shards])
        self.length = int(self.starts[-1])
        if self.length < block_size + 1:
            raise UserError(f"{self.path if len(self.shards) == 1 else f'the {name} split'} has {self.length} "
                            f"tokens, fewer than block_size + 1 = {block_size + 1}; use a smaller --block_size or "
                            "more text")
        self.block_size = block_size

    def batch(self, offsets, device, masked=True):
        """(inputs, targets) of the windows at offsets; masked, a chat dataset's prompt targets are -1."""
        span = np.arange(self.block_size + 1)
        if len(self.shards) == 1:
            rows = self.shards[0].tokens()[offsets.numpy()[:, None] + span]
        else:
            rows = np.stack([self.window(int(o)) for o in offsets])
        xy = torch.from_numpy(rows.astype(np.int64))
        if device.startswith("cuda"):
            xy = xy.pin_memory().to(device, non_blocking=True)
        else:
            xy = xy.to(device)
        x, y = xy[:, :-1], xy[:, 1:]
        if self.roles is not None and masked:  # a prompt's tokens are given, never predicted: their targets are -1
            given = self.roles.tokens()[offsets.numpy()[:, None] + span[1:]] == PROMPT
            y = y.masked_fill(torch.from_numpy(given).to(y.device), -1)
        return x, y

    def window(self, start):
        """block_size + 1 tokens from `start` in the split's stream, across the end of a shard if need be."""
        stop, parts = start + self.block_size + 1, []
        k = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            first, tokens = int(self.starts[k]), self.shards[k].tokens()
            take = min(stop, int(self.starts[k + 1])) - start
            parts.append(np.asarray(tokens[start - first:start - first + take]))
            start, k = start + take, k + 1
        return np.concatenate(parts)

    def random_offsets(self, batch_size, generator):
        return torch.randint(self.length - self.block_size, (batch_size,), generator=generator)


def shards_of(meta, name):
    """A split's token files as meta.json lists them; a dataset from before shards has one, {name}.bin."""
    return meta.get(f"{name}_shards") or [{"file": f"{name}.bin", "tokens": meta.get(f"{name}_tokens"),
                                           "sha256": meta.get(f"{name}_sha256")}]


class Shard:
    """One token file of a split."""

    def __init__(self, path, dtype, listed, vocab_size, unit="token id"):
        self.path, self.dtype = path, dtype
        self.length, self.identity = check_tokens(path, dtype, listed, vocab_size, unit)

    def tokens(self):
        """The file's tokens, mapped afresh, from the very file checked when the split was opened. Another file
        there (the dataset prepared again while this process reads it) or the same one rewritten would give
        windows past its end, or text the run was not started on: either ends the run with one line."""
        try:
            with open(self.path, "rb") as f:
                if file_identity(os.fstat(f.fileno())) == self.identity:
                    return np.memmap(f, dtype=self.dtype, mode="r")
        except FileNotFoundError:
            pass
        raise UserError(f"{self.path} changed under this run (the dataset was prepared again or edited since the "
                        "run opened it); start the run again to train on the new data")


def tokens_checksum(meta):
    """sha256 of what a dataset's tokens are: its tokenizer and vocabulary, its shards' checksums and a chat
    dataset's roles. The same after a prepare that made the same tokens again (from a copy of its text, say);
    another where the dataset was prepared again otherwise, under the same name."""
    made = {k: meta.get(k) for k in ("tokenizer", "vocab", "train_shards", "val_shards", "roles", "tokenizer_sha256")}
    return hashlib.sha256(json.dumps(made, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def file_identity(stat):
    """What tells a file from its replacement (another inode) or from itself rewritten (size, modification time)."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def check_tokens(path, dtype, listed, vocab_size, unit="token id"):
    """The number of tokens in a token file and the file's identity, after one pass over it that checks what the
    metadata lists of it (its token count and checksum, where given). unit: what each value is, 'token id', or
    'role' for a chat dataset's roles file, whose values are 0 to vocab_size - 1 of a token's roles."""
    again = "run data/prepare.py for this dataset again"
    if not path.is_file():
        raise UserError(f"{path} {'is a folder' if path.is_dir() else 'not found'}; {again}")
    sha, largest = hashlib.sha256(), -1
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            if stat.st_size % dtype.itemsize:
                raise UserError(f"{path} has {stat.st_size:,} bytes, not a whole number of {dtype.name} tokens; "
                                f"{again}")
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
                largest = max(largest, int(np.frombuffer(block, dtype=dtype).max()))
    except OSError as e:
        raise UserError(f"could not read {path} ({e.strerror or e})") from None
    length = stat.st_size // dtype.itemsize
    if listed.get("tokens") is not None and length != listed["tokens"]:
        raise UserError(f"{path} has {length:,} tokens, meta.json says {listed['tokens']!r}; {again}")
    if largest >= vocab_size:
        outside = (f"outside the vocabulary of {vocab_size}" if unit == "token id"
                   else f"and a token's {unit} is 0 to {vocab_size - 1}")
        raise UserError(f"{path} holds {unit} {largest}, {outside}; {again}")
    if listed.get("sha256") is not None and sha.hexdigest() != listed["sha256"]:
        raise UserError(f"{path} is damaged: its contents do not match the checksum in meta.json; {again}")
    return length, file_identity(stat)


class BatchSampler:
    """Training windows from a generator of their own, so nothing else shifts the data order: in `order`
    'random', at random offsets (nanoGPT's: in a few epochs some text is seen many times and some hardly at all);
    in 'epochs', every window of an Epoch once before any again.

    The order is one for the whole run, however many processes share it: every process draws the windows of all
    `world` of them (the same generator, seeded alike) and keeps its own stride, rank r taking the r-th
    batch_size of each draw. So a run continued on another number of processes continues the same order, and
    `world` processes read exactly what one process reads in `world` micro-batches.

    Its state is the one from before the latest draw: the trainer always holds one batch fetched ahead and not
    yet trained on, and a run resumed from a checkpoint must draw that batch again. In 'epochs' that is the
    generator's state the epoch was drawn from and how many of its windows were drawn."""

    def __init__(self, split, batch_size, seed, device, order="random", rank=0, world=1):
        self.split, self.batch_size, self.device, self.order = split, batch_size, device, order
        self.rank, self.world = rank, world
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = self.epoch_drawn_from = None
        self.position = 0  # windows of the epoch drawn so far
        self.state_before_last = None

    def next(self):
        self.state_before_last = self.state_now()
        count = self.world * self.batch_size  # every process's windows, in rank order
        if self.order == "random":
            offsets = self.split.random_offsets(count, self.generator)
        else:
            offsets = torch.cat(list(self.epoch_offsets(count)))
        return self.split.batch(offsets[self.rank * self.batch_size:(self.rank + 1) * self.batch_size], self.device)

    def epoch_offsets(self, count):
        """The next `count` windows' offsets, from as many epochs as it takes (a split may hold fewer windows)."""
        while count:
            if self.epoch is None or self.position >= self.epoch.windows:
                self.start_epoch()
            take = min(count, self.epoch.windows - self.position)
            yield self.epoch.offsets(self.position, take)
            self.position, count = self.position + take, count - take

    def start_epoch(self):
        self.epoch_drawn_from = self.generator.get_state()
        self.epoch, self.position = Epoch(self.split.length, self.split.block_size, self.generator), 0

    def state_now(self):
        if self.epoch is None:
            return {"generator": self.generator.get_state()}
        return {"generator": self.epoch_drawn_from, "position": self.position}  # replaced, never changed: state_dict copies

    def state_dict(self):
        state = self.state_before_last if self.state_before_last is not None else self.state_now()
        return {**state, "generator": state["generator"].clone()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])
        self.epoch, self.position, self.state_before_last = None, 0, None
        if "position" in state and self.order == "epochs":
            self.start_epoch()
            self.position = min(state["position"], self.epoch.windows)  # past the end (other data): a new epoch


class Epoch:
    """One pass over a split in windows of block_size + 1 tokens, block_size apart from a random first offset
    (so every token is a target once), in a random order: each window's index is enciphered by a Feistel network
    over the next even power of two, again while it lands past the last window, which orders them all without a
    table (one would take 4 bytes a window: 91 MB for docs/corpora.md's 2.9B tokens in windows of 128)."""

    ROUNDS = 4

    def __init__(self, length, block_size, generator):
        self.block_size = block_size
        self.phase = int(torch.randint(min(block_size, length - block_size), (1,), generator=generator))
        self.windows = (length - 1 - self.phase) // block_size
        self.half_bits = ((self.windows - 1).bit_length() + 1) // 2 or 1
        self.keys = torch.randint(1 << 31, (self.ROUNDS,), generator=generator).tolist()

    def offsets(self, start, count):
        """The offsets of the windows at places start..start+count-1 of this epoch's order."""
        index = self.encipher(torch.arange(start, start + count, dtype=torch.int64))
        while (past := index >= self.windows).any():
            index = torch.where(past, self.encipher(index), index)
        return self.phase + index * self.block_size

    def encipher(self, index):
        mask = (1 << self.half_bits) - 1
        left, right = index >> self.half_bits, index & mask
        for key in self.keys:
            left, right = right, left ^ (mix32(right ^ key) & mask)
        return (left << self.half_bits) | right


def mix32(v):
    """A 32-bit integer hash (two multiply-xorshift rounds), elementwise on an int64 tensor."""
    for _ in range(2):
        v = ((v & 0xFFFFFFFF) * 0x45D9F3B) & 0xFFFFFFFF
        v = v ^ (v >> 16)
    return v


def fixed_offsets(split, batch_size, n_batches, seed=0):
    """The same evaluation windows at every evaluation, so val loss changes only when the model does."""
    generator = torch.Generator().manual_seed(seed)
    return [split.random_offsets(batch_size, generator) for _ in range(n_batches)]


class TrainingData:
    """What a run reads: both splits in block_size windows, the training batches (micro-batches of
    micro_batch sequences, this process's stride of the run's one order) and the same evaluation windows
    (eval_iters batches of batch_size) at every evaluation."""

    def __init__(self, folder, meta, block_size, batch_size, eval_iters, seed, device, batch_order="random",
                 micro_batch=None, rank=0, world=1, train_on="answers"):
        self.folder, self.meta, self.block_size = folder, meta, block_size
        self.tokenizer = tokenizer_from_meta(meta)
        if self.tokenizer.vocab_size != meta["vocab_size"]:
            raise UserError(f"{Path(folder) / 'meta.json'}: vocab_size is {meta['vocab_size']} but its tokenizer has "
                            f"{self.tokenizer.vocab_size} tokens; run data/prepare.py for this dataset again")
        if "chat" in meta and "roles" not in meta and train_on == "answers":  # else the loss would count every token
            raise UserError(f"{Path(folder) / 'meta.json'} lacks 'roles', which say the tokens that are answers; run "
                            "data/prepare.py for this dataset again, or train on every token with --train_on=all")
        self.splits = {name: Split(folder, name, meta, block_size, train_on) for name in ("train", "val")}
        self.sampler = BatchSampler(self.splits["train"], micro_batch or batch_size, seed, device, batch_order, rank,
                                    world)
        self.eval_offsets = {name: fixed_offsets(split, batch_size, eval_iters) for name, split in self.splits.items()}
