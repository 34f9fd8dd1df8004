"""
Train a GPT on a prepared dataset.

    python train.py config/shakespeare_char.py
    python train.py config/shakespeare_char.py --device=cpu --max_iters=500
    python train.py config/shakespeare_char.py --init_from=resume      # continue the run in out_dir
    python train.py config/shakespeare_char.py --init_from=auto   # continue it if there is one
    python train.py config/shakespeare_char.py --processes=2      # two processes (DDP)
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char.py
"""

import math
import signal
import sys
import time
import uuid
from dataclasses import asdict

from gptkit.base.errors import RunStopped, UserError, run_main  # first: a Ctrl-C while torch loads is one line too
import torch

from gptkit.base.settings import command_line_keys, config_file_values, given_values
from gptkit.base.signals import StopSignals
from gptkit.data.dataset import tokens_checksum
from gptkit.machine.choices import choose, on_speed_path
from gptkit.machine.runtime import (Runtime, compile_blocks, launch_processes, launched_rank,
                                    trains_here)
from gptkit.run.metrics import PROCESS_START, RunLog, damaged_note, later_records_note, records_through
from gptkit.run.run_folder import RunDir
from gptkit.training.budget import Pace, StepCosts, plan_steps, thread_tuner, time_budget
from gptkit.training.evaluation import evaluate, evaluate_split, nan_from_the_start
from gptkit.training.updates import (lr_factor_at, schedulable, set_lr, settings_untaken, step_optimizers,
                                        update_for)
from gptkit.training.records import Records
from gptkit.training.reporting import Reporter
from gptkit.training.resume import claim_for_a_new_run, continued_config, given_anew
from gptkit.training.score_stop import ScoreStop, stopped_by_score
from gptkit.training.snapshots import check_room, drop_after
from gptkit.training.starting import base_run, build_model, given_config, open_data, planned_model, sees_ahead_line
from gptkit.training.state import TrainState
from gptkit.training.train_config import TrainConfig


def start(cfg, rt, ckpt, ckpt_path, given, asked, started):
    """From the config to what the loop trains: the data, the machine's choices (the shape among
    them, decided before the model is built), the model, the steps a time budget plans, the
    optimizers, then the state a checkpoint saves, which holds the config that trains:
    (TrainingData, TrainState, the ScoreStop of a run that ends by its score or None)."""
    data, sequences = open_data(cfg, rt, ckpt, ckpt_path)
    base = base_run(cfg.init_from) if ckpt is None else None  # init_from a run folder: fine-tuning its model
    planned = planned_model(cfg, data.meta, ckpt, ckpt_path, base, given, asked)  # the shape the config and data say
    saved = ckpt["measured"] if ckpt is not None else None  # what a resumed run chose
    # precision, attention path, a preset's shape and the step's speed: this machine's, measured
    # once and kept (gptkit/machine/)
    cfg, planned, choices = choose(cfg, rt, planned, saved, asked, started, update_for(cfg))
    model = build_model(cfg, planned, data.meta, ckpt, ckpt_path, rt.rank, base, given, asked).to(rt.device)
    on_speed_path(model, choices)  # speed kernels, where model.py is what they were written for
    if rt.master and (ahead := sees_ahead_line(model)):  # asked of the attention that trains, on its path
        choices.lines.append(ahead)
    if ckpt is None:  # max_time as steps at this machine's idle speed (a resumed run keeps its own)
        costs = step_costs(cfg, rt, data, model, choices, sequences)
        cfg, plan = plan_steps(cfg, choices, costs, given)
        choices.lines.extend(plan)
    optimizers = schedulable(model.configure_optimizers(cfg, rt.dtype))  # model.py's, as nanoGPT's
    if rt.master and (untaken := settings_untaken(optimizers, cfg, asked)):  # an edit that builds its own
        choices.lines.append(untaken)
    state = TrainState(cfg, model, optimizers, data.tokenizer, data.sampler, rt, choices, sequences,
                       tokens_checksum(data.meta))
    if ckpt is not None:
        state.restore(ckpt, ckpt_path, rt, chat="roles" in data.meta)
    if cfg.compile:
        compile_blocks(model)
    if rt.master:
        for line in choices.lines + (choices.details if cfg.verbose else []):
            print(line, flush=True)
    aim = ScoreStop(cfg, data.folder, data.meta, data.tokenizer) if cfg.stop_task and not cfg.eval_only else None
    return data, state, aim


def step_costs(cfg, rt, data, model, choices, sequences):
    """What a step, an evaluation and the final score cost here idle (StepCosts), where the step
    was timed."""
    if choices.whole_seconds is None:
        return None
    val = data.splits["val"].length - 1
    final_tokens = min(val, cfg.final_eval_tokens) if cfg.final_eval_tokens > 0 else val
    micro = sequences // (cfg.batch_size * rt.world)
    return StepCosts.of(cfg, choices, final_tokens, data.block_size, model.num_params(), micro)


def train(rt, data, state, log, run, budget, stop, aim=None):
    """Optimizer steps until max_iters, the time budget or the aim's score (a ScoreStop), evaluating every
    eval_interval steps and at the end. best.pt is written only when val loss improves; latest.pt at
    evaluations, at the end and on a stop signal."""
    cfg, model = state.cfg, rt.wrap(state.model)  # DDP when there are several processes
    report = Reporter(cfg, rt, data, state, log, budget)
    records = Records(cfg, rt, data, state, log, budget, run, report.say)
    if state.iter_num == 0:
        stop.doing = "evaluating before the first step (no step was trained: the same command starts it anew)"
        evaluated(rt, data, state, budget, report)
        if records.due(state.iter_num, always=True):  # the run's start
            records.take(state.iter_num, paced=False)
    x, y = data.sampler.next()
    done = finished(cfg, rt, state, budget)
    if done and state.iter_num and records.end_missing(state.iter_num):  # the run's end, which a kill -9 lost
        records.take(state.iter_num, paced=False)
    tuner = None if done else thread_tuner(state, x, y, rt.autocast, report.say)  # a run with no step left: none
    pace = Pace(state.choices.planned, state.iter_num, cfg) if rt.master else None
    with stop.deferred():
        while not done:
            step_start = time.perf_counter()
            lr_factor = lr_factor_at(cfg, state.iter_num, budget.progress())
            set_lr(state.optimizers, lr_factor)
            loss = torch.zeros((), device=rt.device)
            for micro in range(state.micro_batches):
                with rt.no_sync(model, sync=micro == state.micro_batches - 1):
                    with rt.autocast:
                        _, micro_loss = model(x, y)  # forward
                        micro_loss = micro_loss / state.micro_batches
                    x, y = data.sampler.next()  # fetch the next batch while the device computes
                    state.scaler.scale(micro_loss).backward()  # backward
                loss += micro_loss.detach()
            step_optimizers(state.model, state.optimizers, state.scaler, cfg.grad_clip)
            if state.ema is not None:  # the average of the weights, which evaluations score
                state.ema.update(lr_factor)
            state.iter_num += 1
            state.seconds_spent = budget.spent()
            step_seconds = time.perf_counter() - step_start
            tried = tuner is not None and tuner.trying  # this step ran on the thread count on trial
            threads = tuner.after_step(step_seconds, state.iter_num) if tuner else None
            report.stepped(state.iter_num, threads)
            busy = pace.stepped(state.iter_num, step_seconds, budget.spent(), tried, bool(threads)) if pace else None
            if busy:  # the planned steps all the same, in a time off the plan: said once
                report.say(busy)
            if state.iter_num % cfg.log_interval == 0:
                mean_loss = rt.mean(loss.item())  # the loss reaches the host here, and only here
                stop_if_diverged("loss", mean_loss, state.iter_num, rt.dtype)
                report.trained(state.iter_num, mean_loss)
            done = finished(cfg, rt, state, budget)
            evaluating, saved = state.iter_num % cfg.eval_interval == 0 or done, False
            if evaluating:
                losses = evaluated(rt, data, state, budget, report)
                if aim is not None:
                    state.stopped_by_score = aim.reached(rt, state, report)
                improved = losses["val"] < state.best_val_loss
                if improved:  # the only place the best weights change (a stop never touches them)
                    state.best_val_loss, state.best_iter = losses["val"], state.iter_num
                    state.save_best(run, rt)  # first: latest.pt never claims a best best.pt lacks
                    report.saved_best(state.iter_num, losses["val"], run.best)
                # an evaluation that spent what the budget had left ends the run here: one more step
                # would only bring a second evaluation of almost the same weights
                done = done or finished(cfg, rt, state, budget)
                if improved or cfg.always_save_checkpoint or done:
                    ended_by_time = done and state.iter_num < cfg.max_iters and not state.stopped_by_score
                    save_latest(state, run, rt, budget, ended_by_time)
                    saved = True
            # the timeline's numbers and a snapshot of the weights: at steps 1, 2, 4, ... and at
            # each evaluation where the run can afford them, and at its end whatever they cost
            if records.due(state.iter_num, evaluating, always=done):
                records.take(state.iter_num, paced=not done)
            stop_if_signalled(rt, stop, state, run, budget, loss, saved)
    stop.doing = ("scoring the whole val split at the end (the trained state is saved in "
                  f"{run.latest})")
    report.close()  # the training bar, done
    scored = rt.broadcast(final_evaluation(cfg, data, state, rt) if rt.master else None)
    report.final(state.iter_num, scored, run, records.seconds())
    if pace is not None:  # what a comparison with another run is fair in
        print(pace.summary(state.iter_num, report.tokens_per_iter, budget.spent()), flush=True)


def evaluated(rt, data, state, budget, report):
    """Evaluate, say and log the losses, and stop where val loss is no longer a number."""
    losses = report.evaluated(state.iter_num, evaluate_on_rank0(rt, data, state, budget))
    if state.iter_num == 0 and math.isnan(losses["val"]):  # no step has been taken: the model's code, not the rate
        raise UserError(nan_from_the_start(state.model, data.splits["val"], losses["val"]))
    stop_if_diverged("val loss", losses["val"], state.iter_num, rt.dtype)
    return losses


def stop_if_signalled(rt, stop, state, run, budget, loss, saved):
    """Every process stops at the step where any one was signalled, with latest.pt saved."""
    signum = int(rt.max(stop.signum))
    if not signum:
        return
    if not saved:
        # never save a diverged state
        stop_if_diverged("loss", rt.mean(loss.item()), state.iter_num, rt.dtype)
        save_latest(state, run, rt, budget)
    raise RunStopped(f"stopped by {signal.Signals(signum).name} at iteration {state.iter_num}; "
                     f"latest state saved to {run.latest}, continue with --init_from=auto", signum)


def finished(cfg, rt, state, budget):
    """All max_iters steps taken, stop_task's aim reached, or the time budget spent but for what the end
    will cost (on any process: all stop at the same step). The first step is always taken, so that
    every run leaves a state to use."""
    by_the_clock = cfg.wall_clock and cfg.max_time > 0 and state.iter_num > 0
    reached = state.stopped_by_score is not None  # stop_task's aim, at an evaluation, on every process alike
    return state.iter_num >= cfg.max_iters or reached or (by_the_clock and rt.any(budget.over()))


def save_latest(state, run, rt, budget, ended_by_time=False):
    """latest.pt, with the time spent so far in it; how long the save took is kept for the end's
    reserve. A run its time budget ends has spent all of it (what is left pays for its end), so a
    resume with the same max_time finds nothing to do."""
    spent = budget.spent()
    state.seconds_spent = max(spent, budget.max_time) if ended_by_time else spent
    start = time.time()
    state.save_latest(run, rt)
    budget.saved(time.time() - start)


def evaluate_on_rank0(rt, data, state, budget=None):
    """Rank 0 evaluates the plain model; every process gets its losses. The budget learns what it
    cost, and what a token of the final score will (the fastest batch's)."""
    start = time.time()
    with state.scored():
        answer = evaluate(state.model, data, rt.autocast) if rt.master else None
    losses, fastest = rt.broadcast(answer)
    if budget is not None:
        budget.evaluated(time.time() - start, fastest)
    return losses


def final_evaluation(cfg, data, state, rt):
    """The trained model's loss on the whole val split (or its first final_eval_tokens), every token
    once."""
    with state.scored():
        return evaluate_split(state.model, data.splits["val"], rt.autocast, cfg.batch_size,
                              cfg.final_eval_tokens)


def stop_if_diverged(what, value, iteration, dtype):
    """End the run, with the last good checkpoint kept, when a loss is no longer a number."""
    if not math.isfinite(value):
        remedy = "--dtype=float32" if dtype != "float32" else "a longer warmup_iters"
        raise UserError(f"{what} is {value} at iteration {iteration}; stopping with the last good "
                        f"checkpoint kept (try a lower learning_rate or {remedy})")


def main(argv=None):
    # run as a command, the budget counts from the process's start (the interpreter's and torch's
    # start-up too); called with arguments, as tests do, from this call
    started = PROCESS_START if argv is None else time.time()
    argv = sys.argv[1:] if argv is None else argv
    given = given_values(TrainConfig, argv, prog="train.py")
    asked = command_line_keys(TrainConfig, argv)
    cfg = given_config(given, asked)
    if not trains_here(cfg.processes):  # each process runs this main with the same argv
        return launch_processes(cfg.processes, __file__, argv)
    master = launched_rank() == 0
    with RunDir(cfg.out_dir).locked(writer=master) as run:
        note = print if master else lambda line: None
        configured = config_file_values(TrainConfig, argv).get("init_from")
        if master:  # refused here; another run's files moved aside only once this one has started
            claim_for_a_new_run(cfg, run, note, configured, move=False)
        cfg, resumed = continued_config(cfg, given, asked, run, note, configured)
        finished_run = resumed[0] is not None and announce_resume(cfg, resumed, run, note, master)
        if finished_run and not cfg.eval_only:
            return  # nothing to train, nothing written
        with StopSignals() as stop, Runtime(cfg.device, cfg.dtype, cfg.backend, cfg.threads) as rt:
            stop.doing = "starting (nothing was saved)"
            # the state holds the config that trains: its shape fitted, its steps planned
            data, state, aim = start(cfg, rt, *resumed, given=set(given), asked=asked, started=started)
            # wandb's start is the last that can refuse the run: past it, another run's files move aside, and
            # what a resumed run trains again goes
            log = RunLog(run.metrics, wandb_args(state)) if rt.master else None
            try:
                if master and resumed[0] is None:
                    claim_for_a_new_run(cfg, run, note, configured)
                if resumed[0] is not None and not cfg.eval_only:
                    take_up(run, resumed[0]["iter_num"], master, note)
                del resumed, cfg  # the state holds what it needs of the checkpoint, and the config
                if state.cfg.eval_only:
                    stop.doing = ("evaluating (eval_only: nothing is written but this evaluation's "
                                  "record)")
                    evaluated(rt, data, state, None, Reporter(state.cfg, rt, data, state, log))
                else:
                    budget = time_budget(state.cfg, data, state, started)
                    train(rt, data, state, log, run, budget, stop, aim)
            finally:
                if log is not None:
                    log.close()


def announce_resume(cfg, resumed, run, note, master):
    """Say where a resumed run continues from; True (after saying so) when it has nothing left to do: its steps
    done and its final score recorded."""
    ckpt, path = resumed
    done, timed = ckpt["iter_num"], cfg.max_time > 0 and cfg.wall_clock
    budget = f" and {cfg.max_time:g} s" if timed else ""
    if not cfg.eval_only:
        check_room(run, done, cfg.snapshots)
    note(f"resuming from iteration {done} of {cfg.max_iters}{budget} ({path})" +
         "".join(f"; {change}" for change in given_anew(ckpt, path, cfg)))
    scored = cfg.eval_only or records_through(run.metrics, done, rewrite=False)[1]
    if master and (damaged := damaged_note(run.metrics)):
        note(damaged)
    spent = timed and ckpt["seconds_spent"] >= cfg.max_time
    reached = stopped_by_score(ckpt, cfg)
    if done < cfg.max_iters and not spent and not reached:
        return False
    if not scored:  # stopped while scoring the whole val split: the end is still to do
        note("its steps are done, but its final score on the whole val split was never recorded: "
             "scoring it now")
        return False
    if reached and not cfg.eval_only:
        note(f"the run in {run.path} is finished (its {reached['task']} held-out pass@1 reached "
             f"{100 * reached['pass_at_1']:.1f}% at iteration {done}, stop_pass_at_1 {cfg.stop_pass_at_1:g}); "
             "nothing to do: raise --stop_pass_at_1, or give --stop_task='' to train it on to --max_iters")
    elif not cfg.eval_only:
        why = (f"its {cfg.max_time:g} s are spent" if spent else
               f"all {cfg.max_iters} iterations are done")
        note(f"the run in {run.path} is finished ({why}); nothing to do: raise --max_iters or "
             "--max_time to train it further, or start another run in a new --out_dir")
    return True


def take_up(run, done, master, note):
    """Drop from a resumed run's metrics the records it will log again, and the snapshots of the steps it will
    train again: once it has started, so that a resume refused at its start loses none of them."""
    dropped, _ = records_through(run.metrics, done, rewrite=master)
    if master and (later := drop_after(run, done)):
        note(f"note: dropped the snapshots of steps past {done}, which this run trains again: {', '.join(later)}")
    if dropped:  # said by rank 0, which alone writes
        note(later_records_note(run.metrics, dropped, f"iteration {done}"))


def wandb_args(state):
    # the settings trained with (state.cfg): a model fitted to its budget has its fitted shape there
    cfg = state.cfg
    if not cfg.wandb_log:
        return None
    # our own id (wandb.util.generate_id is gone from recent wandb), kept in the checkpoint for
    # a resume
    state.wandb_id = state.wandb_id or uuid.uuid4().hex[:12]
    return dict(project=cfg.wandb_project, name=cfg.wandb_run_name, id=state.wandb_id,
                config=asdict(cfg))


if __name__ == "__main__":
    run_main(main, memory_settings=("batch_size", "block_size", "n_embd", "n_layer", "n_head",
                                    "eval_iters"))
