"""The parts train.py's loop is made of: the data it reads, the model it starts from, the state a checkpoint saves
and restores, the time budget, and evaluation."""

import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, replace

import numpy as np
import torch
from tqdm import tqdm

from gptkit.run.checkpoint import load_weights, model_config, model_from_checkpoint, save_checkpoint
from gptkit.data.dataset import TrainingData, load_meta
from gptkit.base.errors import UserError
from gptkit.interop.hf import crop_block_size, load_pretrained
from gptkit.training.optimizers import EMA, build_optimizers
from gptkit.machine.timing import ThreadTuner
from gptkit.data.tokenizer import describe_vocabulary, same_token_ids
from model import GPT


def build_model(cfg, meta, ckpt=None, path=None):
    """The model to train: fresh, from the checkpoint (at path) being resumed, or pretrained GPT-2 weights."""
    block_size = cfg.model.block_size
    if ckpt is not None:  # resumed_config has made the shape the checkpoint's
        model = model_from_checkpoint(ckpt, path, dropout=cfg.model.dropout)
    elif cfg.init_from == "scratch":
        model = GPT(planned_model(cfg, meta))
    else:
        if meta["tokenizer"] != "tiktoken":  # GPT-2's weights know GPT-2's token ids only
            what = "char-level" if meta["tokenizer"] == "char" else "tokenized by a BPE trained on it"
            raise UserError(f"init_from={cfg.init_from!r} needs GPT-2's BPE tokens, but dataset {cfg.dataset!r} is "
                            f"{what}; prepare it with `python data/prepare.py --input=FILE --name=NAME "
                            "--tokenizer=gpt2`")
        model = load_pretrained(cfg.init_from, dropout=cfg.model.dropout)
        if meta["vocab_size"] > model.config.vocab_size:
            raise UserError(f"dataset {cfg.dataset!r} has {meta['vocab_size']:,} token ids, more than "
                            f"{cfg.init_from!r}'s {model.config.vocab_size:,}; prepare it with --tokenizer=gpt2")
        if block_size > model.config.block_size:  # as for resume: never train on a shorter context unasked
            raise UserError(f"block_size {block_size} is larger than {cfg.init_from!r}'s "
                            f"{model.config.block_size} positions; pass --block_size={model.config.block_size}")
    if block_size < model.config.block_size:
        crop_block_size(model, block_size)
    if model.config.vocab_size < meta["vocab_size"]:
        raise UserError(f"dataset vocabulary ({meta['vocab_size']}) is larger than the model's "
                        f"({model.config.vocab_size})")
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


def same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


class TrainState:
    """What a checkpoint saves and restores: the model, its optimizers and gradient scaler, the tokenizer,
    the loop's counters, and every process's random generators, the data sampler's included. With ema_decay,
    the EMA of the weights is what evaluations score and what checkpoints keep as the model; latest.pt
    also keeps the weights themselves, which training goes on from."""

    def __init__(self, cfg, model, tokenizer, sampler, rt, choices, global_batch):
        self.cfg, self.model, self.tokenizer, self.sampler = cfg, model, tokenizer, sampler
        self.global_batch = global_batch  # sequences per optimizer step, over every process
        self.micro_batches = global_batch // (sampler.batch_size * rt.world)  # a step's, in each process
        self.choices = choices  # what start-up chose (gptkit.machine.choices), kept for a resume
        self.optimizers = build_optimizers(model, cfg, rt.dtype)
        # only rank 0 evaluates and saves, so only it keeps the EMA
        self.ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 and rt.master else None
        self.scaler = torch.amp.GradScaler(rt.device.split(":")[0], enabled=rt.dtype == "float16")
        self.iter_num = 0  # optimizer steps taken
        self.best_val_loss = math.inf
        self.best_iter = 0  # the iteration best.pt holds
        self.seconds_spent = 0.0  # of the time budget, by every process that worked on this run (see TimeBudget)
        self.wandb_id = None  # the wandb run this one continues

    def save_latest(self, run, rt):
        """Write latest.pt from rank 0, keeping the state it replaces as latest.prev.pt; every process must
        call this (each one's RNG state goes in)."""
        rng = rt.gather(rng_state(self.sampler))
        if rt.master:
            trained = {} if self.ema is None else {"trained": self.model.state_dict()}
            save_checkpoint({
                "model": self.scored_weights(),
                **trained,
                "optimizer": [opt.state_dict() for opt in self.optimizers],
                "scaler": self.scaler.state_dict(),
                "model_args": asdict(self.model.config),
                "config": asdict(self.cfg),
                "tokenizer": self.tokenizer.to_meta(),
                "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss,
                "best_iter": self.best_iter,
                "seconds_spent": self.seconds_spent,
                "rng": rng,
                "global_batch": self.global_batch,
                "wandb_id": self.wandb_id,
                "measured": self.choices.saved(),
            }, run.latest, previous=run.previous)

    def save_best(self, run, rt):
        """Write best.pt from rank 0: what sample.py needs of the model whose val loss is best_val_loss."""
        if rt.master:
            save_checkpoint({"model": self.scored_weights(), "model_args": asdict(self.model.config),
                             "config": asdict(self.cfg), "tokenizer": self.tokenizer.to_meta(),
                             "iter_num": self.iter_num, "val_loss": self.best_val_loss}, run.best)

    def scored_weights(self):
        return self.model.state_dict() if self.ema is None else self.ema.state_dict()

    def scored(self):
        """Inside this block the model holds the weights evaluations score."""
        return nullcontext() if self.ema is None else self.ema.swapped_in()

    def restore(self, ckpt, path, rt):
        """Continue from ckpt, read from path (its model weights are already loaded). The optimizers keep this
        run's settings (learning rates, betas, weight decay), which are the checkpoint's unless given again."""
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
        if "trained" in ckpt:  # the model holds the checkpoint's EMA (this run's, if it keeps one)
            load_weights(self.model, ckpt["trained"], path, "trained weights")
        self.iter_num, self.best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        self.best_iter = ckpt.get("best_iter", 0)  # not kept by checkpoints written before it was
        self.seconds_spent = seconds_spent(ckpt)
        self.wandb_id = ckpt.get("wandb_id")
        self.restore_random_state(ckpt["rng"], rt)

    def restore_random_state(self, states, rt):
        """Each process's generators as it saved them; on another number of processes, the data order where it
        was (one order for the run, the same in every process's state) and the other generators seeded anew."""
        if len(states) == rt.world:
            set_rng_state(states[rt.rank], self.sampler)
        self.sampler.load_state_dict(states[0]["sampler"])  # rank 0's: the run's order (see BatchSampler)
        if rt.master and any(not same_state(s["sampler"], states[0]["sampler"]) for s in states):
            print("note: this checkpoint was written before the processes shared one data order; the order "
                  "continues from process 0's, so some windows process 1 and up read may come round again")
        if rt.master and len(states) != rt.world:
            micro, accum = self.sampler.batch_size, self.micro_batches
            print(f"note: this run was saved by {len(states)} process{'es' * (len(states) != 1)} and continues "
                  f"on {rt.world}: each takes {accum} micro-batch{'es' * (accum != 1)} of {micro} sequences a step, "
                  f"the {self.global_batch} a step it started with, in the same data order; dropout's random "
                  "draws and the order of the sums differ, so the losses follow the run it would have been only "
                  "to within noise, not exactly")


def seconds_spent(ckpt):
    """A checkpoint's spent time budget; older versions saved the loop's seconds only, as loop_seconds or
    train_time."""
    return ckpt.get("seconds_spent", ckpt.get("loop_seconds", ckpt.get("train_time", 0.0)))


class TimeBudget:
    """max_time as a user plans by it: the whole run, start-up, steps, evaluations, saves and the final score,
    across every process that worked on it (a resumed run spends what is left). The loop stops early enough to
    leave what the last evaluation, save and final score will cost, estimated from what they cost so far."""

    def __init__(self, max_time, started, final_tokens):
        self.max_time, self.started, self.final_tokens = max_time, started, final_tokens
        self.eval_seconds = self.eval_seconds_per_token = self.save_seconds = 0.0

    def spent(self):
        return time.time() - self.started

    def evaluated(self, seconds, tokens):
        self.eval_seconds, self.eval_seconds_per_token = seconds, seconds / tokens

    def saved(self, seconds):
        self.save_seconds = max(self.save_seconds, seconds)

    def reserve(self):
        """Seconds kept for the end: one more evaluation and save, then the final score, with half again as a
        margin (on a noisy machine the final score's time moves from run to run), and two seconds for the
        process to exit, which takes a compiled run a while too (docs/speed.md#what-was-tried)."""
        return 1.5 * (self.eval_seconds + self.save_seconds + self.eval_seconds_per_token * self.final_tokens) + 2.0

    def progress(self):
        """The fraction of the training time spent, 0 to 1 (what the schedule follows)."""
        if self.max_time <= 0:
            return 0.0
        return min(1.0, self.spent() / max(1e-9, self.max_time - self.reserve()))

    def over(self):
        return self.max_time > 0 and self.spent() + self.reserve() >= self.max_time


def time_budget(cfg, data, state, started):
    """The run's TimeBudget: this process started at `started`, after what earlier ones spent."""
    val = data.splits["val"].length - 1
    final_tokens = min(val, cfg.final_eval_tokens) if cfg.final_eval_tokens > 0 else val
    return TimeBudget(cfg.max_time, started - state.seconds_spent, final_tokens)


def thread_tuner(choices):
    """Threads measured as the run goes (a ThreadTuner), from the count start-up chose, where the count is the
    run's to choose (gptkit.machine.choices: on a CPU, in one process, with threads=0 and more than one to choose from)."""
    if not choices.threads:
        return None
    return ThreadTuner(choices.most_threads, choices.threads, first=5.0)  # start-up times no threads: try soon


def eval_tokens(data):
    """How many tokens one evaluation scores: every split's fixed windows."""
    return sum(o.numel() for offsets in data.eval_offsets.values() for o in offsets) * data.block_size


def open_data(cfg, rt, ckpt=None, ckpt_path=None):
    """(TrainingData, sequences per optimizer step) for the run: its dataset's splits, batches and evaluation
    windows, checked against the checkpoint it resumes. Opened before anything is timed or built, so that a missing
    or damaged shard is one line at once."""
    folder, meta = load_meta(cfg.data_dir, cfg.dataset)
    if ckpt is not None and not same_token_ids(ckpt["tokenizer"], meta):
        raise UserError(f"dataset {cfg.dataset!r} has {describe_vocabulary(meta)}, but {ckpt_path} was trained on "
                        f"{describe_vocabulary(ckpt['tokenizer'])}; a resumed run must see the token ids it "
                        "learned (prepare the data with the checkpoint's vocabulary, or start a new out_dir)")
    sequences = global_batch(cfg, rt.world, ckpt)
    micro_batch, _ = batch_shares(sequences, cfg.batch_size, rt.world)
    data = TrainingData(folder, meta, cfg.model.block_size, cfg.batch_size, cfg.eval_iters, cfg.seed, rt.device,
                        cfg.batch_order, micro_batch, rt.rank, rt.world)
    return data, sequences


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


def step_optimizers(model, optimizers, scaler, grad_clip):
    """Clip the accumulated gradients, step every optimizer and clear the gradients."""
    if grad_clip > 0:
        for opt in optimizers:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    for opt in optimizers:
        opt.zero_grad()


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
    # checkpoints from before global_batch was saved: the processes that wrote it, one RNG state each
    return ckpt.get("global_batch", started_on(len(ckpt["rng"])))


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


def eagerly():
    """Compiled blocks run eagerly inside: a second, inference-only graph would cost more compile time than it
    saves. Where torch's compiler was never imported nothing is compiled, and importing it would cost start-up time."""
    return torch.compiler.set_stance("force_eager") if "torch._dynamo" in sys.modules else nullcontext()


def progress(total, what):
    """A progress bar with elapsed and remaining time for `total` batches of an evaluation, on a terminal only, and
    only where the work lasts over a second: an evaluation of a few batches shows none."""
    return tqdm(total=total, desc=what, unit="batch", leave=False, delay=1.0, dynamic_ncols=True, file=sys.stdout,
                disable=not sys.stdout.isatty(), bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")


def evaluate(model, data, autocast):
    """Mean loss per split over the fixed evaluation windows."""
    model.eval()
    device = str(next(model.parameters()).device)
    out = {}
    batches = sum(len(offsets) for offsets in data.eval_offsets.values())
    with torch.no_grad(), eagerly(), progress(batches, "evaluating") as bar:
        for name, split in data.splits.items():
            losses = []
            for offsets in data.eval_offsets[name]:
                x, y = split.batch(offsets, device)
                with autocast:
                    losses.append(model(x, y)[1].item())
                bar.update(1)
            out[name] = sum(losses) / len(losses)
    model.train()
    return out


def evaluate_split(model, split, autocast, batch_size, max_tokens=0):
    """Mean loss over a split's first max_tokens targets (all of them when 0), read in consecutive
    block_size windows so that every target is scored exactly once: (loss, targets scored)."""
    T, n = split.block_size, split.length - 1
    n = min(n, max_tokens) if max_tokens > 0 else n
    offsets = list(range(0, n - T + 1, T))
    scored_before, tail = len(offsets) * T, n - len(offsets) * T
    if tail:  # one last window ending at target n (the first window, where n < T)
        offsets.append(max(0, n - T))
    device = str(next(model.parameters()).device)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad(), eagerly(), progress(-(-len(offsets) // batch_size), "scoring the val split") as bar:
        for i in range(0, len(offsets), batch_size):
            x, y = split.batch(torch.tensor(offsets[i:i + batch_size]), device)
            if tail and i + batch_size >= len(offsets):
                y, start = y.clone(), offsets[-1]
                # ignored by the loss: the targets another window scored, and those past n
                y[-1, :scored_before - start] = -1
                y[-1, n - start:] = -1
            with autocast:
                loss = model(x, y)[1].item()
            scored = int((y != -1).sum())
            total, count = total + loss * scored, count + scored
            bar.update(1)
    model.train()
    return total / count, count
