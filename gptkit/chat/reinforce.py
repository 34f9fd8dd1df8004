"""REINFORCE with the group's mean reward as the baseline (as nanochat's chat_rl.py, GRPO without its ratio,
clipping or KL term): the pieces rl.py's loop is made of, and the state its checkpoints keep."""

from dataclasses import asdict, dataclass, fields
from typing import Literal

import torch
import torch.nn.functional as F

from gptkit.base.errors import UserError
from gptkit.base.settings import (check_seed, check_threads, comma_items, config_file_values, given_values, make, require,
                                  resumed)
from gptkit.data.tasks import TASKS, problems
from gptkit.machine.runtime import check_device_name
from gptkit.run.checkpoint import (NUMBER, OPTIMIZER_STATE, TENSOR, TORCH_RANDOM, Each, Fields, load_checkpoint,
                                    settings)
from gptkit.run.run_folder import RunDir, check_checkpoint

POOL = 20_000  # training problems drawn per task, none of them held out; steps draw from these at random


@dataclass
class RLConfig:
    init_from: str = "out-chat"  # the chat run to start from (an SFT run's folder)
    init_checkpoint: str = "best"  # which of its states: 'best', 'latest' or 'iter:N' (an earlier snapshot)
    out_dir: str = "out-rl"  # where latest.pt, best.pt and metrics.jsonl go
    start_over: bool = False  # a new run even where out_dir holds one: that run's files are moved aside first
    tasks: str = "addition"  # the tasks to practise, comma-separated (each one its dataset holds)
    problems_per_step: int = 16  # problems a step
    samples: int = 16  # answers sampled per problem: the group whose mean reward is each answer's baseline
    temperature: float = 1.0  # sampling temperature of the answers it learns from
    max_new_tokens: int = 16  # the longest answer; one that has not ended by then gets no reward
    # the optimizer model.py's configure_optimizers builds: AdamW, at a constant rate
    optimizer: Literal["adamw"] = "adamw"  # AdamW over every weight (Muon's orthogonal steps suit pretraining)
    learning_rate: float = 1e-4  # AdamW's, constant
    embedding_lr: float = 0.0  # AdamW's rate for the embedding tables (0 = learning_rate)
    weight_decay: float = 0.0  # AdamW's: none, the answers' reward is the only pull
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip gradients at this norm; 0 disables
    max_iters: int = 200  # policy-gradient steps
    eval_interval: int = 25  # score held-out pass@1 every this many steps (and save)
    eval_problems: int = 200  # held-out problems of each task scored at each evaluation
    eval_samples: int = 8  # answers per held-out problem: pass@1 is their mean correctness
    seed: int = 1337  # seeds the problems drawn and the answers sampled
    device: str = "auto"  # 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'
    threads: int = 0  # torch CPU threads (0 = measured on the steps as they go, as train.py measures them)
    dtype: Literal["float32", "bfloat16"] = "float32"  # precision of the forward and backward passes
    wandb_log: bool = False  # log to Weights & Biases
    wandb_project: str = "nanogpt-chat"  # wandb project name
    wandb_run_name: str = "rl"  # wandb run name

    def __post_init__(self):
        require(self, ["problems_per_step", "max_new_tokens", "max_iters", "eval_interval", "eval_problems",
                       "eval_samples"], lambda v: v >= 1, "at least 1")
        require(self, ["learning_rate", "embedding_lr", "weight_decay", "grad_clip", "threads"], lambda v: v >= 0,
                "at least 0")
        require(self, ["beta1", "beta2"], lambda v: 0 <= v < 1, "in [0, 1)")
        # a group of one, or of one greedy answer drawn again and again, has no answer better than its mean
        require(self, ["samples"], lambda v: v >= 2, "at least 2: the group's mean reward is each answer's baseline")
        require(self, ["temperature"], lambda v: v > 0, "above 0: at 0 every answer to a problem is the same greedy "
                                                        "one, and none can be better than the group's mean")
        if not self.task_list():
            raise ValueError("tasks must name at least one task to practise (e.g. addition)")
        if not self.init_from:  # else RunDir('') names out_dir as the setting left empty
            raise ValueError("init_from is empty: name the folder of the chat run to start from (e.g. out-chat-early)")
        check_seed(self.seed)
        check_threads(self.threads)
        check_device_name(self.device)
        check_checkpoint(self.init_checkpoint, "init_checkpoint")
        for task in self.task_list():
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r} in tasks (known: {', '.join(TASKS)})")

    def task_list(self):
        return comma_items(self.tasks)


def rl_settings(argv):
    """rl.py's settings, what a continued run changes and the saved state it continues from: a new run's are the
    command's (and no state); a continued run keeps those it saved but the ones the command gives again (in config
    files or as --key=value), as train.py does, so that `python rl.py --out_dir=out-rl` alone goes on with the same
    run. Changes: {key: (saved, given)}."""
    given = given_values(RLConfig, argv, prog="rl.py")
    run = RunDir(given.get("out_dir", RLConfig.out_dir))
    ckpt, path = ({}, None) if given.get("start_over") else saved_state(run)
    if given.get("init_from") == "auto":  # as train.py's: the run in out_dir continued, or one started
        given = auto_start(given, config_file_values(RLConfig, argv), run, "rl" in ckpt)
    if "rl" not in ckpt:  # a new run, or another tool's, which rl.py refuses to continue where it starts
        return make(RLConfig, given), {}, path
    keys = {f.name for f in fields(RLConfig)} - {"start_over"}  # the command's alone: a continued run goes on
    saved = {k: v for k, v in ckpt["config"].items() if k in keys}
    changed = {k: (saved[k], v) for k, v in given.items() if k in saved and saved[k] != v and k != "out_dir"}
    for key in ("init_from", "init_checkpoint"):  # where a run started is history: a new start is a new run
        if key in changed:
            raise UserError(f"{run.path} holds an RL run started from {key}={changed[key][0]!r}; continue it "
                            f"without --{key}, or start from {changed[key][1]!r} in another --out_dir (or there, "
                            "with --start_over=True: its files are moved aside)")
    return resumed(RLConfig, saved, given, path), changed, path


def auto_start(given, configured, run, saved):
    """The settings for init_from='auto' (train.py's way to continue a run or start it, which a job requeues as
    it is): the run saved in out_dir continues, as the same command without it would; with none saved, a new run
    starts from the config files' init_from, said in a note."""
    given = {k: v for k, v in given.items() if k != "init_from"}
    if saved:
        return given
    start = configured.get("init_from", "auto")
    if start == "auto":
        raise UserError(f"init_from='auto' continues the RL run in {run.path}, which holds none; start one with "
                        "--init_from=FOLDER, the chat run to practise from (e.g. out-chat-early)")
    print(f"note: {run.path} holds no RL run to continue: --init_from=auto starts one from {start} (the config's)")
    return {**given, "init_from": start}


def saved_state(run):
    """(the saved state a run continues from, its path), or ({}, None) where there is none: latest.pt, or where it
    is damaged or missing (its save cut off), the state saved before it, latest.prev.pt, with a note. Where neither
    can be read, one line says the way on."""
    problems = [] if run.latest.exists() or not run.previous.exists() else \
        [f"{run.latest} is missing (its save was interrupted)"]
    for path in (run.latest, run.previous):
        if not path.exists():
            continue
        try:
            ckpt = load_checkpoint(path)
            # its checksum is right, its fields not what rl.py writes
            if "rl" in ckpt and (problem := RL_STATE.problem(ckpt, "")):
                raise UserError(f"{path} is damaged: {problem}")
        except UserError as e:
            problems.append(str(e))
            continue
        if problems:
            print(f"note: {'; '.join(problems)}; continuing from {path} (step {ckpt['iter_num']})")
        return ckpt, path
    if problems:
        which = "it" if len(problems) == 1 else "either"
        raise UserError(f"{'; '.join(problems)}; the run cannot continue from {which}: start it anew with "
                        "--start_over=True (its files are moved aside)")
    return {}, None


class ProblemDraw:
    """Training problems of the tasks, drawn at random with a generator of its own (kept in checkpoints, so a
    continued run draws what it would have)."""

    def __init__(self, tasks, seed):
        self.pool = [(task, q) for task in tasks for q, _ in problems(task, "train", POOL, seed)]
        self.generator = torch.Generator().manual_seed(seed)

    def next(self, count):
        return [self.pool[i] for i in torch.randint(len(self.pool), (count,), generator=self.generator).tolist()]


def advantages(rewards):
    """Each answer's reward minus its group's mean: (problems, samples) -> the same shape. A group all right
    or all wrong teaches nothing (all zero)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def answer_batch(prompts, answers, weights):
    """(inputs, targets, weights) of every answer with a weight other than 0: prompt and answer in a row,
    right-padded (a causal model's real positions never see the padding); the targets -1 but on the answer's
    tokens; each row's weight (its advantage)."""
    rows = [(p, a, w) for p, group, ws in zip(prompts, answers, weights) for a, w in zip(group, ws) if w != 0]
    if not rows:
        return None
    width = max(len(p) + len(a) for p, a, _ in rows) - 1
    x = torch.zeros(len(rows), width, dtype=torch.long)
    y = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, (p, a, _) in enumerate(rows):
        tokens = torch.tensor(p + a)
        x[i, :len(tokens) - 1] = tokens[:-1]
        y[i, len(p) - 1:len(tokens) - 1] = tokens[len(p):]
    return x, y, torch.tensor([w for _, _, w in rows], dtype=torch.float32)


def reinforce_loss(model, x, y, weights, vocab_size=None):
    """-(1/N) Σ_answers A · Σ_t log p(token_t | before): its gradient is REINFORCE's, each answer's tokens pushed
    up in proportion to its advantage A, normalised by the N answer tokens of the batch. p is the distribution
    the answers were sampled from: over the tokenizer's vocab_size tokens, not a padded head's extra rows, which
    sampling never draws and the gradient would push down for nothing. The batch, built on the CPU, goes where the
    model is."""
    device = next(model.parameters()).device
    x, y, weights = x.to(device), y.to(device), weights.to(device)
    logits, _ = model(x, y)
    logits = logits[..., :vocab_size].float()
    logp = -F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-1,
                            reduction="none").view(y.shape)
    return -(weights[:, None] * logp).sum() / (y != -1).sum()


@dataclass
class RLState:
    """What a checkpoint of an RL run keeps besides the model: where the run is, and its generators."""
    iter_num: int = 0
    best_pass_at_1: float = -1.0
    best_iter: int = 0
    seconds_spent: float = 0.0
    wandb_id: str = ""

    def to_dict(self):
        return asdict(self)


# what a continued run reads of latest.pt besides its model, and what each must be
RL_STATE = Fields({"optimizer": Each(OPTIMIZER_STATE, least=1), "seconds_spent": NUMBER,
                   "rl": Fields({"state": settings(RLState), "draw": TORCH_RANDOM, "sampling": TENSOR})})


def measured_anew(state, changed):
    """A continued run whose held-out pass@1 now measures something else (other tasks or held-out problems, another
    temperature or answer length) compares its scores anew: best.pt's was scored otherwise. Returns the note to
    print, or None."""
    keys = [key for key in ("tasks", "eval_problems", "temperature", "max_new_tokens") if key in changed]
    if not keys or state.best_pass_at_1 < 0:
        return None
    note = (f"note: with {' and '.join(keys)} changed, held-out pass@1 measures something else from here: best.pt "
            f"(step {state.best_iter}, {100 * state.best_pass_at_1:.1f}%) was scored otherwise, and the next "
            "score replaces it")
    state.best_pass_at_1 = RLState.best_pass_at_1
    return note


def best_lost(state, best):
    """A continued run whose best.pt is gone or damaged keeps its best anew from its next score, which writes it
    again: the note to print, or None where best.pt is there to compare with."""
    if state.best_pass_at_1 < 0:
        return None
    try:
        if best.is_file():
            load_checkpoint(best)
            return None
        why = "is missing"
    except UserError as e:
        why = f"cannot be read ({e})"
    state.best_pass_at_1 = RLState.best_pass_at_1
    return f"note: best.pt of step {state.best_iter} {why}; the next score writes it anew"


LITTLE_REWARD = 0.2  # a start's held-out pass@1 under which RL learned little (docs/chat.md#rl-as-sharpening)


def little_reward_note(cfg, scores):
    """A note for a start right so seldom that REINFORCE learns little from it: RL sharpens what a model already
    samples. None for a start right more often, or never (no_reward_line's). A start whose greedy answer is
    sometimes right while its samples never are gets the note too, and the temperature that keeps them apart."""
    if scores["pass_at_1"] >= LITTLE_REWARD or scores["pass_at_1"] == scores["accuracy"] == 0:
        return None
    greedy = "" if scores["pass_at_1"] else (
        f" (its greedy answer is right {100 * scores['accuracy']:.1f}% of the time, its samples at temperature "
        f"{cfg.temperature:g} never: a lower --temperature samples nearer the greedy answer)")
    return (f"note: {cfg.init_from}'s held-out pass@1 is {100 * scores['pass_at_1']:.1f}% at the start{greedy}: RL "
            "sharpens what a model already samples, and learns most from one right about half the time; fine-tune it "
            "further until pass@1 reaches about 40% (train.py's --stop_task, as config/chat_sft_early.py does), then "
            "start this run again with --start_over=True")


def held_out_counts(heldout):
    """'addition's 50 and reverse's 100': how many held-out problems of each task a score reads."""
    counts = [f"{task}'s {len(problems):,}" for task, problems in heldout.items()]
    return counts[0] if len(counts) == 1 else f"{', '.join(counts[:-1])} and {counts[-1]}"


def fewer_problems_note(cfg, heldout):
    """A note where the dataset holds fewer held-out problems of a task than eval_problems asks for; else None."""
    if all(len(problems) >= cfg.eval_problems for problems in heldout.values()):
        return None
    return (f"note: the dataset holds fewer held-out problems than eval_problems={cfg.eval_problems:,}: pass@1 is "
            f"scored on {held_out_counts(heldout)}")


def no_reward_line(cfg, scores, heldout):
    """The line for a start none of whose sampled answers to the held-out problems is right: its answers
    would earn no reward, and REINFORCE would have nothing to learn from."""
    if scores["pass_at_1"] > 0 or scores["accuracy"] > 0:
        return None
    return (f"none of {cfg.init_from}'s answers to {held_out_counts(heldout)} held-out problems was right: "
            "with no reward REINFORCE has nothing to learn from; fine-tune it for these tasks first (python "
            "train.py config/chat_sft.py), or start from a later checkpoint")

