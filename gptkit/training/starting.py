"""What a run starts from: its data (the dataset's splits and batches, the batch each process takes) and its
model (fresh, resumed or pretrained), with the seeds that make them the same for the same command."""

import math
import random
from dataclasses import replace

import numpy as np
import torch

from gptkit.base.errors import UserError
from gptkit.data.dataset import TrainingData, load_meta
from gptkit.data.tokenizer import describe_vocabulary, prepare_options, same_token_ids
from gptkit.interop.hf import crop_block_size, load_pretrained
from gptkit.run.checkpoint import load_weights, model_config
from model import GPT


def build_model(cfg, planned, meta, ckpt=None, path=None, rank=0):
    """The model to train: of the planned shape, fresh or holding the checkpoint's weights (at path) it resumes,
    or for planned None pretrained GPT-2 weights; the generators seeded first, so that the same config gives the
    same weights (and then dropout's draws)."""
    seed_everything(cfg.seed + rank)
    if planned is None:
        model = pretrained(cfg, meta)
    else:
        model = GPT(planned)
        if ckpt is not None:
            load_weights(model, ckpt["model"], path)
    if model.config.vocab_size < meta["vocab_size"]:
        raise UserError(f"dataset vocabulary ({meta['vocab_size']}) is larger than the model's "
                        f"({model.config.vocab_size})")
    return model


def pretrained(cfg, meta):
    """GPT-2's weights (init_from a GPT-2 name or a save_pretrained folder), refused for a dataset they cannot read."""
    if meta["tokenizer"] != "tiktoken":  # GPT-2's weights know GPT-2's token ids only
        what = "char-level" if meta["tokenizer"] == "char" else "tokenized by a BPE trained on it"
        raise UserError(f"init_from={cfg.init_from!r} needs GPT-2's BPE tokens, but dataset {cfg.dataset!r} is "
                        f"{what}; prepare it with `python data/prepare.py --input=FILE --name=NAME "
                        "--tokenizer=gpt2`")
    model = load_pretrained(cfg.init_from, dropout=cfg.model.dropout)
    if meta["vocab_size"] > model.config.vocab_size:
        raise UserError(f"dataset {cfg.dataset!r} has {meta['vocab_size']:,} token ids, more than "
                        f"{cfg.init_from!r}'s {model.config.vocab_size:,}; prepare it with --tokenizer=gpt2")
    block_size = cfg.model.block_size
    if block_size > model.config.block_size:  # as for resume: never train on a shorter context unasked
        raise UserError(f"block_size {block_size} is larger than {cfg.init_from!r}'s "
                        f"{model.config.block_size} positions; pass --block_size={model.config.block_size}")
    if block_size < model.config.block_size:
        crop_block_size(model, block_size)
    return model


def seed_everything(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def open_data(cfg, rt, ckpt=None, ckpt_path=None):
    """(TrainingData, sequences per optimizer step) for the run: its dataset's splits, batches and evaluation
    windows, checked against the checkpoint it resumes. Opened before anything is timed or built, so that a missing
    or damaged shard is one line at once."""
    sequences = global_batch(cfg, rt.world, ckpt)
    micro_batch, _ = batch_shares(sequences, cfg.batch_size, rt.world)
    folder, meta = load_meta(cfg.data_dir, cfg.dataset)
    if ckpt is not None and not same_token_ids(ckpt["tokenizer"], meta):
        raise UserError(other_vocabulary(cfg, folder, meta, ckpt, ckpt_path))
    data = TrainingData(folder, meta, cfg.model.block_size, cfg.batch_size, cfg.eval_iters, cfg.seed, rt.device,
                        cfg.batch_order, micro_batch, rt.rank, rt.world)
    return data, sequences


def other_vocabulary(cfg, folder, meta, ckpt, ckpt_path):
    """The line refusing to resume on a dataset of other token ids, with a command that gets the run going: on the
    dataset it was trained on, where that still holds its ids; else its text prepared again with its tokenizer
    (which the checkpoint names; the text it does not keep), beside this dataset."""
    learned = ckpt["tokenizer"]
    head = (f"dataset {cfg.dataset!r} has {describe_vocabulary(meta)}, but {ckpt_path} was trained on "
            f"{describe_vocabulary(learned)}; a resumed run must see the token ids it learned")
    data_dir, dataset = ckpt["config"].get("data_dir", cfg.data_dir), ckpt["config"].get("dataset", cfg.dataset)
    if (data_dir, dataset) != (cfg.data_dir, cfg.dataset) and holds_token_ids(data_dir, dataset, learned):
        flags = f"--dataset={dataset}" + (f" --data_dir={data_dir}" if data_dir != cfg.data_dir else "")
        return f"{head}: resume on the dataset it was trained on with {flags}, or start a new out_dir"
    kind = learned.get("tokenizer")
    name = f"{folder.name}_" + (learned.get("encoding") if kind == "tiktoken" else
                                f"bpe{learned.get('vocab_size')}" if kind == "bpe" else kind)
    elsewhere = "/" in cfg.dataset or cfg.data_dir  # else prepare's default, this project's data/
    return (f"{head}: prepare its text again with its tokenizer, `python data/prepare.py --input=TEXT --name={name} "
            f"{prepare_options(learned)}{f' --data_dir={folder.parent}' if elsewhere else ''}`, TEXT being the text "
            f"it was trained on, and resume with --dataset={folder.parent / name if '/' in cfg.dataset else name}; "
            "or start a new out_dir")


def holds_token_ids(data_dir, dataset, tokenizer):
    """Whether a dataset is there and gives the token ids of a tokenizer's metadata."""
    try:
        return same_token_ids(tokenizer, load_meta(data_dir, dataset)[1])
    except UserError:
        return False


def planned_model(cfg, meta, ckpt=None, path=None):
    """The GPTConfig build_model will build: the checkpoint's, or the config's with the dataset's vocabulary
    (padded to a multiple of 64 for faster matmuls, but for characters); None for pretrained weights, whose shape
    is known once they load."""
    if ckpt is not None:
        return model_config(ckpt, path, dropout=cfg.model.dropout)
    if cfg.init_from != "scratch":
        return None
    vocab = meta["vocab_size"]
    if meta["tokenizer"] != "char":
        vocab = math.ceil(vocab / 64) * 64  # the extra rows are never targets
    return replace(cfg.model, vocab_size=vocab)


def global_batch(cfg, world, ckpt=None):
    """Sequences per optimizer step over every process: batch_size in each micro-batch, gradient_accumulation_steps
    micro-batches divided among the processes, at least one each. A resumed run keeps the number it started with,
    on however many processes it continues, unless batch_size or gradient_accumulation_steps are given anew."""
    accumulation_steps = cfg.gradient_accumulation_steps
    if accumulation_steps > world and accumulation_steps % world:
        raise UserError(f"gradient_accumulation_steps ({accumulation_steps}) must be divisible "
                        f"by the number of processes ({world})")
    def started_on(processes):
        return cfg.batch_size * processes * max(1, accumulation_steps // processes)

    if ckpt is None:
        return started_on(world)
    saved = ckpt["config"]
    if (saved.get("batch_size"), saved.get("gradient_accumulation_steps")) != (cfg.batch_size, accumulation_steps):
        return started_on(world)
    return ckpt["global_batch"]


def batch_shares(sequences, batch_size, world):
    """(sequences per micro-batch, micro-batches per step) for each of `world` processes, so that together
    they take `sequences` a step: the fewest micro-batches of at most batch_size sequences."""
    per_process, left = divmod(sequences, world)
    for accum in range(1, per_process + 1) if not left else ():
        if per_process % accum == 0 and per_process // accum <= batch_size:
            return per_process // accum, accum
    raise UserError(f"this run takes {sequences} sequences a step, which {world} processes cannot share evenly; "
                    f"continue it on a number of processes that divides {sequences}, or give batch_size and "
                    "gradient_accumulation_steps again for another number a step")


