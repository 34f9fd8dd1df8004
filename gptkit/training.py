"""The parts train.py's loop is made of: its config, the state a checkpoint saves and restores,
the model it starts from, and evaluation."""

import math
import os
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

import numpy as np
import torch

from gptkit.checkpoint import model_from_checkpoint, save_checkpoint
from gptkit.config import closest, require
from gptkit.dataset import TrainingData, load_meta
from gptkit.errors import UserError
from gptkit.hf_interop import HUB_MODELS, load_pretrained
from gptkit.optim import build_optimizers
from gptkit.runtime import (allow_eager_fallback, check_device_name, compile_blocks, cpu_bf16_speedup, cpu_has_bf16,
                            pick_attention_path)
from gptkit.tokenizer import describe_vocabulary, same_token_ids
from model import GPT, GPTConfig


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"  # where latest.pt, best.pt and metrics.jsonl go
    eval_interval: int = 250  # evaluate (and save the latest state) every this many iterations
    log_interval: int = 10  # print and record the train loss every this many iterations
    eval_iters: int = 20  # batches per split in each evaluation (the same fixed batches every time)
    final_eval_tokens: int = 0  # at the end, score this many val tokens in consecutive windows (0 = the whole split)
    eval_only: bool = False  # evaluate once, record it and exit; no checkpoint is ever written
    always_save_checkpoint: bool = True  # save latest.pt at every evaluation, not only when val loss improves
    init_from: str = "scratch"  # 'scratch', 'resume', 'auto' (resume if out_dir has a state), a GPT-2 name or HF folder
    seed: int = 1337  # seeds weights, data order and dropout
    # wandb
    wandb_log: bool = False  # log to Weights & Biases
    wandb_project: str = "nanogpt"  # wandb project name
    wandb_run_name: str = "run"  # wandb run name
    # data
    data_dir: str = ""  # folder holding prepared datasets ('' = this project's data/)
    dataset: str = "shakespeare_char"  # subfolder of data_dir made by data/prepare.py
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step (over all DDP ranks)
    batch_size: int = 12  # sequences per micro-batch
    # the model: every setting of model.py's GPTConfig, except the vocabulary, which the dataset sets
    model: GPTConfig = field(default_factory=GPTConfig, metadata={"not_settable": ("vocab_size",)})
    # optimizer
    optimizer: Literal["adamw", "muon"] = "adamw"  # AdamW, or Muon on hidden matrices and AdamW on the rest
    learning_rate: float = 6e-4  # peak AdamW learning rate
    embedding_lr: float = 0.0  # peak AdamW learning rate of the token and position embeddings (0 = learning_rate)
    max_iters: int = 5000  # optimizer steps in the whole run
    weight_decay: float = 0.1  # AdamW weight decay on matrices and embeddings
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip gradients at this norm; 0 disables
    muon_lr: float = 0.02  # Muon learning rate for hidden matrices
    muon_momentum: float = 0.95  # Muon momentum
    muon_weight_decay: float = 0.0  # Muon weight decay
    # learning-rate schedule
    decay_lr: bool = True  # False keeps learning_rate constant (no warmup either, as nanoGPT)
    lr_schedule: Literal["cosine", "wsd"] = "cosine"  # nanoGPT's cosine, or warmup-stable-decay (linear)
    warmup_iters: int = 100  # linear warmup steps
    lr_decay_iters: int = 0  # cosine reaches min_lr here (0 = max_iters)
    min_lr: float = 6e-5  # floor of the cosine schedule
    warmdown_frac: float = 0.5  # 'wsd': fraction of the run spent decaying to min_lr
    max_time: float = 0.0  # >0: stop after this many seconds of the loop; the schedule follows max(iter, time) progress
    # system
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # DDP backend: 'auto' is nccl on CUDA, gloo on CPU
    device: str = "auto"  # 'auto' (cuda, then mps, then cpu), or 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # 'auto': bf16 where it is fast, else fp32
    compile: bool = False  # torch.compile each transformer block
    attention_path: Literal["auto", "fused", "written"] = "auto"  # scaled/dot attention: measured, SDPA, or softmax
    threads: int = 0  # torch CPU threads (0 = torch's default)

    def __post_init__(self):
        require(self, ["eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps", "batch_size",
                       "max_iters"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup_iters", "lr_decay_iters", "threads", "learning_rate", "embedding_lr", "min_lr",
                       "muon_lr", "weight_decay", "muon_weight_decay", "grad_clip", "max_time", "final_eval_tokens"],
                lambda v: v >= 0, "at least 0")
        require(self, ["beta1", "beta2", "muon_momentum"], lambda v: 0 <= v < 1, "in [0, 1)")
        require(self, ["warmdown_frac"], lambda v: 0 <= v <= 1, "in [0, 1]")
        require(self, ["seed"], lambda v: 0 <= v < 2 ** 31, "in [0, 2**31)")  # numpy takes seeds below 2**32
        check_device_name(self.device)
        starts = ["scratch", "resume", "auto", *HUB_MODELS]
        if self.init_from not in starts and os.sep not in self.init_from and not os.path.isdir(self.init_from):
            raise ValueError(f"init_from must be one of {', '.join(starts)} or a folder saved by save_pretrained "
                             f"(got {self.init_from!r}{closest(self.init_from, starts)})")


def build_model(cfg, meta, ckpt=None, path=None):
    """The model to train: fresh, from the checkpoint (at path) being resumed, or pretrained GPT-2 weights."""
    block_size = cfg.model.block_size
    if ckpt is not None:  # resumed_config has made the shape the checkpoint's
        model = model_from_checkpoint(ckpt, path, dropout=cfg.model.dropout)
    elif cfg.init_from == "scratch":
        vocab = meta["vocab_size"]
        if meta["tokenizer"] != "char":
            vocab = math.ceil(vocab / 64) * 64  # padded for faster matmuls; the extra rows are never targets
        model = GPT(replace(cfg.model, vocab_size=vocab))
    else:
        if meta["tokenizer"] == "char":
            raise UserError(f"init_from={cfg.init_from!r} needs GPT-2's BPE tokens, but dataset {cfg.dataset!r} is "
                            "char-level; prepare it with `python data/prepare.py --input=FILE --name=NAME "
                            "--tokenizer=gpt2`")
        model = load_pretrained(cfg.init_from, dropout=cfg.model.dropout)
        if meta["vocab_size"] > model.config.vocab_size:
            raise UserError(f"dataset {cfg.dataset!r} has {meta['vocab_size']:,} token ids, more than "
                            f"{cfg.init_from!r}'s {model.config.vocab_size:,}; prepare it with --tokenizer=gpt2")
        if block_size > model.config.block_size:  # as for resume: never train on a shorter context unasked
            raise UserError(f"block_size {block_size} is larger than {cfg.init_from!r}'s "
                            f"{model.config.block_size} positions; pass --block_size={model.config.block_size}")
    if block_size < model.config.block_size:
        model.crop_block_size(block_size)
    return model


def seed_everything(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def rng_state(sampler):
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "sampler": sampler.state_dict()}
    np_state = np.random.get_state()
    state["numpy"] = [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state, sampler):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    sampler.load_state_dict(state["sampler"])


class TrainState:
    """What a checkpoint saves and restores: the model, its optimizers and gradient scaler, the tokenizer,
    the loop's counters, and every process's random generators, the data sampler's included."""

    def __init__(self, cfg, model, tokenizer, sampler, rt, measured):
        self.cfg, self.model, self.tokenizer, self.sampler = cfg, model, tokenizer, sampler
        self.measured = measured  # the precision and attention path chosen by measurement, kept for a resume
        self.optimizers = build_optimizers(model, cfg, rt.device)
        self.scaler = torch.amp.GradScaler(rt.device.split(":")[0], enabled=rt.dtype == "float16")
        self.iter_num = 0  # optimizer steps taken
        self.best_val_loss = math.inf
        self.loop_seconds = 0.0  # wall time spent in the training loop so far (steps, evaluations and saves)
        self.wandb_id = None  # the wandb run this one continues

    def save_latest(self, run, rt):
        """Write latest.pt from rank 0, keeping the state it replaces as latest.prev.pt; every process must
        call this (each one's RNG state goes in)."""
        rng = rt.gather(rng_state(self.sampler))
        if rt.master:
            save_checkpoint({
                "model": self.model.state_dict(),
                "optimizer": [opt.state_dict() for opt in self.optimizers],
                "scaler": self.scaler.state_dict(),
                "model_args": asdict(self.model.config),
                "config": asdict(self.cfg),
                "tokenizer": self.tokenizer.to_meta(),
                "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss,
                "loop_seconds": self.loop_seconds,
                "rng": rng,
                "wandb_id": self.wandb_id,
                "measured": self.measured,
            }, run.latest, previous=run.previous)

    def save_best(self, run, rt):
        """Write best.pt from rank 0: what sample.py needs of the model whose val loss is best_val_loss."""
        if rt.master:
            save_checkpoint({"model": self.model.state_dict(), "model_args": asdict(self.model.config),
                             "config": asdict(self.cfg), "tokenizer": self.tokenizer.to_meta(),
                             "iter_num": self.iter_num, "val_loss": self.best_val_loss}, run.best)

    def restore(self, ckpt, rt):
        """Continue from ckpt (its model weights are already loaded). The optimizers keep this run's settings
        (learning rates, betas, weight decay), which are the checkpoint's unless given again."""
        if len(ckpt["optimizer"]) != len(self.optimizers):
            raise UserError("the checkpoint was trained with a different optimizer; resume with the same one")
        for opt, state in zip(self.optimizers, ckpt["optimizer"]):
            settings = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            try:
                opt.load_state_dict(state)
            except ValueError:  # its parameter groups differ from this version's
                raise UserError("the checkpoint's optimizer state does not fit this run's parameter groups; "
                                "resume with the settings it was trained with") from None
            for group, own in zip(opt.param_groups, settings):
                group.update(own)
        self.scaler.load_state_dict(ckpt["scaler"])
        self.iter_num, self.best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        self.loop_seconds = ckpt.get("loop_seconds", ckpt.get("train_time", 0.0))  # older checkpoints: train_time
        self.wandb_id = ckpt.get("wandb_id")
        states = ckpt["rng"]
        if len(states) == rt.world:
            set_rng_state(states[rt.rank], self.sampler)
        elif rt.master:
            print(f"note: checkpoint has RNG states of {len(states)} processes, this run has {rt.world}; "
                  "the data order is reseeded")


def start(cfg, rt, ckpt=None, ckpt_path=None):
    """Seed this process, open the dataset and build what the loop trains: (TrainingData, TrainState),
    fresh, from pretrained weights, or restored from ckpt (read from ckpt_path) to resume."""
    seed_everything(cfg.seed + rt.rank)
    folder, meta = load_meta(cfg.data_dir, cfg.dataset)
    if ckpt is not None and not same_token_ids(ckpt["tokenizer"], meta):
        raise UserError(f"dataset {cfg.dataset!r} has {describe_vocabulary(meta)}, but {ckpt_path} was trained on "
                        f"{describe_vocabulary(ckpt['tokenizer'])}; a resumed run must see the token ids it "
                        "learned (prepare the data with the checkpoint's vocabulary, or start a new out_dir)")
    model = build_model(cfg, meta, ckpt, ckpt_path).to(rt.device)
    if model.config.vocab_size < meta["vocab_size"]:
        raise UserError(f"dataset vocabulary ({meta['vocab_size']}) is larger than the model's "
                        f"({model.config.vocab_size})")
    data = TrainingData(folder, meta, model.config.block_size, cfg.batch_size, cfg.eval_iters, cfg.seed + rt.rank,
                        rt.device)
    measured = settle_measured_choices(cfg, rt, model, ckpt)
    state = TrainState(cfg, model, data.tokenizer, data.sampler, rt, measured)
    if ckpt is not None:
        state.restore(ckpt, rt)
    if cfg.compile:
        allow_eager_fallback()
        compile_blocks(model)
    return data, state


def settle_measured_choices(cfg, rt, model, ckpt):
    """The precision and the attention path: as configured; for 'auto', as the resumed run was trained (a
    resume continues exactly: the two attention paths draw dropout differently), or else measured here by
    rank 0 and printed. Returns them, for the checkpoint."""
    saved = ckpt.get("measured", {}) if ckpt is not None else {}
    if cfg.dtype == "auto" and "dtype" in saved:
        rt.set_dtype(saved["dtype"])
    elif cfg.dtype == "auto" and rt.master and rt.device == "cpu" and cpu_has_bf16():
        print(f"precision: {rt.dtype} (bfloat16 matmuls ran at {cpu_bf16_speedup():.2f}x the float32 speed "
              "in a probe here)")
    if cfg.attention_path != "auto":
        path = cfg.attention_path
    elif "attention_path" in saved:
        path = saved["attention_path"]
    else:
        fused, why = pick_attention_path(model, cfg.batch_size, rt.autocast, rt.device)
        path = rt.broadcast("fused" if fused else "written")  # rank 0's measurement: every process runs one path
        if why and rt.master:
            print(why)
    model.use_fused_attention(path == "fused")
    return {"dtype": rt.dtype, "attention_path": path}


def micro_batches(accumulation_steps, world):
    """Micro-batches each process runs per optimizer step: the steps divided among the processes,
    at least one each."""
    if accumulation_steps > world and accumulation_steps % world:
        raise UserError(f"gradient_accumulation_steps ({accumulation_steps}) must be divisible "
                        f"by the number of processes ({world})")
    return max(1, accumulation_steps // world)


def evaluate(model, data, autocast):
    """Mean loss per split over the fixed evaluation windows."""
    model.eval()
    device = str(next(model.parameters()).device)
    out = {}
    # eagerly: a second, inference-only graph would cost more compile time than it saves here
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for name, split in data.splits.items():
            losses = []
            for offsets in data.eval_offsets[name]:
                x, y = split.batch(offsets, device)
                with autocast:
                    losses.append(model(x, y)[1].item())
            out[name] = sum(losses) / len(losses)
    model.train()
    return out


def evaluate_split(model, split, autocast, batch_size, max_tokens=0):
    """Mean loss over a split's first max_tokens targets (all of them when 0), read in consecutive
    block_size windows so that every target is scored exactly once: (loss, targets scored)."""
    T, n = split.block_size, split.length - 1
    n = min(n, max_tokens) if max_tokens > 0 else n
    offsets = list(range(0, n - T + 1, T))
    tail = n - len(offsets) * T
    if tail:  # one last window ending at target n, scoring only the targets no other window scored
        offsets.append(n - T)
    device = str(next(model.parameters()).device)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for i in range(0, len(offsets), batch_size):
            x, y = split.batch(torch.tensor(offsets[i:i + batch_size]), device)
            if tail and i + batch_size >= len(offsets):
                y = y.clone()
                y[-1, :T - tail] = -1  # ignored by the loss
            with autocast:
                loss = model(x, y)[1].item()
            scored = int((y != -1).sum())
            total, count = total + loss * scored, count + scored
    model.train()
    return total / count, count
