"""What a run starts from: its data (the dataset's splits and batches, the batch each process takes) and its
model (fresh, resumed or pretrained), with the seeds that make them the same for the same command."""

import math
import random
import re
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch

from gptkit.base.errors import UserError, what_does_not_fit
from gptkit.base.settings import make
from gptkit.data.conversations import MARKERS, shown
from gptkit.data.dataset import TrainingData, load_meta
from gptkit.data.tokenizer import describe_vocabulary, prepare_options, same_bpe, same_token_ids, trained_size
from gptkit.interop.hf import HUB_MODELS, crop_block_size, load_pretrained
from gptkit.machine.model_contract import check_forward, merged_lora
from gptkit.run.checkpoint import MODEL_KEYS, check_finite, load_checkpoint, load_weights, model_config
from gptkit.run.run_folder import RunDir, refuse_a_file
from gptkit.sampling.decoding import sees_ahead
from gptkit.training.train_config import TrainConfig
from model import GPT, GPTConfig, LoRAEmbedding, LoRALinear


def build_model(cfg, planned, meta, ckpt=None, path=None, rank=0, base=None, given=(), asked=()):
    """The model to train: of the planned shape, fresh or holding the checkpoint's weights (at path) it resumes,
    or the weights of the run it starts from (base), or for planned None pretrained GPT-2 weights (given, asked:
    the settings config files and the command line give, and those the command line gives, held against their
    shape); the generators seeded first, so that the same config gives the same weights (and then dropout's
    draws)."""
    seed_everything(cfg.seed + rank)
    if planned is None:
        model = pretrained(cfg, meta)
        kept_from_base(cfg, model.config, cfg.init_from, given, asked)
    else:
        model = GPT(planned)
        if ckpt is not None:
            load_weights(model, ckpt["model"], path)
        elif base is not None:
            load_base(model, base, meta, rank)
    total = model.num_params(non_embedding=False)
    if model.config.lora_rank and rank == 0:
        print(lora_line(model), flush=True)
    elif base is not None and rank == 0:  # lora_rank=0 given over a LoRA config's would otherwise go unsaid
        print(f"a full fine-tune: all {total:,} of the model's parameters train (lora_rank=R trains adapters of "
              "rank R instead, the base's weights frozen)", flush=True)
    if model.config.vocab_size < meta["vocab_size"]:
        raise UserError(f"dataset vocabulary ({meta['vocab_size']}) is larger than the model's "
                        f"({model.config.vocab_size})")
    check_forward(model)
    return model


def sees_ahead_line(model):
    """The note for a model whose positions see the tokens after them (the notes' encoder: causal=False, or a
    model.py whose mask an edit took out), whose loss is then no measure of what it writes; None for a decoder."""
    if not sees_ahead(model):
        return None
    why = "causal=False lets each position see the tokens after it" if not model.config.causal else (
        "model.py's attention lets each position see the tokens after it, though causal=True (an edit took out or "
        "changed the mask)")
    return (f"note: {why}: the next token, the one it is asked to predict, is among them, so its loss will fall "
            "far below what it can write, and its samples will be garbage")


# the layers model.py adapts, in words; a layer a learner's edit adapts besides is named as model.py names it
ADAPTED_WORDS = {"transformer.wte": "the token table", "attn.c_attn": "attention's q, k, v",
                 "attn.c_proj": "attention's output matrix", "mlp.c_fc": "the MLP's first matrix",
                 "mlp.c_proj": "the MLP's second matrix", "lm_head": "the head"}


def lora_line(model):
    """What a LoRA model trains, in one line: its rank, the adapters' parameters among all of the model's and the
    layers they adapt (train.py prints it as a fine-tune starts; the explorer's runs list shows it)."""
    total, trained = model.num_params(non_embedding=False), model.trainable_params()
    *parts, last = adapted_parts(model) or ["no layer"]
    return (f"LoRA rank {model.config.lora_rank}: {trained:,} of the model's {total:,} parameters train "
            f"({100 * trained / total:.1f}%): the adapters on {', '.join(parts)}{' and ' * bool(parts)}{last}; "
            "the base model's weights are frozen")


def adapted_parts(model):
    """The layers that hold LoRA adapters, once each however many blocks have them, in the model's order."""
    parts = []
    for name, module in model.named_modules():
        if isinstance(module, (LoRALinear, LoRAEmbedding)):
            part = re.sub(r"^transformer\.h\.\d+\.", "", name)
            words = ADAPTED_WORDS.get(part, part)
            if words not in parts:
                parts.append(words)
    return parts


def pretrained(cfg, meta):
    """GPT-2's weights (init_from a GPT-2 name or a save_pretrained folder), refused for a dataset they cannot read."""
    if meta["tokenizer"] != "tiktoken":  # GPT-2's weights know GPT-2's token ids only
        what = "char-level" if meta["tokenizer"] == "char" else "tokenized by a BPE trained on it"
        raise UserError(f"init_from={cfg.init_from!r} needs GPT-2's BPE tokens, but dataset {cfg.dataset!r} is "
                        f"{what}; prepare it with `python data/prepare.py --input=FILE --name=NAME "
                        "--tokenizer=gpt2`")
    if meta.get("chat"):  # the markers' ids are past GPT-2's table, which a pretrained model does not grow
        raise UserError(f"init_from={cfg.init_from!r}: GPT-2's weights have no rows for the chat markers of dataset "
                        f"{cfg.dataset!r}; fine-tune them on text prepared with --tokenizer=gpt2 first, then start "
                        "the chat fine-tune from that run (--init_from=its out_dir)")
    if cfg.model.lora_rank and cfg.init_from in HUB_MODELS:  # said before the download
        raise tied_head(cfg)
    model = load_pretrained(cfg.init_from, dropout=cfg.model.dropout)
    if meta["vocab_size"] > model.config.vocab_size:
        raise UserError(f"dataset {cfg.dataset!r} has {meta['vocab_size']:,} token ids, more than the "
                        f"{model.config.vocab_size:,} of the model in {cfg.init_from}, which was not trained on "
                        "GPT-2's tokens; start from a GPT-2 model (gpt2, or a folder of one)")
    if cfg.model.lora_rank:
        model = with_adapters(model, cfg)
    block_size = cfg.model.block_size
    if block_size > model.config.block_size:  # as for resume: never train on a shorter context unasked
        raise UserError(f"block_size {block_size} is larger than {cfg.init_from!r}'s "
                        f"{model.config.block_size} positions; pass --block_size={model.config.block_size}")
    if block_size < model.config.block_size:
        crop_block_size(model, block_size)
    return model


def with_adapters(model, cfg):
    """GPT-2's weights with LoRA's adapters beside them (B at zero: the same model to start), for an untied head."""
    if model.config.tie_weights:
        raise tied_head(cfg)
    try:
        adapted = GPT(replace(model.config, lora_rank=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha))
    except ValueError as e:  # a rank over the width
        raise UserError(f"the model in {cfg.init_from}: {e}") from None
    adapted.load_state_dict(model.state_dict(), strict=False)  # every weight but the adapters', which start afresh
    return adapted


def tied_head(cfg):
    return UserError(f"lora_rank={cfg.model.lora_rank} with init_from={cfg.init_from!r}: its head is its token table "
                     "(GPT-2's own are tied), and LoRA gives each its own adapter; fine-tune it in full (--lora_rank=0)")


def seed_everything(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def open_data(cfg, rt, ckpt=None, ckpt_path=None):
    """(TrainingData, sequences per optimizer step) for the run: its dataset's splits, batches and evaluation
    windows, checked against the checkpoint it resumes. Opened before anything is timed or built, so that a missing
    or damaged shard is one line at once."""
    sequences = global_batch(cfg, rt.world, ckpt, ckpt_path)
    micro_batch, _ = batch_shares(sequences, cfg.batch_size, rt.world)
    folder, meta = load_meta(cfg.data_dir, cfg.dataset)
    if ckpt is not None and not same_token_ids(ckpt["tokenizer"], meta):
        raise UserError(other_vocabulary(cfg, folder, meta, ckpt, ckpt_path))
    data = TrainingData(folder, meta, cfg.model.block_size, cfg.batch_size, cfg.eval_iters, cfg.seed, rt.device,
                        cfg.batch_order, micro_batch, rt.rank, rt.world, cfg.train_on)
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
                                f"bpe{trained_size(learned)}" if kind == "bpe" else kind)
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


def planned_model(cfg, meta, ckpt=None, path=None, base=None, given=(), asked=()):
    """The GPTConfig build_model will build: the checkpoint's; the shape of the run it starts from (base) with
    the dataset's vocabulary and the config's dropout, context and LoRA; or the config's with the dataset's
    vocabulary (model_vocab: padded to a multiple of 64 for faster matmuls, but for characters); None for
    pretrained weights, whose shape is known once they load. given, asked: the keys config files and the
    command line give, and those the command line gives."""
    if ckpt is not None:
        return model_config(ckpt, path, dropout=cfg.model.dropout)
    if base is not None:
        return from_base(cfg, meta, base, given, asked)
    if cfg.init_from != "scratch":
        return None
    if cfg.model.lora_rank and cfg.model.tie_weights:  # a fine-tune's head is its base's, checked there
        raise UserError(f"lora_rank={cfg.model.lora_rank} on a new model: its head is its token table (tie_weights="
                        "True), and LoRA gives each its own adapter; LoRA fine-tunes a trained run (--init_from=OUT), "
                        "or give --tie_weights=False")
    return replace(cfg.model, vocab_size=model_vocab(meta))


def model_vocab(meta):
    """A new model's vocabulary for a dataset's: char-level, the same; else padded to a multiple of 64 for faster
    matmuls."""
    if meta["tokenizer"] == "char":
        return meta["vocab_size"]
    return math.ceil(meta["vocab_size"] / 64) * 64  # the extra rows are never targets


def global_batch(cfg, world, ckpt=None, path=None):
    """Sequences per optimizer step over every process: batch_size in each micro-batch, gradient_accumulation_steps
    micro-batches divided among the processes, at least one each. A resumed run (ckpt, from path) keeps the number
    it started with, on however many processes it continues, unless batch_size or gradient_accumulation_steps are
    given anew."""
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
    sequences = ckpt["global_batch"]
    # started_on gave it: batch_size times the accumulation steps, or times the processes where they were more
    if sequences % cfg.batch_size or sequences < cfg.batch_size * accumulation_steps:
        raise UserError(f"{path} is damaged: global_batch is {sequences:,} sequences a step, which its batch_size "
                        f"({cfg.batch_size}) and gradient_accumulation_steps ({accumulation_steps}) do not give")
    return sequences


def batch_shares(sequences, batch_size, world):
    """(sequences per micro-batch, micro-batches per step) for each of `world` processes, so that together
    they take `sequences` a step: the fewest micro-batches of at most batch_size sequences."""
    per_process, left = divmod(sequences, world)
    for accum in range(max(1, -(-per_process // batch_size)), per_process + 1) if not left else ():
        if per_process % accum == 0 and per_process // accum <= batch_size:
            return per_process // accum, accum
    raise UserError(f"this run takes {sequences} sequences a step, which {world} processes cannot share evenly; "
                    f"continue it on a number of processes that divides {sequences}, or give batch_size and "
                    "gradient_accumulation_steps again for another number a step")




def base_run(init_from):
    """(checkpoint, path) of the run init_from names (a folder train.py wrote: its best weights), as nanoGPT
    fine-tunes; None where init_from is no such folder (scratch, a resume, GPT-2's weights)."""
    folder = Path(init_from)
    if init_from in ("scratch", "resume", "auto", *HUB_MODELS) or (folder / "config.json").exists():
        return None  # a save_pretrained folder holds config.json: GPT-2's weights
    refuse_a_file(init_from, "init_from")
    if not folder.is_dir():
        raise UserError(f"init_from={init_from!r}: no such folder; train the model to start from there first, "
                        f"e.g. `python train.py config/shakespeare_char.py --out_dir={init_from}`")
    run = RunDir(folder)
    if not any(p.exists() for p in (run.best, run.legacy)):
        if run.latest.exists():  # a fine-tune starts from the best weights, which a first evaluation writes
            raise UserError(f"init_from={init_from!r} holds no best.pt yet (its run has not finished an "
                            f"evaluation): continue that run to one first, with `python train.py CONFIG "
                            f"--out_dir={init_from} --init_from=auto`, CONFIG being its config file")
        raise UserError(f"init_from={init_from!r} holds no run (no best.pt): train one there first, e.g. "
                        f"`python train.py config/shakespeare_char.py --out_dir={init_from}`")
    path = run.model_file("best")
    return load_checkpoint(path, required=MODEL_KEYS), path


def from_base(cfg, meta, base, given=(), asked=()):
    """The model a run started from `base` trains: base's shape, the dataset's vocabulary (padded as a new
    model's), and the config's dropout, context length and LoRA settings (FINE_TUNE_KEYS). The dataset must be
    tokenized as the base was: char-level, with any characters (rows move by character); a BPE, by the same one,
    with or without the chat markers."""
    ckpt, path = base
    was, learned = model_config(ckpt, path), ckpt["tokenizer"]
    kept_from_base(cfg, was, path, given, asked)
    if cfg.model.block_size > was.block_size:
        raise UserError(f"block_size {cfg.model.block_size} is longer than the {was.block_size} positions "
                        f"{path} was trained on; pass --block_size={was.block_size} or less")
    both_char = learned.get("tokenizer") == meta["tokenizer"] == "char"
    if not (both_char or same_bpe(learned, meta)):
        fix = (f"prepare the dataset with {prepare_options(learned)}" if learned.get("tokenizer") != "bpe" else
               "a trained BPE's are its own dataset's (a chat dataset trains its own): start from a run trained "
               "char-level or with --tokenizer=gpt2")
        raise UserError(f"{path} was trained on {describe_vocabulary(learned)}, but dataset {cfg.dataset!r} has "
                        f"{describe_vocabulary(meta)}: a fine-tune needs the token ids its base model learned; {fix}")
    if cfg.model.lora_rank and was.tie_weights:
        raise UserError(f"{path}'s model ties its head to its token table, and LoRA gives each its own adapter: "
                        "fine-tune it in full (--lora_rank=0)")
    try:
        return replace(was, vocab_size=model_vocab(meta), dropout=cfg.model.dropout, block_size=cfg.model.block_size,
                       lora_rank=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha)
    except ValueError as e:  # the config's LoRA settings checked against the base's shape, e.g. a rank over its width
        raise UserError(f"{path}'s model: {e}") from None


# what a fine-tune takes from its config rather than from its base model (the vocabulary comes from its dataset)
FINE_TUNE_KEYS = ("vocab_size", "dropout", "block_size", "lora_rank", "lora_alpha")


def given_config(given, asked):
    """TrainConfig from the settings config files and the command line give (asked: the keys the command line
    gives). A fine-tune trains its base run's model, whose shape the config's only stands in for (kept_from_base):
    a LoRA rank above the stand-in's width is checked against the base's, the width the line then names, and the
    base's shape stands in instead."""
    rank, init_from = given.get("lora_rank", 0), given.get("init_from", TrainConfig.init_from)
    base = base_run(init_from) if rank > given.get("n_embd", GPTConfig.n_embd) else None
    if base is None:
        return make(TrainConfig, given)
    was = model_config(*base)
    try:
        replace(was, lora_rank=rank)
    except ValueError as e:
        raise UserError(f"{base[1]}'s model: {e}") from None
    shape = {f.name: getattr(was, f.name) for f in fields(was) if f.name not in FINE_TUNE_KEYS + tuple(asked)}
    return make(TrainConfig, {**given, **shape})


def kept_from_base(cfg, was, path, given, asked):
    """A fine-tune trains its base's model: any other model setting the command line gives is refused in one
    line, and a config file's is said to give way to the base's (a fine-tune config may build on the base run's,
    whose shape a machine fitted)."""
    for key in (f.name for f in fields(was) if f.name not in FINE_TUNE_KEYS and f.name in given):
        mine, base = getattr(cfg.model, key), getattr(was, key)
        if mine == base:
            continue
        if key in asked:
            raise UserError(f"--{key}={mine!r}: {path}'s model was built with {key}={base!r}, and a fine-tune "
                            f"trains the model it starts from; drop --{key}, or train a new model with it "
                            "(--init_from=scratch)")
        print(f"note: the config's {key}={mine!r} gives way to {path}'s {base!r}: a fine-tune trains the model it "
              "starts from", flush=True)


def load_base(model, base, meta, rank):
    """The base run's weights in model, each token's embedding and head rows moved to the id it has in this
    dataset's vocabulary (token_keys); a token the base never knew starts fresh, as a new model's would, even
    where the base's padded table has a row at its id, which never trained. One line says how the vocabulary
    changed."""
    ckpt, path = base
    old, new = token_keys(ckpt["tokenizer"], meta), token_keys(meta, meta)
    was = model_config(ckpt, path)
    check_finite(ckpt["model"], path)
    try:
        weights, _ = merged_lora(dict(ckpt["model"]), was)  # a LoRA run: its adapters folded in
    except ValueError as e:  # model.py's adapter, as edited, computes what no plain matrix does
        raise UserError(f"{path}'s LoRA adapters cannot be folded into its matrices to fine-tune from: {e}") from None
    except (RuntimeError, KeyError) as e:  # an adapter missing, or model.py's LoRA layers no longer hold its names
        raise UserError(f"{path}'s LoRA adapters do not fit model.py's LoRA layers ({what_does_not_fit(e)})") \
            from None
    tables = [k for k in ("transformer.wte.weight", "lm_head.weight") if k in weights]
    own, at = model.state_dict(), {key: i for i, key in enumerate(new)}
    kept = [(at[key], i) for i, key in enumerate(old) if key in at]
    try:
        for key in tables:
            table = own[key].clone()
            table[[n for n, _ in kept]] = weights[key][[i for _, i in kept]].to(table.dtype)
            weights[key] = table
        if "transformer.wpe.weight" in weights:
            weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][:model.config.block_size]
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except (IndexError, RuntimeError) as e:  # a tensor of another shape than the model it names
        raise UserError(f"{path}'s weights do not fit the model it names ({what_does_not_fit(e)})") from None
    if unexpected or any("lora_" not in k for k in missing):
        raise UserError(f"{path}'s weights do not fit the model it names ({', '.join((unexpected or missing)[:3])})")
    known = set(old)
    added = [(i, key) for i, key in enumerate(new) if key not in known]
    if rank == 0 and (added or len(kept) < len(old)):
        print(vocabulary_line(old, new, kept, added, was.vocab_size), flush=True)


def vocabulary_line(old, new, kept, added, base_rows):
    """How a fine-tune's vocabulary changed from its base model's: the tokens added (named), those kept, those
    dropped; and where the base's table, padded to base_rows, had rows at new tokens' ids, that those rows never
    trained (they were padding) and start afresh."""
    parts = [f"the vocabulary {'grows' if len(new) >= len(old) else 'shrinks'} from {len(old)} to {len(new)} tokens"]
    if added:
        names = ", ".join(shown(key) for _, key in added[:12]) + (", ..." if len(added) > 12 else "")
        untrained = [i for i, _ in added if len(old) <= i < base_rows]
        parts[0] += (f": {len(added)} new rows in the embedding and the head ({names}), each new"
                     + (f" (the base model's rows {untrained[0]}-{untrained[-1]}, padding it never trained, start "
                        "afresh)" if untrained else ""))
    parts.append(f"the {len(kept)} the base model knew keep their rows")
    if len(kept) < len(old):
        parts.append(f"{len(old) - len(kept)} it knew are not in this dataset and are dropped")
    return "; ".join(parts)


def token_keys(tokenizer, meta):
    """What each token id of a tokenizer's metadata (a base run's, or the dataset's) stands for, to match a base
    model's rows with a dataset's ids: char-level, its character; a BPE's, its id (from_base checked that the
    two BPEs are one), and the chat markers, where it has them, their characters."""
    if tokenizer["tokenizer"] == "char":
        return list(tokenizer["vocab"])
    plain = meta["vocab_size"] - (len(MARKERS) if meta.get("chat") else 0)
    return [*range(plain), *(MARKERS.values() if tokenizer.get("chat") else ())]
