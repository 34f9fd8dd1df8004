"""
Training configuration as data, and the parser that fills any config dataclass from
config files of plain assignments and --key=value arguments. Config files are read
with `ast` and never executed: only literal values are accepted.
"""

import ast
import difflib
import inspect
import re
import sys
import typing
from dataclasses import MISSING, dataclass, fields

from errors import UserError

TRUE_WORDS = {"true", "yes", "on", "1"}
FALSE_WORDS = {"false", "no", "off", "0"}


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"  # where ckpt.pt and metrics.jsonl go
    eval_interval: int = 250  # evaluate (and maybe checkpoint) every this many iterations
    log_interval: int = 10  # print and record the train loss every this many iterations
    eval_iters: int = 20  # batches per split in each evaluation (the same fixed batches every time)
    eval_only: bool = False  # evaluate once and exit
    always_save_checkpoint: bool = True  # save at every evaluation, not only when val loss improves
    init_from: str = "scratch"  # 'scratch', 'resume' (out_dir/ckpt.pt) or a GPT-2 name / HF directory
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
    block_size: int = 1024  # context length in tokens
    # model
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads
    n_embd: int = 768  # model width
    dropout: float = 0.0  # 0 for pretraining, 0.1+ for small data
    bias: bool = False  # biases in Linear and LayerNorm layers
    pos_emb: str = "learned"  # 'learned' (GPT-2) or 'rope'
    norm: str = "layernorm"  # 'layernorm' (GPT-2) or 'rmsnorm'
    qk_norm: bool = False  # normalise queries and keys per head (RMSNorm or LayerNorm, as `norm`)
    mlp_act: str = "gelu"  # 'gelu', 'gelu_tanh' (GPT-2's approximation) or 'relu2'
    tie_weights: bool = True  # share token embedding and output head
    logit_softcap: float = 0.0  # >0: cap logits smoothly at +-this value
    zero_init_proj: bool = False  # zero-initialise residual output projections
    # optimizer
    optimizer: str = "adamw"  # 'adamw', or 'muon' (Muon on hidden matrices, AdamW on the rest)
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
    lr_schedule: str = "cosine"  # 'cosine' (nanoGPT) or 'wsd' (warmup, stable, linear decay)
    warmup_iters: int = 100  # linear warmup steps
    lr_decay_iters: int = 0  # cosine reaches min_lr here (0 = max_iters)
    min_lr: float = 6e-5  # floor of the cosine schedule
    warmdown_frac: float = 0.5  # 'wsd': fraction of the run spent decaying to min_lr
    max_time: float = 0.0  # >0: stop after this many seconds; the schedule follows max(iter, time) progress
    # system
    backend: str = "auto"  # DDP backend: 'auto' (nccl on CUDA, gloo on CPU), 'nccl' or 'gloo'
    device: str = "auto"  # 'auto' (cuda, then mps, then cpu), or 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype: str = "auto"  # 'auto', 'float32', 'bfloat16' or 'float16'
    compile: bool = False  # torch.compile the model
    threads: int = 0  # torch CPU threads (0 = torch's default)

    def validate(self):
        positive = ["eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps",
                    "batch_size", "block_size", "n_layer", "n_head", "n_embd", "max_iters"]
        for name in positive:
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0 <= self.dropout < 1:
            raise UserError(f"dropout must be in [0, 1) (got {self.dropout})")
        check_choice("pos_emb", self.pos_emb, ["learned", "rope"])
        check_choice("norm", self.norm, ["layernorm", "rmsnorm"])
        check_choice("mlp_act", self.mlp_act, ["gelu", "gelu_tanh", "relu2"])
        check_choice("optimizer", self.optimizer, ["adamw", "muon"])
        check_choice("lr_schedule", self.lr_schedule, ["cosine", "wsd"])
        check_choice("backend", self.backend, ["auto", "nccl", "gloo"])
        check_choice("dtype", self.dtype, ["auto", "float32", "bfloat16", "float16"])
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            raise UserError(f"device must be auto, cpu, mps, cuda or cuda:N (got {self.device!r})")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise UserError("pos_emb='rope' needs an even head size (n_embd / n_head)")
        if not 0 <= self.warmdown_frac <= 1:
            raise UserError(f"warmdown_frac must be in [0, 1] (got {self.warmdown_frac})")
        for name in ["learning_rate", "embedding_lr", "min_lr", "muon_lr", "weight_decay", "grad_clip", "max_time"]:
            if getattr(self, name) < 0:
                raise UserError(f"{name} must not be negative (got {getattr(self, name)})")


def check_choice(name, value, choices):
    if value not in choices:
        raise UserError(f"{name} must be one of {', '.join(choices)} (got {value!r})")


def field_types(cls):
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def field_comments(cls):
    """The one-line comment after each field in the class source, used as --help text."""
    comments = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): \w+ = .*?  # (.*)$", line)
        if m:
            comments[m.group(1)] = m.group(2)
    return comments


def unknown_key_error(key, cls, source):
    close = difflib.get_close_matches(key, field_types(cls), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return UserError(f"{source}: unknown config key '{key}'{hint}")


def coerce(key, value, typ, source, from_text):
    """Convert a parsed value to the field's type, or raise one clear error naming the key."""
    if from_text:  # command-line text: a Python literal if it parses, else the bare word
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            literal = value
        if typ is str:
            return literal if isinstance(literal, str) else value
        value = literal
    if typ is bool:
        if isinstance(value, bool):
            return value
        word = str(value).lower()
        if word in TRUE_WORDS | FALSE_WORDS:
            return word in TRUE_WORDS
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str and isinstance(value, str):
        return value
    raise UserError(f"{source}: {key} must be {typ.__name__}, got {value!r}")


def read_config_file(path, cls):
    """The assignments in a config file, as {key: value}; anything but literals is refused."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except (SyntaxError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a valid config file ({e})") from None
    types = field_types(cls)
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not isinstance(target, ast.Name):
            raise UserError(f"{path}:{node.lineno}: only `name = value` assignments are allowed in config files")
        key = target.id
        if key not in types:
            raise unknown_key_error(key, cls, f"{path}:{node.lineno}")
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, SyntaxError, TypeError):
            raise UserError(f"{path}:{node.lineno}: {key} must be a literal value "
                            "(config files are parsed, never executed)") from None
        values[key] = coerce(key, value, types[key], f"{path}:{node.lineno}", from_text=False)
    return values


def split_args(argv, cls):
    """Yield (key, text) pairs and config file paths from argv, accepting --k=v, --k v and --flag."""
    types = field_types(cls)
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            yield None, arg
            continue
        key, eq, text = arg[2:].partition("=")
        if not eq:
            if key not in types:
                raise unknown_key_error(key, cls, "command line")
            if i < len(argv) and not argv[i].startswith("--") and not (types[key] is bool and argv[i].endswith(".py")):
                text = argv[i]
                i += 1
            elif types[key] is bool:
                text = "True"
            else:
                raise UserError(f"command line: --{key} needs a value, e.g. --{key}=VALUE")
        yield key, text


def print_help(cls, prog):
    print(f"usage: python {prog} [config_file.py ...] [--key=value ...]\n")
    comments = field_comments(cls)
    for f in fields(cls):
        default = f.default if f.default is not MISSING else None
        print(f"  --{f.name}={default!r:<12} {comments.get(f.name, '')}")


def pick_subcommand(prog, commands, argv, noun):
    """(name, remaining argv) for `python PROG NAME [--key=value ...]`; None after printing usage."""
    names = ", ".join(commands)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python {prog} {{{names}}} [--key=value ...]   (python {prog} NAME --help for options)")
        return None
    if argv[0] not in commands:
        raise UserError(f"unknown {noun} {argv[0]!r}; choose one of: {names}")
    return argv[0], argv[1:]


def parse_config(cls, argv, prog="train.py"):
    """Build cls from config files and --key=value arguments (later ones win), then validate it."""
    if any(a in ("-h", "--help") for a in argv):
        print_help(cls, prog)
        sys.exit(0)
    types = field_types(cls)
    values = {}
    for key, text in split_args(argv, cls):
        if key is None:
            if not text.endswith(".py"):
                raise UserError(f"command line: expected a config file ending in .py or --key=value, got {text!r}")
            values.update(read_config_file(text, cls))
        elif key not in types:
            raise unknown_key_error(key, cls, "command line")
        else:
            values[key] = coerce(key, text, types[key], "command line", from_text=True)
    config = cls(**values)
    if hasattr(config, "validate"):
        config.validate()
    return config
