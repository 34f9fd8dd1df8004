"""
Train a GPT on a prepared dataset.

    python train.py config/shakespeare_char.py
    python train.py config/shakespeare_char.py --device=cpu --max_iters=500
    python train.py config/shakespeare_char.py --init_from=resume      # continue the run in out_dir
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char.py
"""

import gc
import math
import os
import random
import signal
import sys
import time
import uuid
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from batches import BatchSampler, Split, fixed_offsets, load_meta
from checkpoint import TRAINING_KEYS, load_checkpoint, save_checkpoint
from config import TrainConfig, parse_config
from errors import Interrupted, UserError, run_main
from hardware import autocast, peak_flops, pick_device, pick_dtype
from metrics import RunLog
from model import GPT, GPTConfig
from optim import build_optimizers, lr_multiplier, set_lr
from tokenizer import tokenizer_from_meta


class Dist:
    """Rank and world size; a single process is rank 0 of 1."""

    def __init__(self):
        self.enabled = int(os.environ.get("RANK", -1)) != -1
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.master = self.rank == 0

    def start(self, device, backend):
        self.device = device
        if not self.enabled:
            return device
        if backend == "auto":
            backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            device = f"cuda:{self.local_rank}"
            torch.cuda.set_device(device)
        self.device = device
        dist.init_process_group(backend=backend)
        return device

    def mean(self, value):
        if self.enabled:
            t = torch.tensor([value], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            value = t.item() / self.world
        return value

    def any(self, flag):
        """Whether flag is set on any process (every process must ask, or the others wait)."""
        return bool(self.mean(float(flag)))

    def gather(self, obj):
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


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


def model_config(cfg, vocab_size):
    keys = ["block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "pos_emb", "norm", "qk_norm",
            "mlp_act", "tie_weights", "logit_softcap", "zero_init_proj"]
    return GPTConfig(vocab_size=vocab_size, **{k: getattr(cfg, k) for k in keys})


def build_model(cfg, meta, ckpt):
    """The model to train: fresh, from the checkpoint being resumed, or pretrained GPT-2 weights."""
    if ckpt is not None:
        model_args = dict(ckpt["model_args"], dropout=cfg.dropout)
        if cfg.block_size > model_args["block_size"]:
            raise UserError(f"block_size {cfg.block_size} is larger than the checkpoint's {model_args['block_size']}")
        model = GPT(GPTConfig.from_dict(model_args))
        model.load_state_dict(ckpt["model"])
    elif cfg.init_from == "scratch":
        vocab = meta["vocab_size"]
        if meta["tokenizer"] != "char":
            vocab = math.ceil(vocab / 64) * 64  # padded for faster matmuls; the extra rows are never targets
        model = GPT(model_config(cfg, vocab))
    else:
        if meta["tokenizer"] == "char":
            raise UserError(f"init_from={cfg.init_from!r} needs GPT-2's BPE tokens, but dataset {cfg.dataset!r} is "
                            "char-level; prepare it with `python data/prepare.py --input=FILE --name=NAME "
                            "--tokenizer=gpt2`")
        model = GPT.from_pretrained(cfg.init_from, dropout=cfg.dropout)
        if meta["vocab_size"] > model.config.vocab_size:
            raise UserError(f"dataset {cfg.dataset!r} has {meta['vocab_size']:,} token ids, more than "
                            f"{cfg.init_from!r}'s {model.config.vocab_size:,}; prepare it with --tokenizer=gpt2")
        if cfg.block_size > model.config.block_size:  # as for resume: never train on a shorter context unasked
            raise UserError(f"block_size {cfg.block_size} is larger than {cfg.init_from!r}'s "
                            f"{model.config.block_size} positions; pass --block_size={model.config.block_size}")
    if cfg.block_size < model.config.block_size:
        model.crop_block_size(cfg.block_size)
    return model


def evaluate(model, splits, offsets, ctx):
    """Mean loss per split over the fixed evaluation windows."""
    model.eval()
    out = {}
    # eagerly: a second, inference-only graph would cost more compile time than it saves here
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for name, split in splits.items():
            losses = []
            for o in offsets[name]:
                x, y = split.batch(o, model_device(model))
                with ctx:
                    losses.append(model(x, y)[1].item())
            out[name] = sum(losses) / len(losses)
    model.train()
    return out


def compile_blocks(model):
    """Compile each transformer block in place. The blocks share one graph, so this compiles
    in about half the time of the whole model (16 s against 29 s cold on 2 CPU cores) and the
    steps come out faster too; parameter names stay those of the plain model."""
    torch._dynamo.config.suppress_errors = True  # no C++ compiler or an unsupported op: run eagerly
    for block in model.transformer.h:
        block.compile()


def model_device(model):
    return str(next(model.parameters()).device)


class Interrupt:
    """Turn Ctrl-C into a flag the loop checks after each step, so the step finishes and is saved."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self.handle)
        return self

    def handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C stops at once
            signal.signal(signal.SIGINT, self.previous)
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.dist = Dist()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        device = self.dist.start(pick_device(cfg.device), cfg.backend)
        self.device, self.dtype = device, pick_dtype(cfg.dtype, device)
        self.ctx = autocast(device, self.dtype)
        # fewer accumulation steps than processes: each process takes one micro-batch per step
        if cfg.gradient_accumulation_steps > self.dist.world and cfg.gradient_accumulation_steps % self.dist.world:
            raise UserError(f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) must be divisible "
                            f"by the number of processes ({self.dist.world})")
        self.accum = max(1, cfg.gradient_accumulation_steps // self.dist.world)
        torch.manual_seed(cfg.seed + self.dist.rank)
        random.seed(cfg.seed + self.dist.rank)
        np.random.seed(cfg.seed + self.dist.rank)
        if device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        folder, self.meta = load_meta(cfg.data_dir, cfg.dataset)
        self.tokenizer = tokenizer_from_meta(self.meta)
        self.ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
        ckpt = load_checkpoint(self.ckpt_path, required=TRAINING_KEYS) if cfg.init_from == "resume" else None
        self.raw_model = build_model(cfg, self.meta, ckpt).to(device)
        if self.raw_model.config.vocab_size < self.meta["vocab_size"]:
            raise UserError(f"dataset vocabulary ({self.meta['vocab_size']}) is larger than the model's "
                            f"({self.raw_model.config.vocab_size})")
        block = self.raw_model.config.block_size
        self.splits = {name: Split(folder, name, self.meta["dtype"], block) for name in ("train", "val")}
        self.sampler = BatchSampler(self.splits["train"], cfg.batch_size, cfg.seed + self.dist.rank, device)
        self.eval_offsets = {n: fixed_offsets(s, cfg.batch_size, cfg.eval_iters) for n, s in self.splits.items()}
        self.optimizers = build_optimizers(self.raw_model, cfg, device)
        self.scaler = torch.amp.GradScaler(device.split(":")[0], enabled=self.dtype == "float16")
        self.iter_num, self.best_val_loss, self.train_time = 0, float("inf"), 0.0
        self.saved_iter = None
        self.wandb_id = None
        if ckpt is not None:
            self.restore(ckpt)
        if cfg.compile:
            compile_blocks(self.raw_model)
        self.ddp_model = DDP(self.raw_model, device_ids=[self.dist.local_rank] if device.startswith("cuda") else None) \
            if self.dist.enabled else self.raw_model
        self.tokens_per_iter = self.accum * self.dist.world * cfg.batch_size * block
        self.flops_per_iter = self.raw_model.flops_per_token(block) * self.tokens_per_iter
        self.peak = peak_flops(device, self.dtype)
        self.log = RunLog(cfg.out_dir, self.wandb_args()) if self.dist.master else None

    def restore(self, ckpt):
        if len(ckpt["optimizer"]) != len(self.optimizers):
            raise UserError("the checkpoint was trained with a different optimizer; resume with the same one")
        for opt, state in zip(self.optimizers, ckpt["optimizer"]):
            try:
                opt.load_state_dict(state)
            except ValueError:  # its parameter groups differ from this version's
                raise UserError("the checkpoint's optimizer state does not fit this run's parameter groups; "
                                "resume with the settings it was trained with") from None
        self.scaler.load_state_dict(ckpt["scaler"])
        self.iter_num, self.best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        self.train_time = ckpt["train_time"]
        self.wandb_id = ckpt.get("wandb_id")
        states = ckpt["rng"]
        if len(states) == self.dist.world:
            set_rng_state(states[self.dist.rank], self.sampler)
        elif self.dist.master:
            print(f"note: checkpoint has RNG states of {len(states)} processes, this run has {self.dist.world}; "
                  "the data order is reseeded")

    def wandb_args(self):
        if not self.cfg.wandb_log:
            return None
        # our own id (wandb.util.generate_id is gone from recent wandb), kept in the checkpoint for resume
        self.wandb_id = self.wandb_id or uuid.uuid4().hex[:12]
        return dict(project=self.cfg.wandb_project, name=self.cfg.wandb_run_name, id=self.wandb_id,
                    config=asdict(self.cfg))

    def checkpoint_state(self):
        rng = self.dist.gather(rng_state(self.sampler))
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": [opt.state_dict() for opt in self.optimizers],
            "scaler": self.scaler.state_dict(),
            "model_args": asdict(self.raw_model.config),
            "config": asdict(self.cfg),
            "tokenizer": self.tokenizer.to_meta(),
            "iter_num": self.iter_num,
            "best_val_loss": self.best_val_loss,
            "train_time": self.train_time,
            "rng": rng,
            "wandb_id": self.wandb_id,
        }

    def save(self):
        state = self.checkpoint_state()  # every rank joins the RNG gather
        if self.dist.master:
            save_checkpoint(state, self.ckpt_path)
        self.saved_iter = self.iter_num

    def step(self, x, y):
        """One optimizer step over accum micro-batches; returns the step's mean loss and the next batch."""
        total = 0.0
        for micro in range(self.accum):
            sync = nullcontext() if not self.dist.enabled or micro == self.accum - 1 else self.ddp_model.no_sync()
            with sync:
                with self.ctx:
                    _, loss = self.ddp_model(x, y)
                    loss = loss / self.accum
                x, y = self.sampler.next()  # fetch while the device computes
                self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.cfg.grad_clip > 0:
            for opt in self.optimizers:
                self.scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.cfg.grad_clip)
        for opt in self.optimizers:
            self.scaler.step(opt)
        self.scaler.update()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return self.dist.mean(total.item()), x, y

    def run_eval(self):
        """Evaluate on rank 0, record it, and checkpoint when val improves or always_save_checkpoint is set."""
        if self.dist.master:
            losses = evaluate(self.raw_model, self.splits, self.eval_offsets, self.ctx)
            print(f"step {self.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            self.log.write({"kind": "eval", "iter": self.iter_num, "train_loss": losses["train"],
                            "val_loss": losses["val"]})
            if not math.isfinite(losses["val"]):
                raise self.not_finite("val loss", losses["val"], self.iter_num)
            improved = losses["val"] < self.best_val_loss
            self.best_val_loss = min(self.best_val_loss, losses["val"])
            save = (improved or self.cfg.always_save_checkpoint) and self.iter_num > 0
        else:
            save = None
        if self.dist.enabled:
            box = [save]
            dist.broadcast_object_list(box, src=0)
            save = box[0]
        if save:
            self.save()

    def not_finite(self, what, value, iteration):
        remedy = "--dtype=float32" if self.dtype != "float32" else "a longer warmup_iters"
        return UserError(f"{what} is {value} at iteration {iteration}; stopping with the last good checkpoint "
                         f"kept (try a lower learning_rate or {remedy})")

    def interrupted(self, interrupt):
        """Whether any process was asked to stop: all must agree, or they would part ways at the save."""
        return self.dist.any(interrupt.requested)

    def out_of_time(self):
        if self.cfg.max_time <= 0:  # the same config on every rank: no need to ask the others
            return False
        return self.dist.any(self.train_time >= self.cfg.max_time)

    def train(self):
        cfg = self.cfg
        if self.dist.master:
            print(f"{self.raw_model.num_params() / 1e6:.2f}M parameters on {self.device} ({self.dtype}), "
                  f"{self.tokens_per_iter:,} tokens per iteration")
        if self.iter_num == 0 or cfg.eval_only:
            self.run_eval()
        if cfg.eval_only:
            return
        x, y = self.sampler.next()
        window_start, window_iters = time.time(), 0
        loop_start = time.time() - self.train_time  # a resumed run keeps its time budget
        with Interrupt() as interrupt:
            while self.iter_num < cfg.max_iters and not self.out_of_time():
                multiplier = lr_multiplier(cfg, self.iter_num, self.train_time)
                set_lr(self.optimizers, multiplier)
                loss, x, y = self.step(x, y)
                if not math.isfinite(loss):  # this step's loss, logged as iteration iter_num + 1
                    raise self.not_finite("loss", loss, self.iter_num + 1)
                self.iter_num += 1
                self.train_time = time.time() - loop_start
                window_iters += 1
                if self.iter_num % cfg.log_interval == 0 and self.dist.master:
                    self.log_train(loss, multiplier * cfg.learning_rate, window_start, window_iters)
                    window_start, window_iters = time.time(), 0
                last = self.iter_num == cfg.max_iters or self.out_of_time()
                if self.iter_num % cfg.eval_interval == 0 or last:
                    self.run_eval()
                    self.train_time = time.time() - loop_start
                if self.interrupted(interrupt):
                    if self.saved_iter != self.iter_num:  # not saved by the evaluation just now
                        self.save()
                    raise Interrupted(f"interrupted at iteration {self.iter_num}; checkpoint saved to "
                                      f"{self.ckpt_path}, continue with --init_from=resume")

    def log_train(self, loss, lr, window_start, window_iters):
        dt = (time.time() - window_start) / window_iters
        tokens_s = self.tokens_per_iter / dt
        mfu = f", mfu {100 * self.flops_per_iter / dt / self.peak:.1f}%" if self.peak else ""
        print(f"iter {self.iter_num}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
              f"{tokens_s:,.0f} tok/s{mfu}", flush=True)
        self.log.write({"kind": "train", "iter": self.iter_num, "loss": loss, "lr": lr,
                        "tokens": self.iter_num * self.tokens_per_iter})

    def close(self):
        if self.log is not None:
            self.log.close()
        if self.dist.enabled:
            # DDP's reducer holds the process group: free it first, so that gloo's threads are
            # joined now and not while the interpreter shuts down (which can abort the process)
            self.ddp_model = None
            gc.collect()
            dist.destroy_process_group()


def main(argv=None):
    cfg = parse_config(TrainConfig, sys.argv[1:] if argv is None else argv, prog="train.py")
    trainer = Trainer(cfg)
    try:
        trainer.train()
        if trainer.dist.enabled:  # ranks leave together: tearing down gloo while a peer still talks aborts it
            dist.barrier()
    finally:
        trainer.close()


if __name__ == "__main__":
    run_main(main)
