"""
Reinforcement learning with a verifiable reward: a chat model practises problems whose answers a program
checks, and learns from its own answers (REINFORCE, the group's mean reward as the baseline, as nanochat).

    python rl.py config/chat_rl.py                         # from the SFT run config/chat_rl.py names
    python rl.py config/chat_rl.py --init_from=out-chat --init_checkpoint=iter:550   # from a snapshot (its snapshots/)
    python chat.py --out_dir=out-rl --eval --samples=64    # then pass@1, pass@8, pass@64 on held-out problems

Stopped (Ctrl-C, SIGTERM), it saves where it is; the same command, or --out_dir alone, continues exactly from there
(a continued run keeps the settings it saved, but those given again, as train.py's runs do).
"""

import signal
import sys
import time
from dataclasses import asdict, replace

from gptkit.base.errors import RunStopped, UserError, run_main  # first: a Ctrl-C while torch loads is one line too
import torch

from gptkit.base.progress import progress
from gptkit.base.signals import StopSignals
from gptkit.chat.answering import answer_text, check_chat_model, end_id, question_prompt, sample_answers
from gptkit.chat.reinforce import (ProblemDraw, RLState, advantages, answer_batch, best_lost, fewer_problems_note,
                                   little_reward_note, measured_anew, no_reward_line, reinforce_loss, rl_settings)
from gptkit.chat.report import chat_sets
from gptkit.chat.scoring import score
from gptkit.data.tasks import TASKS
from gptkit.machine.runtime import pick_device
from gptkit.machine.stand_ins import model_code
from gptkit.machine.threads import ThreadTuner
from gptkit.run.checkpoint import save_checkpoint
from gptkit.run.metrics import RunLog, damaged_note, later_records_note, records_through
from gptkit.run.run_folder import RunDir, model_at, model_of, refuse_a_file
from gptkit.training.updates import restore_optimizers, schedulable


def start(cfg, run, device, changed, saved):
    """The model to practise (the SFT run's, or this run's saved state), its optimizer, the problems it draws,
    the held-out problems it is scored on, and where the run is: a dict the loop reads. `changed`: the settings a
    continued run takes anew, {key: (saved, given)}; `saved`: the path of the state it continues from, or None."""
    resumed, base = saved is not None, RunDir(cfg.init_from)
    if not resumed:
        refuse_a_file(cfg.init_from, "init_from", "init_checkpoint")
    if not resumed and base.shown() is None:
        raise UserError(f"init_from={cfg.init_from!r} holds no run: fine-tune one there first, e.g. "
                        f"`python train.py config/chat_sft_early.py --out_dir={cfg.init_from}` (RL learns most from a "
                        "model right about half the time)")
    # LoRA adapters, if any, merged: RL trains every weight
    model, tok, ckpt = model_at(saved, device) if resumed else \
        model_of(cfg.init_from, cfg.init_checkpoint, device, option="init_checkpoint")
    if resumed and "rl" not in ckpt:
        raise UserError(f"{run.path} holds a run of train.py, not of rl.py; pick another --out_dir, or start over "
                        "there with --start_over=True (its files are moved aside)")
    check_chat_model(tok, cfg.init_from)
    heldout, _ = chat_sets(ckpt, cfg.tasks)  # one line for a task its dataset never held
    heldout = {t: heldout[t][:cfg.eval_problems] for t in cfg.task_list()}
    model.train()
    optimizers = schedulable(model.configure_optimizers(cfg))  # model.py's groups, AdamW: one optimizer, or several
    s = dict(model=model, tok=tok, optimizers=optimizers, heldout=heldout, draw=ProblemDraw(cfg.task_list(), cfg.seed),
             sampling=torch.Generator(device=device).manual_seed(cfg.seed), state=RLState(),
             dataset={k: ckpt["config"].get(k) for k in ("data_dir", "dataset")}, tokens=ckpt.get("tokens"))
    if resumed:
        # at this run's rates: the saved ones but those given anew
        restore_optimizers(optimizers, ckpt["optimizer"], ckpt, saved)
        s["draw"].generator.set_state(ckpt["rl"]["draw"])
        s["state"] = RLState(**ckpt["rl"]["state"])
        try:
            s["sampling"].set_state(ckpt["rl"]["sampling"])
        except RuntimeError:  # saved by another kind of device's generator (a CPU's state is 5,056 bytes, CUDA's 16)
            print(f"note: {saved} was sampled on another kind of device; the answers from here are drawn from "
                  "this one's generator seeded anew, so the run continues, but not as it would have there")
            s["sampling"].manual_seed(cfg.seed + s["state"].iter_num)
        if s["state"].iter_num >= cfg.max_iters:  # main says it is finished: nothing continues
            return s
        print(f"continuing the RL run in {run.path} from step {s['state'].iter_num} of {cfg.max_iters}" +
              "".join(f"; {key} {was!r} → {now!r}" for key, (was, now) in changed.items()))
        # a run killed between saves logged steps past its saved state, which it now takes again
        dropped, _ = records_through(run.metrics, s["state"].iter_num)
        later = later_records_note(run.metrics, dropped, f"step {s['state'].iter_num}") if dropped else None
        for note in (measured_anew(s["state"], changed), best_lost(s["state"], run.best), later,
                     damaged_note(run.metrics)):
            if note:
                print(note)
    s["tuner"] = thread_tuner(cfg, device)
    return s


def thread_tuner(cfg, device):
    """The CPU threads given, or (a ThreadTuner, None where there is no choice) the count followed as train.py
    follows it, timed on the steps themselves: a step samples in many small operations, which stall on two
    threads when another program holds a core, and trains, which two threads speed when none does (docs/chat.md
    has the figures)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
        return None
    most = torch.get_num_threads()
    return ThreadTuner(most) if device == "cpu" and most > 1 else None


def step(cfg, s):
    """One policy-gradient step: sample answers to a batch of problems, reward the right ones, and push up each
    answer's tokens by its advantage. Returns what to log."""
    model, tok = s["model"], s["tok"]
    problems = s["draw"].next(cfg.problems_per_step)
    prompts = [question_prompt(tok, question) for _, question in problems]
    model.eval()  # sampling: no dropout
    answers = sample_answers(model, prompts, cfg.samples, cfg.max_new_tokens, cfg.temperature,
                             generator=s["sampling"], end=end_id(tok), vocab_size=tok.vocab_size)
    model.train()
    rewards = torch.tensor([[reward(tok, task, q, a) for a in group] for (task, q), group in zip(problems, answers)])
    batch = answer_batch(prompts, answers, advantages(rewards).tolist())
    if batch is not None:  # else every group was all right or all wrong: nothing to learn this step
        loss = reinforce_loss(model, *batch, vocab_size=tok.vocab_size)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        for optimizer in s["optimizers"]:
            optimizer.step()
            optimizer.zero_grad()
    lengths = [len(a) for group in answers for a in group]
    return {"reward": rewards.mean().item(), "answer_tokens": sum(lengths) / len(lengths)}


def reward(tok, task, question, answer):
    """1 for a right answer that ends (with <|end|>), else 0: the task's checker is the reward."""
    return float(answer[-1:] == [end_id(tok)] and TASKS[task].check(question, answer_text(tok, answer)))


def evaluate(cfg, s):
    """Held-out pass@1 (the mean correctness of eval_samples answers sampled as training samples them) and the
    greedy answer's accuracy, over every task practised."""
    results = score(s["model"], s["tok"], s["heldout"], cfg.eval_samples, cfg.temperature, cfg.max_new_tokens,
                    cfg.seed)
    s["model"].train()
    n = sum(r["n"] for r in results.values())
    return {"pass_at_1": sum(r["pass_at"]["1"] * r["n"] for r in results.values()) / n,
            "accuracy": sum(r["accuracy"] * r["n"] for r in results.values()) / n}


def save(cfg, s, run, best=False):
    """latest.pt (and with best, best.pt): the model and what a continued run needs to go on exactly."""
    model, state = s["model"], s["state"]
    common = {"model": model.state_dict(), "model_args": asdict(model.config), "model_code": model_code(),
              "tokens": s["tokens"],
              "tokenizer": s["tok"].to_meta(), "config": {**asdict(cfg), **s["dataset"]},
              "iter_num": state.iter_num}
    save_checkpoint({**common, "optimizer": [opt.state_dict() for opt in s["optimizers"]],
                     "seconds_spent": state.seconds_spent,
                     "rl": {"state": state.to_dict(), "draw": s["draw"].generator.get_state(),
                            "sampling": s["sampling"].get_state()}}, run.latest, previous=run.previous)
    if best:
        save_checkpoint({**common, "pass_at_1": state.best_pass_at_1}, run.best)


def opening_scores(cfg, s):
    """A new run's scores at step 0, refused where its samples are never right: no reward to learn from. Before
    anything is written, so that the run can start again once fixed."""
    scores = evaluate(cfg, s)
    if line := no_reward_line(cfg, scores, s["heldout"]):
        raise UserError(line)
    return scores


def practise(cfg, s, run, log, stop, first=None):
    """The loop: steps until max_iters, evaluating and saving every eval_interval steps and at the end; first: a
    new run's scores at step 0."""
    state, begun = s["state"], time.time() - s["state"].seconds_spent
    if first is not None:
        log.write({"kind": "rl_eval", "iter": 0, **first})
        print(f"step 0: held-out pass@1 {100 * first['pass_at_1']:.1f}%, greedy {100 * first['accuracy']:.1f}%")
        for note in (fewer_problems_note(cfg, s["heldout"]), little_reward_note(cfg, first)):
            if note:
                print(note)
    with stop.deferred(), progress(total=cfg.max_iters, desc="practising", unit="step",
                                   initial=state.iter_num) as bar:
        while state.iter_num < cfg.max_iters:
            stepped = time.perf_counter()
            logged = step(cfg, s)
            if s["tuner"] and (line := s["tuner"].after_step(time.perf_counter() - stepped, state.iter_num + 1)):
                bar.write(line)
            state.iter_num += 1
            state.seconds_spent = time.time() - begun
            log.write({"kind": "rl", "iter": state.iter_num, **logged})
            bar.update(1)
            bar.set_postfix_str(f"reward {logged['reward']:.2f}")
            if state.iter_num % cfg.eval_interval == 0 or state.iter_num == cfg.max_iters:
                scores = evaluate(cfg, s)
                log.write({"kind": "rl_eval", "iter": state.iter_num, **scores})
                improved = scores["pass_at_1"] > state.best_pass_at_1
                if improved:
                    state.best_pass_at_1, state.best_iter = scores["pass_at_1"], state.iter_num
                bar.write(f"step {state.iter_num}: held-out pass@1 {100 * scores['pass_at_1']:.1f}%, greedy "
                          f"{100 * scores['accuracy']:.1f}%, mean reward {logged['reward']:.2f}")
                save(cfg, s, run, best=improved)
            elif stop.signum:
                save(cfg, s, run)
            if stop.signum:
                raise RunStopped(f"stopped by {signal.Signals(stop.signum).name} at step {state.iter_num}; saved "
                                 f"to {run.latest}: run the same command to continue", stop.signum)
    print(f"done: {state.iter_num} step{'s' * (state.iter_num != 1)} in {state.seconds_spent:.0f} s; best.pt holds "
          f"step {state.best_iter} (held-out pass@1 {100 * state.best_pass_at_1:.1f}%)")


def main(argv=None):
    cfg, changed, saved = rl_settings(sys.argv[1:] if argv is None else argv)
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    with RunDir(cfg.out_dir).locked() as run, StopSignals() as stop:
        if saved is None and run.is_at(cfg.init_from):
            raise UserError(f"out_dir and init_from are the same folder, {run.path}: RL starts from the run there and "
                            "practises in a folder of its own; give it another --out_dir")
        # a new run: another's files, or a start that never saved, refused here and moved aside only once the
        # new run's start has been checked, its model scored and found to earn some reward, and wandb started
        how = " but no saved RL state to continue it from (latest.pt);"
        if saved is None:
            run.clear_for_a_new_run(cfg.start_over, how, print, move=False)
        s = start(cfg, run, device, changed, saved)
        if s["state"].iter_num >= cfg.max_iters:
            print(f"the RL run in {run.path} is finished ({s['state'].iter_num} steps, max_iters {cfg.max_iters}); "
                  "raise --max_iters to go on")
            return
        first = opening_scores(cfg, s) if s["state"].iter_num == 0 else None
        wandb = dict(project=cfg.wandb_project, name=cfg.wandb_run_name, config=asdict(cfg),
                     id=s["state"].wandb_id or f"rl-{int(time.time())}") if cfg.wandb_log else None
        s["state"] = replace(s["state"], wandb_id=wandb["id"] if wandb else "")
        log = RunLog(run.metrics, wandb)
        try:
            if saved is None:
                run.clear_for_a_new_run(cfg.start_over, how, print)
            with torch.autocast(device.split(":")[0], torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
                practise(cfg, s, run, log, stop, first)
        finally:
            log.close()


if __name__ == "__main__":
    run_main(main, memory_settings=("problems_per_step", "samples", "eval_problems", "eval_samples"))
