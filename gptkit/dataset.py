"""A prepared dataset: its metadata and token files, and the training and evaluation batches drawn from them."""

import json
from pathlib import Path

import numpy as np
import torch

from gptkit.corpus import TOKEN_DTYPES, data_root
from gptkit.errors import UserError
from gptkit.tokenizer import tokenizer_from_meta


def load_meta(data_dir, dataset):
    folder = Path(dataset) if "/" in dataset else data_root(data_dir) / dataset
    if not folder.is_dir():
        # with no --input, prepare.py downloads tinyshakespeare into exactly this folder
        how = ("python data/prepare.py" if folder.name == "shakespeare_char" else
               f"python data/prepare.py --input=YOUR.txt --name={folder.name}")
        how += f" --data_dir={data_dir}" if data_dir and "/" not in dataset else ""  # where this run looks
        raise UserError(f"dataset folder {folder} not found; create it with `{how}`")
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{folder}/meta.json not found; run data/prepare.py for this dataset again") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{folder}/meta.json is not valid JSON ({e})") from None
    check_meta(meta, folder / "meta.json")
    return folder, meta


def check_meta(meta, path):
    """The fields training reads, and a token type that can hold every token id."""
    missing = [k for k in ("tokenizer", "vocab_size", "dtype") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; run data/prepare.py for this dataset again")
    dtype, vocab = meta["dtype"], meta["vocab_size"]
    if dtype not in TOKEN_DTYPES:
        raise UserError(f"{path}: token dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
    if not isinstance(vocab, int) or not 0 < vocab <= TOKEN_DTYPES[dtype]:
        raise UserError(f"{path}: a vocabulary of {vocab} tokens does not fit {dtype} token files "
                        f"(at most {TOKEN_DTYPES[dtype]:,}); run data/prepare.py again")


class Split:
    """One split's tokens on disk, opened afresh per read so the memmap never pins memory."""

    def __init__(self, folder, name, dtype, block_size):
        self.path = Path(folder) / f"{name}.bin"
        if not self.path.exists():
            raise UserError(f"{self.path} not found; run data/prepare.py for this dataset again")
        if dtype not in TOKEN_DTYPES:
            raise UserError(f"token dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
        self.dtype = np.dtype(dtype)
        self.length = self.path.stat().st_size // self.dtype.itemsize
        if self.length < block_size + 1:
            raise UserError(f"{self.path} has {self.length} tokens, fewer than block_size + 1 = {block_size + 1}; "
                            "use a smaller --block_size or more text")
        self.block_size = block_size

    def batch(self, offsets, device):
        tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        rows = tokens[offsets.numpy()[:, None] + np.arange(self.block_size + 1)].astype(np.int64)
        xy = torch.from_numpy(rows)
        if device.startswith("cuda"):
            xy = xy.pin_memory().to(device, non_blocking=True)
        else:
            xy = xy.to(device)
        return xy[:, :-1], xy[:, 1:]

    def random_offsets(self, batch_size, generator):
        return torch.randint(self.length - self.block_size, (batch_size,), generator=generator)


class BatchSampler:
    """Random training windows from a generator of their own, so nothing else shifts the data order.

    Its state is the one from before the latest draw: the trainer always holds one batch fetched
    ahead and not yet trained on, and a run resumed from a checkpoint must draw that batch again."""

    def __init__(self, split, batch_size, seed, device):
        self.split, self.batch_size, self.device = split, batch_size, device
        self.generator = torch.Generator().manual_seed(seed)
        self.state_before_last = None

    def next(self):
        self.state_before_last = self.generator.get_state()
        return self.split.batch(self.split.random_offsets(self.batch_size, self.generator), self.device)

    def state_dict(self):
        state = self.state_before_last if self.state_before_last is not None else self.generator.get_state()
        return {"generator": state.clone()}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])
        self.state_before_last = None


def fixed_offsets(split, batch_size, n_batches, seed=0):
    """The same evaluation windows at every evaluation, so val loss changes only when the model does."""
    generator = torch.Generator().manual_seed(seed)
    return [split.random_offsets(batch_size, generator) for _ in range(n_batches)]


class TrainingData:
    """What a run reads: both splits in block_size windows, the training batches (a sampler of its own,
    seeded per process) and the same evaluation windows at every evaluation."""

    def __init__(self, folder, meta, block_size, batch_size, eval_iters, seed, device):
        self.meta, self.block_size = meta, block_size
        self.tokenizer = tokenizer_from_meta(meta)
        self.splits = {name: Split(folder, name, meta["dtype"], block_size) for name in ("train", "val")}
        self.sampler = BatchSampler(self.splits["train"], batch_size, seed, device)
        self.eval_offsets = {name: fixed_offsets(split, batch_size, eval_iters) for name, split in self.splits.items()}
