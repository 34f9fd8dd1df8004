"""train.py's settings: every key a training run takes, with its default, its meaning and its range."""

import os
from dataclasses import dataclass, field, replace
from typing import Literal

from gptkit.base.settings import check_seed, check_threads, closest, comma_items, require
from gptkit.data.tasks import TASKS
from gptkit.interop.hf import HUB_MODELS
from gptkit.machine.runtime import check_device_name
from model import GPTConfig

# Evaluation windows are drawn before the first step and held for the run, each batch's as a tensor of its own
# (about 0.6 KB) and each window's offset in it (8 bytes): these bounds keep them under about 60 and 80 MB per
# split, and an evaluation of this many batches already takes minutes on the smallest model. A whole split is
# scored once at the end anyway (final_eval_tokens).
MAX_EVAL_ITERS = 100_000
MAX_EVAL_WINDOWS = 10_000_000

# the settings that make a run's global batch (its sequences a step, over every process) with its processes
BATCH_KEYS = ("batch_size", "gradient_accumulation_steps")


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"  # where latest.pt, best.pt and metrics.jsonl go
    eval_interval: int = 250  # evaluate (and save the latest state) every this many iterations
    log_interval: int = 10  # print and record the train loss every this many iterations
    eval_iters: int = 20  # batches per split in each evaluation (the same fixed batches every time)
    final_eval_tokens: int = 0  # at the end, score this many val tokens in consecutive windows (0 = the whole split)
    stop_task: str = ""  # a chat task: end at the first evaluation where its held-out pass@1 reaches stop_pass_at_1
    stop_pass_at_1: float = 0.4  # stop_task's aim: the share right of 8 answers to each of 200 problems (temperature 1)
    eval_only: bool = False  # evaluate once, record it and exit; no checkpoint is ever written
    always_save_checkpoint: bool = True  # save latest.pt at every evaluation, not only when val loss improves
    init_from: str = "scratch"  # 'scratch', 'resume', 'auto' (resume if out_dir has a state), a run folder, GPT-2 or HF
    start_over: bool = False  # a new run into an out_dir holding another: move the old run's files aside first
    seed: int = 1337  # seeds weights, data order and dropout
    timeline: bool = True  # record what each head does as the run trains (analyze.py timeline)
    snapshots: int = 0  # keep the weights at this many of the steps recorded, in out_dir/snapshots (open: iter:N)
    # wandb
    wandb_log: bool = False  # log to Weights & Biases
    wandb_project: str = "nanogpt"  # wandb project name
    wandb_run_name: str = "run"  # wandb run name
    # data
    data_dir: str = ""  # folder holding prepared datasets ('' = this project's data/)
    dataset: str = "shakespeare_char"  # subfolder of data_dir made by data/prepare.py
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step (over all DDP ranks)
    batch_size: int = 12  # sequences per micro-batch
    batch_order: Literal["random", "epochs"] = "random"  # windows at random offsets (nanoGPT's), or each once an epoch
    train_on: Literal["answers", "all"] = "answers"  # chat data: the loss counts answers (and text mixed in), or all
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
    ema_decay: float = 0.0  # >0: evaluations and checkpoints use a moving average of the weights (optim.EMA)
    # learning-rate schedule
    decay_lr: bool = True  # False keeps learning_rate constant (no warmup either, as nanoGPT)
    lr_schedule: Literal["cosine", "wsd"] = "cosine"  # nanoGPT's cosine, or warmup-stable-decay (linear)
    warmup_iters: int = 100  # linear warmup steps
    lr_decay_iters: int = 0  # cosine reaches min_lr here (0 = max_iters)
    min_lr: float = 6e-5  # floor of the cosine schedule
    warmdown_frac: float = 0.5  # 'wsd': fraction of the run spent decaying to min_lr
    max_time: float = 0.0  # >0: seconds for the whole run on this machine idle, planned as steps (see wall_clock)
    wall_clock: bool = False  # max_time by the clock: stop when it is spent, however busy the machine (a race)
    min_tokens_per_param: float = 0.0  # >0: the tokens per parameter in max_time a model needs; fewer is said
    fit_shapes: str = ""  # a preset's own shape, then smaller ones it may train instead: '4x128, 3x128' (LAYERSxWIDTH)
    smaller_muon_weight_decay: float = -1.0  # Muon weight decay of a shape fitted smaller (below 0 = muon_weight_decay)
    # system
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # DDP backend: 'auto' is nccl on CUDA, gloo on CPU
    device: str = "auto"  # 'auto' (cuda, then mps, then cpu), or 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # 'auto': bf16 where it is fast, else fp32
    compile: bool = False  # torch.compile each transformer block
    attention_path: Literal["auto", "fused", "written", "folded"] = "auto"  # scaled/dot attention: measured or as named
    threads: int = 0  # torch CPU threads (0 = measured at start and as it runs: 1 or torch's default, the faster)
    processes: int = 1  # training processes on this machine (DDP); >1 starts them as torchrun --standalone does
    verbose: bool = False  # also print the machinery: every start-up timing, every change of thread count
    retime: bool = False  # measure this machine again (precision, attention path, step time) instead of reading it

    def __post_init__(self):
        require(self, ["eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps", "batch_size",
                       "max_iters", "processes"], lambda v: v >= 1, "at least 1")
        require(self, ["warmup_iters", "lr_decay_iters", "threads", "learning_rate", "embedding_lr", "min_lr",
                       "muon_lr", "weight_decay", "muon_weight_decay", "grad_clip", "max_time", "final_eval_tokens",
                       "min_tokens_per_param", "snapshots"],
                lambda v: v >= 0, "at least 0")
        require(self, ["beta1", "beta2", "muon_momentum", "ema_decay"], lambda v: 0 <= v < 1, "in [0, 1)")
        require(self, ["warmdown_frac"], lambda v: 0 <= v <= 1, "in [0, 1]")
        require(self, ["stop_pass_at_1"], lambda v: 0 < v <= 1, "in (0, 1]")
        check_seed(self.seed)
        check_threads(self.threads)
        if not self.dataset.strip():  # else the data folder itself is looked in for a meta.json
            raise ValueError("dataset is empty: name a folder data/prepare.py made (e.g. shakespeare_char)")
        self.check_evaluation_size()
        self.check_stop_task()
        shapes = self.fit_shape_list()
        # checked where they apply: a preset built on another, with a shape of its own, leaves the other's shapes be
        for n_layer, n_embd in shapes if shapes and shapes[0] == (self.model.n_layer, self.model.n_embd) else ():
            try:
                replace(self.model, n_layer=n_layer, n_embd=n_embd)
            except ValueError as e:
                raise ValueError(f"fit_shapes: {n_layer}x{n_embd} makes no model: {e}") from None
        fitting = bool(shapes) and self.min_tokens_per_param > 0 and self.max_time > 0
        if self.retime and self.dtype != "auto" and self.attention_path != "auto" and not fitting:
            raise ValueError("retime=True measures the choices left to auto again, but dtype and attention_path are "
                             "both set: drop --retime, or leave one of them to auto")
        check_device_name(self.device)
        starts = ["scratch", "resume", "auto", *HUB_MODELS]
        if not self.init_from:  # else the folder you are in, and a suggestion to train there with an empty --out_dir
            raise ValueError(f"init_from is empty: name a run's folder to start from (e.g. out), or one of "
                             f"{', '.join(starts)}")
        # any other name is a run's folder, whose run is looked for at the start; a near miss of a keyword is a typo
        if self.init_from not in starts and not os.path.isdir(self.init_from) and closest(self.init_from, starts):
            raise ValueError(f"init_from must be one of {', '.join(starts)}, a run's folder or one saved by "
                             f"save_pretrained (got {self.init_from!r}{closest(self.init_from, starts)})")

    def fit_shape_list(self):
        """fit_shapes as [(n_layer, n_embd), ...]: the preset's own shape first, then the smaller ones, each
        smaller than the one before (fewer layers x width squared: the blocks' weights)."""
        shapes = []
        for word in comma_items(self.fit_shapes):
            layers, x, width = word.lower().partition("x")
            if not (x and layers.isdigit() and width.isdigit()):
                raise ValueError(f"fit_shapes must list shapes as LAYERSxWIDTH, e.g. '4x128, 3x128' (got {word!r})")
            shapes.append((int(layers), int(width)))
        sizes = [layers * width ** 2 for layers, width in shapes]
        if any(later >= earlier for earlier, later in zip(sizes, sizes[1:])):
            raise ValueError(f"fit_shapes must list the preset's own shape first, then smaller ones "
                             f"(got {self.fit_shapes!r})")
        return shapes

    def check_stop_task(self):
        if self.stop_task and self.stop_task not in TASKS:
            raise ValueError(f"stop_task must be one of {', '.join(TASKS)} (got {self.stop_task!r}"
                             f"{closest(self.stop_task, TASKS)})")
        if self.stop_task and self.max_time > 0:
            raise ValueError("stop_task ends the run by its score, max_time by a number of steps planned in advance: "
                             "give one of them (max_time=0 with stop_task)")

    def check_evaluation_size(self):
        """Refuse, before any work, evaluations whose fixed windows would take gigabytes to hold."""
        if self.eval_iters > MAX_EVAL_ITERS:
            raise ValueError(f"eval_iters must be at most {MAX_EVAL_ITERS:,} (got {self.eval_iters:,}): each "
                             "evaluation scores that many batches of each split, drawn before the first step; the "
                             "whole val split is scored once at the end anyway")
        windows = self.eval_iters * self.batch_size
        if windows > MAX_EVAL_WINDOWS:
            raise ValueError(f"eval_iters x batch_size must be at most {MAX_EVAL_WINDOWS:,} windows of each split, "
                             f"drawn before the first step for the evaluations (got {windows:,}); lower eval_iters "
                             "or batch_size")
