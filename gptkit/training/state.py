"""The state a checkpoint saves and restores: the model, its optimizers, the loop's counters and every process's
random generators."""

import math
import random
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch

from gptkit.data.dataset import dataset_folder
from gptkit.machine.stand_ins import model_code
from gptkit.run.checkpoint import load_weights, save_checkpoint
from gptkit.training.score_stop import stopped_by_score
from gptkit.training.updates import EMA, restore_optimizers
from gptkit.training.train_config import BATCH_KEYS


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

    def __init__(self, cfg, model, optimizers, tokenizer, sampler, rt, choices, global_batch, tokens=None):
        self.cfg, self.model, self.optimizers, self.tokenizer, self.sampler = cfg, model, optimizers, tokenizer, sampler
        self.tokens = tokens  # the dataset's tokens_checksum: a resume tells a dataset prepared again by it
        self.global_batch = global_batch  # sequences per optimizer step, over every process
        self.micro_batches = global_batch // (sampler.batch_size * rt.world)  # a step's, in each process
        self.choices = choices  # what start-up chose (gptkit.machine.choices), kept for a resume
        # only rank 0 evaluates and saves, so only it keeps the EMA
        self.ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 and rt.master else None
        self.scaler = torch.amp.GradScaler(rt.device.split(":")[0], enabled=rt.dtype == "float16")
        self.iter_num = 0  # optimizer steps taken
        self.best_val_loss = math.inf
        self.best_iter = 0  # the iteration best.pt holds
        self.seconds_spent = 0.0  # of the time budget, by every process that worked on this run (see TimeBudget)
        self.wandb_id = None  # the wandb run this one continues
        self.stopped_by_score = None  # where stop_task's aim was reached: {"task", "pass_at_1", "iter"}

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
                "stopped_by_score": self.stopped_by_score,
                "measured": self.choices.saved(),
                "model_code": model_code(),
                "tokens": self.tokens,
            }, run.latest, previous=run.previous)

    def save_best(self, run, rt):
        """Write best.pt from rank 0: what sample.py needs of the model whose val loss is best_val_loss."""
        if rt.master:
            save_checkpoint({"model": self.scored_weights(), "model_args": asdict(self.model.config),
                             "model_code": model_code(),
                             "config": asdict(self.cfg), "tokenizer": self.tokenizer.to_meta(),
                             "iter_num": self.iter_num, "val_loss": self.best_val_loss, "tokens": self.tokens},
                            run.best)

    def scored_weights(self):
        return self.model.state_dict() if self.ema is None else self.ema.state_dict()

    def scored(self):
        """Inside this block the model holds the weights evaluations score."""
        return nullcontext() if self.ema is None else self.ema.swapped_in()

    def restore(self, ckpt, path, rt, chat=False):
        """Continue from ckpt, read from path (its model weights are already loaded). The optimizers keep this
        run's settings (learning rates, betas, weight decay), which are the checkpoint's unless given again.
        chat: the run trains on a chat dataset, whose loss train_on chooses the tokens of."""
        restore_optimizers(self.optimizers, ckpt["optimizer"], ckpt, path)
        self.scaler.load_state_dict(ckpt["scaler"])
        if "trained" in ckpt:  # the model holds the checkpoint's EMA (this run's, if it keeps one)
            load_weights(self.model, ckpt["trained"], path, "trained weights")
        self.iter_num, self.best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        self.best_iter, self.seconds_spent = ckpt["best_iter"], ckpt["seconds_spent"]
        self.wandb_id = ckpt.get("wandb_id")
        self.stopped_by_score = stopped_by_score(ckpt, self.cfg)  # its end is still to do, or done: nothing trains
        self.restore_random_state(ckpt["rng"], rt)
        anew = self.measured_anew(ckpt, chat)  # on every process: whether an evaluation improved decides the saves
        if rt.master:
            self.say_how_it_continues(ckpt, rt.world)
            if anew:
                print(anew)

    def measured_anew(self, ckpt, chat):
        """A run continued on another dataset, or a chat run with another train_on: val loss measures something
        else from here, so best.pt, chosen by the old measure, is chosen anew from the next evaluation (as rl.py's
        best is when its scoring changes). Returns the note to print, or None."""
        changes = [change for change in (self.dataset_change(ckpt["config"]) or self.prepared_again(ckpt),
                                         self.count_change(ckpt, chat)) if change]
        if not changes:
            return None
        kept = f"best.pt (iteration {self.best_iter}, val loss {self.best_val_loss:.4f}) was chosen by the old measure"
        self.best_val_loss = math.inf
        return (f"note: {'; '.join(changes)}; {kept}" +
                ("" if self.cfg.eval_only else ", and the next evaluation replaces it"))

    def dataset_change(self, saved):
        """Where the dataset is another folder than the one the run was saved on: the change, said as old → new."""
        was, now = saved.get("dataset", self.cfg.dataset), self.cfg.dataset
        folders = [dataset_folder(data_dir, name).resolve()
                   for data_dir, name in ((saved.get("data_dir", self.cfg.data_dir), was),
                                          (self.cfg.data_dir, now))]
        if folders[0] == folders[1]:
            return None
        named = (was, now) if was != now else folders  # the same name in another data_dir
        return f"dataset {str(named[0])!r} → {str(named[1])!r}: from here val loss is measured on another val split"

    def prepared_again(self, ckpt):
        """Where the run's dataset folder holds other tokens than when the state was saved (data/prepare.py run again
        there, otherwise): the change in words. None where the same, or the state does not record them."""
        saved = ckpt.get("tokens")
        if not isinstance(saved, str) or self.tokens is None or saved == self.tokens:
            return None
        return (f"dataset {self.cfg.dataset!r} was prepared again since the state was saved, other tokens under the "
                "same name: the run goes on on them, and from here val loss is measured on its val split as it is now")

    def count_change(self, ckpt, chat):
        """A chat run's train_on given anew: the change, said as old → new with the tokens each counts."""
        saved, now = ckpt["config"].get("train_on", "answers"), self.cfg.train_on
        if not chat or saved == now:  # on plain text every token counts either way
            return None
        counted = {"answers": "the answers and the text mixed in", "all": "every token, the questions' too"}
        return (f"train_on {saved!r} → {now!r}: from here val loss counts {counted[now]}, where it counted "
                f"{counted[saved]}")

    def restore_random_state(self, states, rt):
        """Each process's generators as it saved them; on another number of processes, the data order where it
        was (one order for the run, the same in every process's state) and the other generators seeded anew."""
        if len(states) == rt.world:
            set_rng_state(states[rt.rank], self.sampler)
        self.sampler.load_state_dict(states[0]["sampler"])  # rank 0's: the run's order (see BatchSampler)
        if rt.master and any(not same_state(s["sampler"], states[0]["sampler"]) for s in states):
            print("note: this checkpoint was written before the processes shared one data order; the order "
                  "continues from process 0's, so some windows process 1 and up read may come round again")

    def say_how_it_continues(self, ckpt, world):
        """A note, where a run continues on another number of processes than it was saved by or with another global
        batch, saying the batch a step it was saved with, any change of it as old → new (from batch settings the
        command line gave anew), and what that means for its losses."""
        saved_by, saved_batch = len(ckpt["rng"]), ckpt["global_batch"]
        if saved_by == world and saved_batch == self.global_batch:
            return
        where = f"this run was saved by {saved_by} process{'es' * (saved_by != 1)} and continues on {world}" \
            if saved_by != world else f"it continues on its {world} process{'es' * (world != 1)}"
        micro, accum = self.sampler.batch_size, self.micro_batches
        share = f"each takes {accum} micro-batch{'es' * (accum != 1)} of {micro} sequences a step"
        if saved_batch == self.global_batch:
            print(f"note: {where}: {share}, the {saved_batch} a step it was saved with, in the same data order; "
                  "dropout's random draws and the order of the sums differ, so the losses follow the run it would "
                  "have been only to within noise, not exactly")
            return
        anew = " and ".join(f"{key}={getattr(self.cfg, key)}" for key in BATCH_KEYS
                            if getattr(self.cfg, key) != ckpt["config"].get(key))
        print(f"note: the global batch changes, {saved_batch} → {self.global_batch} sequences a step, as the command "
              f"line sets {anew}; {where}: {share}; from here on the losses are another run's, not those of the run "
              "it would have been")
