"""What a training run tells the learner, from rank 0 alone: its start-up choices in plain words, its progress (a bar
with elapsed and remaining time on a terminal, plain lines in a log file), each evaluation, each new best.pt, a
warning when it overfits, and a summary at the end; the same numbers go to metrics.jsonl (and wandb)."""

import math
import sys
import time

from gptkit.base.progress import progress
from gptkit.data.dataset import bits_per_char
from gptkit.machine.flops import peak_flops
from gptkit.training.updates import described, rates

# overfitting: val loss this far above train loss (in nats, and as a share of train loss, whichever is larger) ...
OVERFIT_GAP, OVERFIT_SHARE = 0.3, 0.25
OVERFIT_RISES = 3  # ... or val loss rising at this many evaluations in a row while train loss falls


def overfitting(evals):
    """Why the evaluations so far, [(iter, train loss, val loss)], show a model learning its training text rather
    than the language, or None: the last one's val loss far above its train loss, or val rising at each of the
    last OVERFIT_RISES evaluations while train falls."""
    _, train, val = evals[-1]
    if val - train > max(OVERFIT_GAP, OVERFIT_SHARE * train):
        return f"val loss {val:.4f} is far above train loss {train:.4f}"
    last = evals[-OVERFIT_RISES - 1:]
    if len(last) > OVERFIT_RISES and all(b[2] > a[2] and b[1] < a[1] for a, b in zip(last, last[1:])):
        return f"val loss rose at each of the last {OVERFIT_RISES} evaluations (to {val:.4f}) while train loss fell"
    return None


class Reporter:
    """A run's console and metrics.jsonl: a progress bar on a terminal, else a line per log_interval (loss,
    learning rates, ms/iter, tokens/s, MFU); a line per evaluation; printed and written by rank 0 only."""

    def __init__(self, cfg, rt, data, state, log, budget=None):
        self.cfg, self.rt, self.log, self.state, self.budget, self.meta = cfg, rt, log, state, budget, data.meta
        self.tokens_per_iter = state.global_batch * data.block_size
        token_flops = state.model.flops_per_token(data.block_size)
        self.flops_per_iter, self.peak = token_flops * self.tokens_per_iter, peak_flops(rt.device, rt.dtype)
        self.window_start, self.window_iter = time.time(), state.iter_num
        self.evals, self.warned, self.bar = [], False, None
        self.eval_tokens = sum(o.numel() for o in data.eval_offsets["val"]) * data.block_size
        if rt.master:
            params = state.model.num_params()
            self.say(f"training on {rt.device} in {rt.dtype}, {self.tokens_per_iter:,} tokens per iteration")
            if not cfg.eval_only:
                self.say(described(state.optimizers))
            log.write({"kind": "run", "iter": state.iter_num, "device": rt.device, "dtype": rt.dtype,
                       "processes": rt.world, "params": params, "tokens_per_iter": self.tokens_per_iter,
                       "flops_per_token": token_flops, "timeline": cfg.timeline})
            if budget is not None:  # a bar on a terminal; in a log, a plain line every 20 s besides those below
                self.bar = progress(total=100, desc="training", unit="%", file=sys.stdout,
                                    bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}")

    def say(self, line):
        """A line above the progress bar, or a plain line."""
        if self.rt.master:
            (self.bar.write if self.bar is not None else print)(line)
            sys.stdout.flush()

    def stepped(self, iter_num, machinery=None):
        """Move the bar to how far the run is: its iterations or its time budget, whichever is further along. A
        line on the machinery (the thread count changed) is said with --verbose only."""
        if machinery and self.cfg.verbose:
            self.say(machinery)
        if self.bar is not None:
            done = iter_num / self.cfg.max_iters
            if self.cfg.max_time > 0:
                done = max(done, self.budget.progress())
            self.bar.update(min(100.0, 100 * done) - self.bar.n)

    def trained(self, iter_num, loss):
        """Report a step's loss (its mean over all processes) and each optimizer's learning rate now."""
        dt = (time.time() - self.window_start) / max(1, iter_num - self.window_iter)
        self.window_start, self.window_iter = time.time(), iter_num
        if not self.rt.master:
            return
        lrs = rates(self.state.optimizers)
        self.log.write({"kind": "train", "iter": iter_num, "loss": loss, **lrs,
                        "tokens": iter_num * self.tokens_per_iter})
        if self.bar is not None:
            self.bar.set_postfix_str(f"iter {iter_num}, loss {loss:.4f}, {dt * 1000:.0f} ms/iter", refresh=False)
            if sys.stdout.isatty():
                return
        mfu = f", mfu {100 * self.flops_per_iter / dt / self.peak:.1f}%" if self.peak else ""
        shown = "".join(f", {name.replace('_', ' ')} {lr:.2e}" for name, lr in lrs.items())
        print(f"iter {iter_num}: loss {loss:.4f}{shown}, {dt * 1000:.1f} ms/iter, "
              f"{self.tokens_per_iter / dt:,.0f} tok/s{mfu}", flush=True)

    def evaluated(self, iter_num, losses):
        """Report an evaluation, and say once if the run has begun to overfit."""
        if not self.rt.master:
            return losses
        self.say(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        self.log.write({"kind": "eval", "iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"]})
        self.evals.append((iter_num, losses["train"], losses["val"]))
        # a model that starts from trained weights has learned its training text already: step 0 tells nothing
        evals = [e for e in self.evals if e[0] > 0 or self.cfg.init_from == "scratch"]
        why = overfitting(evals) if evals else None
        if why and not self.warned:
            self.warned = True
            # the model best.pt will hold once this evaluation is taken into account
            best_iter, best = ((iter_num, losses["val"]) if losses["val"] < self.state.best_val_loss else
                               (self.state.best_iter, self.state.best_val_loss))
            self.say(f"overfitting: {why}: the model is learning its training text by heart. best.pt keeps "
                     f"iteration {best_iter:,} (val loss {best:.4f}). What helps: more text, weight decay, dropout, "
                     "a smaller model, fewer steps.")
            self.log.write({"kind": "health", "iter": iter_num, "overfitting": why, "best_iter": best_iter,
                            "best_val_loss": best})
        return losses

    def scored(self, iter_num, task, pass_1, aim):
        """Report stop_task's held-out pass@1, and where it reaches the aim, that the run ends."""
        if not self.rt.master:
            return
        self.log.write({"kind": "task_eval", "iter": iter_num, "task": task, "pass_at_1": pass_1})
        if pass_1 < aim:
            self.say(f"step {iter_num}: {task} held-out pass@1 {100 * pass_1:.1f}% (the run ends at {100 * aim:g}%)")
        else:
            self.say(f"step {iter_num}: {task} held-out pass@1 {100 * pass_1:.1f}%, at least stop_pass_at_1 "
                     f"({100 * aim:g}%): the run ends here")

    def saved_best(self, iter_num, val_loss, path):
        self.say(f"saved {path}: iteration {iter_num:,}, val loss {val_loss:.4f}")

    def final(self, iter_num, result, run, records_s=None):
        """The final score, then a summary: where the files are, the best val loss and its iteration, and why the
        final score differs from the evaluations' estimates. records_s: what the run's records took."""
        loss, tokens = result
        if not self.rt.master:
            return
        per_char = bits_per_char(loss, self.meta)
        tokens_are_chars = self.meta["tokenizer"] == "char"  # then the two figures are one
        also = f", {per_char:.4f} bits per character" if per_char is not None and not tokens_are_chars else ""
        print(f"final: val loss {loss:.4f} ({loss / math.log(2):.4f} bits per token{also}) on {tokens:,} val tokens, "
              "each scored once")
        records = {"records_s": records_s} if records_s is not None else {}
        self.log.write({"kind": "final", "iter": iter_num, "val_loss": loss, "val_tokens": tokens, **records,
                        **({"bits_per_char": per_char} if per_char is not None else {})})
        seconds = self.budget.spent() if self.budget is not None else time.time() - self.window_start
        print(f"done: {iter_num:,} iterations in {seconds:.0f} s, in {run.path}: best.pt holds iteration "
              f"{self.state.best_iter:,} (val loss {self.state.best_val_loss:.4f}), latest.pt where the run ended, "
              "metrics.jsonl the curves")
        print(f"the final score reads every one of the {tokens:,} val tokens once; the evaluations estimated val loss "
              f"on the same {self.eval_tokens:,} tokens each time, so the two differ by that sample's luck")
        untrained = untrained_note(self.evals, loss, iter_num)
        if untrained:
            print(untrained)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


UNTRAINED = 0.9  # a run whose final val loss is above this share of its loss before the first step learned little


def untrained_note(evals, loss, iter_num):
    """A line for a run that ended barely trained (its final val loss within 10% of the one it started at), with
    what to do; None otherwise, and for a resumed run, which did not see its start."""
    start = next((val for step, _, val in evals if step == 0), None)
    if start is None or loss < UNTRAINED * start:
        return None
    return (f"note: the model is barely trained: val loss {loss:.4f} after {iter_num:,} step{'s' * (iter_num != 1)}, "
            f"against {start:.4f} before the first; samples from it will be noise (give it more --max_time or "
            "--max_iters)")
