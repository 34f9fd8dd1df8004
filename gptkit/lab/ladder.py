"""The attention lab: the path a learner reads about, from a bigram table to the full GPT, as rungs that
train.py trains one after the other on the same text: by default on the same number of training tokens, so that
the table says what each mechanism learns from the same text whatever the machine and whatever else it is doing;
or, with a time budget, for the same wall time, so that it says what each buys per second on this machine. And
what the lab reads back from each run: its row of the table, how diffuse its attention is, its attention map and
a short sample. Each rung keeps its row in its folder (lab.json), so that the table of a later lab run into the
same out_dir lists the rungs trained before it too. Any of model.py's settings given to the lab goes over every
rung's own, and the rows it changes carry it in their names."""

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from gptkit.base.errors import UserError, first_line
from gptkit.base.files import no_links, refuse_link, write_whole
from gptkit.base.settings import check_seed, check_threads, comma_items, given_values, make, parse_config
from gptkit.base.signals import LAUNCHER_PID, StopSignals
from gptkit.data.dataset import Split, bits_per_char, fixed_offsets, load_meta, shards_of
from gptkit.data.sources import sha256_of
from gptkit.data.tokenizer import tokenizer_from_meta
from gptkit.interp.experiments import KINDS, head_scores, induction_tokens
from gptkit.interp.hooks import MissingHookPoint, attention_maps
from gptkit.interp.timeline import FORMED_AT, timeline_of
from gptkit.machine.runtime import check_device_name, pick_device
from gptkit.run.metrics import parsed, read_metrics
from gptkit.run.run_folder import RunDir, load_model
from gptkit.sampling.decoding import generate, sees_ahead
from gptkit.sampling.prompts import read_prompt
from gptkit.training.train_config import TrainConfig
from model import GPTConfig

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "config" / "shakespeare_char.py"

# One recipe for every rung but 'modern', so that between two rungs only the mechanism differs: the
# same context, batch, width, depth, optimizer and schedule. Sized for a budget of seconds on 2 CPU
# cores: 32 characters of context (several words: something for attention to look at, while the
# T x T work, heaviest for additive scores, leaves every rung hundreds of steps or more), two layers,
# small batches (more, cheaper steps), AdamW as the notes use, with a cosine decay that follows the
# training. An untied output head, so that the bigram rung is a real bigram table (a head tied to
# the embedding scores a pair of characters alike in both orders). float32: bf16 autocast makes these
# small multi-head steps slower on CPU. Few evaluations: they come out of each rung's budget.
RECIPE = ("--block_size=32", "--batch_size=16", "--n_layer=2", "--n_head=1", "--n_embd=64", "--dropout=0.0",
          "--bias=False", "--pos_emb=learned", "--optimizer=adamw", "--learning_rate=3e-3", "--min_lr=3e-4",
          "--warmup_iters=20", "--weight_decay=0.1", "--beta2=0.99", "--tie_weights=False", "--dtype=float32",
          "--compile=False", "--eval_interval=50", "--eval_iters=4", "--log_interval=50")
SAMPLE_TEMPERATURE = 0.8  # as sample.py: a little safer than the model's own distribution
ENTROPY_WINDOWS = 8  # val windows whose attention the entropy is averaged over
RESULT = "lab.json"  # a rung's row, in its folder
STOP_GRACE_S = 30  # how long a stopped train.py may take to save its step before it is killed


@dataclass(frozen=True)
class Rung:
    name: str  # its folder under out_dir, and its name for --rungs
    adds: str  # what it adds to the path, for the table
    options: tuple  # train.py options after the recipe (or, for the preset, after the preset file)
    preset: bool = False  # trains config/shakespeare_char.py instead of the recipe
    cheats: bool = False  # sees the token it is asked to predict: its losses are not a result


RUNGS = (
    Rung("bigram", "no attention: the next character from the current one alone", ("--n_layer=0",)),
    Rung("uniform", "averages the past with equal weights (the tril trick)", ("--attention=uniform", "--mlp=False")),
    Rung("scaled", "one head of learned weights, softmax(q·k/√d)", ("--mlp=False",)),
    Rung("dot", "the same head without the √d: softmax(q·k)", ("--attention=dot", "--mlp=False")),
    Rung("additive", "Bahdanau's scores instead: softmax(v·tanh(q+k))", ("--attention=additive", "--mlp=False")),
    Rung("four_heads", "four scaled heads of a quarter the size", ("--n_head=4", "--mlp=False")),
    Rung("blocks", "an MLP after attention: full GPT blocks", ("--n_head=4",)),
    Rung("modern", "the tool's default, config/shakespeare_char.py", ("--min_tokens_per_param=0",), preset=True),
    Rung("encoder", "CHEATS: blocks without the causal mask see the answer", ("--n_head=4", "--causal=False"),
         cheats=True),
)
RUNG_NAMES = tuple(r.name for r in RUNGS)


@dataclass
class LabConfig:
    dataset: str = "shakespeare_char"  # prepared dataset every rung trains on (made by data/prepare.py)
    data_dir: str = ""  # folder holding prepared datasets ('' = this project's data/)
    out_dir: str = "out-lab"  # a run folder per rung, and the table, samples and loss picture
    tokens: int = 1_000_000  # training tokens per rung: each learns from as much text (its steps follow)
    budget: float = 0.0  # >0: seconds of training per rung instead (train.py's max_time), and tokens are ignored
    rungs: str = ",".join(RUNG_NAMES)  # which rungs to train, comma-separated, in this order
    prompt: str = "First Citizen:\nBefore we proceed"  # attention maps show it, samples go on from it
    sample_tokens: int = 200  # tokens in each rung's sample
    seed: int = 1337  # seeds every rung's weights and data order, and the samples
    device: str = "auto"  # 'auto' (cuda, then mps, then cpu), or 'cpu', 'cuda', 'cuda:N', 'mps'
    threads: int = 1  # torch CPU threads per training run (0 = measured as it runs): see docs/lab.md
    # model.py's settings given as --KEY=VALUE, {key: value} over every rung's own (lab_config sets them)
    model_settings: dict = field(default_factory=dict, init=False)

    def __post_init__(self):
        if self.budget < 0 or self.tokens < 0 or not (self.budget > 0 or self.tokens > 0):
            raise ValueError(f"need tokens > 0, or budget > 0 seconds (got tokens={self.tokens}, "
                             f"budget={self.budget})")
        if self.sample_tokens < 0 or self.threads < 0:
            raise ValueError("sample_tokens and threads must not be negative")
        check_seed(self.seed)
        check_threads(self.threads)
        names = self.rung_names()
        unknown = [n for n in names if n not in RUNG_NAMES]
        if unknown or not names:
            raise ValueError(f"unknown rung {unknown[0] if unknown else self.rungs!r}; "
                             f"choose from {', '.join(RUNG_NAMES)}")
        if len(set(names)) < len(names):
            raise ValueError(f"a rung is named twice in {self.rungs!r}")
        check_device_name(self.device)

    def rung_names(self):
        return comma_items(self.rungs)

    def chosen(self):
        return [next(r for r in RUNGS if r.name == n) for n in self.rung_names()]

    def training(self):
        return training_words(self.budget, self.tokens)


@dataclass
class LabCommand(LabConfig):
    """lab.py's command line: the lab's settings, and model.py's (GPTConfig's, but the vocabulary, which the dataset
    sets) for every rung, which --help lists under their own heading as train.py's does."""
    model: GPTConfig = field(default_factory=GPTConfig, metadata={
        "not_settable": ("vocab_size",),
        "heading": "model settings (model.py's GPTConfig), over every rung's own; one not given keeps the rung's:"})


def lab_config(argv):
    """LabConfig from lab.py's command line, the model settings it gives in its model_settings. They are checked
    with each rung's own (check_before_training), not as a model of GPTConfig's defaults would take them."""
    values = given_values(LabCommand, argv, prog="lab.py")
    model = {f.name for f in fields(GPTConfig)}
    cfg = make(LabConfig, {key: value for key, value in values.items() if key not in model})
    cfg.model_settings = {key: value for key, value in values.items() if key in model}
    return cfg


def settings_words(settings):
    """{key: value} as a command names them: "qk_norm=True, pos_emb='rope'"."""
    return ", ".join(f"{key}={value!r}" for key, value in settings.items())


def training_words(budget, tokens):
    """How much a rung trains, in words: '1,000,000 tokens', or with a budget '25 s'."""
    return f"{budget:g} s" if budget > 0 else f"{tokens:,} tokens"


def own_args(rung):
    """train.py's options that make a rung what it is: the recipe (or the preset), then the rung's own."""
    return [*([str(PRESET)] if rung.preset else RECIPE), *rung.options]


def train_args(rung, cfg):
    """train.py's options for a rung: its own, the model settings the lab was given, then what the lab sets
    for every rung: where it trains and writes, how long (its tokens as steps, or its time budget), seed and
    device."""
    given = [*own_args(rung), *(f"--{key}={value!r}" for key, value in cfg.model_settings.items())]
    if cfg.budget > 0:
        length = [f"--max_time={cfg.budget}"]  # planned as the steps that fit in it here idle, whatever the load
    else:
        own = rung_config(rung, cfg, given)
        per_step = own.batch_size * own.model.block_size * own.gradient_accumulation_steps
        length = ["--max_time=0", f"--max_iters={math.ceil(cfg.tokens / per_step)}"]
    lab = [f"--dataset={cfg.dataset}", f"--data_dir={cfg.data_dir}", f"--out_dir={run_dir(cfg, rung)}", *length,
           f"--seed={cfg.seed}", f"--device={cfg.device}", f"--threads={cfg.threads}", "--init_from=scratch",
           "--wandb_log=False"]
    return [*given, *lab]


def rung_config(rung, cfg, args):
    """train.py's config from a rung's options; where the model settings given to the lab do not go with the rung's
    own (GPTConfig's checks refuse them), one line naming the rung."""
    try:
        return parse_config(TrainConfig, args, prog="train.py")
    except UserError as e:
        if not cfg.model_settings:
            raise
        raise UserError(f"rung {rung.name} cannot take {settings_words(cfg.model_settings)}: {e}") from None


def changed_settings(rung, cfg):
    """{key: value} of the model settings given to the lab that the rung does not have already."""
    own = parse_config(TrainConfig, own_args(rung), prog="train.py").model
    return {key: value for key, value in cfg.model_settings.items() if getattr(own, key) != value}


def settings_line(cfg):
    """The line a lab given model settings starts with: each, and the chosen rungs it changes."""
    changes = {rung.name: changed_settings(rung, cfg) for rung in cfg.chosen()}
    said = [f"{key}={value!r} changes "
            f"{', '.join(n for n, changed in changes.items() if key in changed) or 'no rung (each has it already)'}"
            for key, value in cfg.model_settings.items()]
    return f"model settings over each rung's own: {'; '.join(said)}"


def run_dir(cfg, rung):
    return Path(cfg.out_dir) / rung.name


def check_before_training(cfg):
    """What would otherwise fail only after minutes of training: the dataset, every rung's options, the
    prompt (in the vocabulary, short enough for every rung's context), and the rows kept from earlier runs
    that the table will list beside the new ones. The dataset folder, its metadata and the prompt."""
    folder, meta = load_meta(cfg.data_dir, cfg.dataset)
    for split in ("train", "val"):  # its token files checked as train.py checks them, before a rung's are cleared
        Split(folder, split, meta, block_size=1)
    saved_rows(cfg, meta, leave_out=cfg.rung_names())
    check_results(Path(cfg.out_dir))
    prompt = read_prompt(cfg.prompt)
    try:
        ids = tokenizer_from_meta(meta).encode(prompt)
    except UserError as e:
        raise UserError(f"prompt: {e}") from None
    if not ids:
        raise UserError("the prompt is empty: pass some text with --prompt")
    for rung in cfg.chosen():
        check_rung_folder(run_dir(cfg, rung))
        block_size = rung_config(rung, cfg, train_args(rung, cfg)).model.block_size
        if len(ids) > block_size:
            raise UserError(f"the prompt is {len(ids)} tokens, longer than rung {rung.name}'s block_size "
                            f"{block_size}; pass a shorter --prompt")
    return folder, meta, prompt


STAMP = "<!-- lab.py wrote this file; the sha256 of its text but this line: {} -->\n"  # Markdown shows no comment
STAMPED = re.compile(r"^" + re.escape(STAMP.rstrip("\n")).replace(r"\{\}", "([0-9a-f]{64})") + "\n?", re.M)


def stamped(text):
    """The text of a table.md or samples.md as the lab writes it: with a line that tells it from one edited since."""
    return text + STAMP.format(hashlib.sha256(text.encode("utf-8")).hexdigest())


def check_results(out):
    """The table and the samples are the lab's, written anew from every rung's row: one edited since the lab wrote
    it (its text but the stamp line no longer has the stamp's digest) holds the learner's words, which would go
    without one. One with no stamp (written before the lab stamped them, or by the learner) cannot be told."""
    for path in (out / "table.md", out / "samples.md"):
        text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        stamp = STAMPED.search(text)
        rest = text[:stamp.start()] + text[stamp.end():] if stamp else ""
        if stamp and hashlib.sha256(rest.encode("utf-8")).hexdigest() != stamp[1]:
            raise UserError(f"{path} was edited since the lab wrote it, and the lab writes it anew from every rung's "
                            "row; move it, or give the lab another --out_dir")


def check_rung_folder(folder):
    """A rung trains afresh in its folder, clearing the files an earlier lab left there. A folder holding a run
    no lab trained (no train.log or lab.json of a lab's beside it), one trained on since (train.py continued
    it, the rung finished or stopped), or SAEs of its weights, is someone's: refuse, rather than replace its best.pt."""
    if folder.is_symlink():  # a run elsewhere (another lab's rung, say), whose files and row would go without a word
        raise UserError(f"{folder} is a link (to {os.readlink(folder)}), and the lab clears and trains a rung only in "
                        "a folder of its own; remove the link, or give the lab another --out_dir")
    # the lab's own files, cleared and written after the run's (RunDir checks those): a link there would be written
    # through, a folder would stop it; both refused before its old run is cleared
    own = (folder / RESULT, folder / "attention.png", folder / "train.log")
    for p in own:
        refuse_link(p)
    folders = [p for p in own if p.is_dir()]
    if folders:
        raise UserError(f"{folders[0]} is a folder where the lab writes a file; move it out of the way")
    run = RunDir(folder)
    found = [p for p in (run.best, run.latest, run.previous, run.legacy, run.metrics) if p.exists()]
    if found and not any((folder / name).exists() for name in ("train.log", RESULT)):
        raise UserError(f"{folder} holds a run the lab did not train ({', '.join(p.name for p in found)}); move it, "
                        "or give the lab another --out_dir")
    # the user's analysis of the run's weights, which the rung's train.py would refuse to train beside
    if os.path.lexists(folder / "sae"):
        raise UserError(f"{folder} holds sparse autoencoders of its run's weights (sae/, analyze.py features); move "
                        "them, or give the lab another --out_dir")
    theirs = not_snapshots(run.snapshots)
    if theirs:
        raise UserError(f"{run.snapshots} {theirs}, and the lab clears only its own snapshots there for a new run; "
                        "move it, or give the lab another --out_dir")
    # the lab writes a rung's row once its train.py has ended: a run file not as it was then was written since
    later = written_since(found, folder / RESULT)
    if later:
        raise UserError(f"{folder} holds a run trained on since the lab trained it ({', '.join(later)} written since "
                        f"its {RESULT}); move it, or give the lab another --out_dir")
    # a rung stopped before its row was written has no row to be newer than: its metrics say a train.py went on
    resumed = resumed_at(run.metrics)
    if resumed is not None:
        raise UserError(f"{folder} holds a run trained on since the lab started it (train.py continued it from "
                        f"iteration {resumed:,}); move it, or give the lab another --out_dir")


def not_snapshots(snapshots):
    """What of a rung's snapshots/ the lab did not write, in words ('' for none), which train.py would refuse to
    train beside once the lab had cleared the rest: a link, a file where the folder goes, files of other names."""
    if snapshots.is_symlink():
        return "is a link"
    if snapshots.exists() and not snapshots.is_dir():
        return "is a file, not a folder"
    others = sorted(p.name for p in snapshots.iterdir() if not p.match("iter_*.pt*")) if snapshots.is_dir() else []
    return f"holds {', '.join(others)}" if others else ""


def resumed_at(metrics):
    """The iteration a later train.py continued the run of this metrics.jsonl from, or None where one train.py
    wrote it: the lab trains a rung once, from scratch, so its metrics hold one run record. Lines that are not
    whole JSON are passed over (a train.py killed as it wrote one): the lab clears them with the rest."""
    try:
        lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    runs = [record["iter"] for record in map(parsed, lines)
            if record.get("kind") == "run" and type(record.get("iter")) is int]
    return runs[-1] if len(runs) > 1 else None


def run_train(args, log, stops):
    """train.py in a process of its own, as a user would start it, its output into the log file: its exit
    status. A stop signal to the lab stops train.py too, and the lab waits for it: no train.py outlives the
    lab, holding its folder: killed itself (SIGKILL), the lab passes nothing on, and train.py, watching for it
    (stop_with_launcher), stops as on SIGTERM."""
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, LAUNCHER_PID: str(os.getpid())})
    try:
        return proc.wait()
    except BaseException:
        with stops.deferred():  # a second SIGTERM lets the wait go on (a second Ctrl-C still stops at once)
            proc.terminate()  # train.py saves after its step and exits, as on any stop signal
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


VOUCHED = ("best.pt", "latest.pt", "latest.prev.pt", "ckpt.pt", "metrics.jsonl", "attention.png")


def stamps(folder):
    """The sha256 of each of a rung's files the lab's row vouches for, as they are when it writes the row: what
    tells them from the same files written since (train.py continued the run, plot.py drew the picture again),
    where their times cannot (a folder copied with `cp -r` has every file newer than its row)."""
    return {name: sha256_of(folder / name) for name in VOUCHED if (folder / name).is_file()}


def written_since(paths, row):
    """The names of those of a rung's files written since the lab wrote its row: by the row's stamps, or for a row
    from before them by the files' times (newer than the row's)."""
    try:
        kept = json.loads(row.read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, RecursionError, AttributeError):
        kept = None
    if not isinstance(kept, dict):
        written = row.stat().st_mtime_ns if row.is_file() else None
        return [p.name for p in paths if written is not None and p.stat().st_mtime_ns > written]
    return [p.name for p in paths if kept.get(p.name) != sha256_of(p)]


def redrawn(picture, row):
    """Say so where the rung's picture, about to go with its run, was drawn since the lab drew it (plot.py attention
    draws there): the lab draws it before it writes the row, which vouches for it."""
    if picture.is_file() and row.is_file() and written_since([picture], row):
        print(f"note: {picture} was drawn since the lab drew it; it goes with the rung's old run, and the rung trained "
              "again draws its own there", flush=True)


ASIDE = ".lab-previous"  # a rung's earlier run while the new one trains: back in place if its train.py fails


def rung_files(folder, run):
    """The files of a rung's run the lab replaces: its records, states, best weights, picture and row, and the
    snapshots its run kept (never through a link of the user's, which stays for train.py to refuse)."""
    snapshots = [] if run.snapshots.is_symlink() else list(run.snapshots.glob("iter_*.pt*"))
    return [p for p in (run.metrics, run.latest, run.previous, run.best, run.legacy, folder / "attention.png",
                        folder / RESULT, *snapshots) if p.is_file()]


def set_aside(folder, run):
    """Move the rung's run into folder/ASIDE, which holds nothing else; one left there by a lab killed while the
    rung trained again held the run before it, which that lab was asked to replace."""
    aside = folder / ASIDE
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside)
    for path in rung_files(folder, run):
        move(path, folder, aside)
    drop_empty_snapshots(run)
    return aside


def move(path, source, dest):
    """path, inside folder source, to the same place inside folder dest."""
    (dest / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, dest / path.relative_to(source))


def drop_empty_snapshots(run):
    """Remove the rung's snapshots/ once the lab has taken its own out of it: train.py takes the folder, even
    empty, for another run's (a file of the user's there stays, for train.py to refuse)."""
    if run.snapshots.is_dir() and not run.snapshots.is_symlink() and not any(run.snapshots.iterdir()):
        run.snapshots.rmdir()


def put_back(folder, run, aside):
    """The rung's earlier run in place again, instead of what its failed train.py wrote: True where there was one."""
    if not aside.is_dir():
        return False
    for path in rung_files(folder, run):
        path.unlink()
    drop_empty_snapshots(run)
    for path in sorted(p for p in aside.rglob("*") if p.is_file()):
        move(path, aside, folder)
    shutil.rmtree(aside)
    return True


def train_rung(rung, cfg, stops):
    """Train one rung from scratch into its folder: the seconds its train.py took, start to exit. Its earlier run
    waits aside meanwhile: the new one replaces it, a stopped one too (its state saved, as train.py saves on a
    stop), and a train.py that fails gives it back."""
    folder = run_dir(cfg, rung)
    run = RunDir(folder)
    # a rung always starts afresh: train.py appends to metrics.jsonl and would keep an older best.pt's
    # weights. The folder's lock first: a run still writing there (a train.py, another lab) keeps its files.
    with run.locked():
        redrawn(folder / "attention.png", folder / RESULT)
        aside = set_aside(folder, run)
    # released: the rung's train.py takes it, as every run does (the folder, where the lock made it and nothing
    # was in it, went with the lock: made again for the log)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with open(folder / "train.log", "w", encoding="utf-8", opener=no_links) as log:
            status = run_train(train_args(rung, cfg), log, stops)
    except BaseException:
        discard(aside)
        raise
    if status:
        logged = (folder / "train.log").read_text(encoding="utf-8", errors="replace")
        errors = [line for line in logged.splitlines() if line.startswith("error: ")]
        why = errors[-1][len("error: "):] if errors else f"exit status {status}, see {folder / 'train.log'}"
        with run.locked():
            back = put_back(folder, run, aside)
        raise UserError(f"rung {rung.name}: train.py failed: {why}" + ("; its earlier run and row are back in place"
                                                                        if back else ""))
    discard(aside)
    return time.perf_counter() - start


def discard(aside):
    if aside.is_dir():
        shutil.rmtree(aside)


# ----------------------------------------------------------------------------- what a rung learned


@dataclass
class Row:
    rung: Rung
    budget: float  # the seconds of training it was given (0: trained on `tokens` tokens instead)
    seed: int
    params: int  # as train.py counts them (position embeddings left out)
    steps: int  # optimizer steps taken within the budget
    train_loss: float  # the last evaluation's, on its few fixed train batches
    val_loss: float  # the whole val split, every token once
    entropy: float | None  # bits; None without attention
    seconds: float  # train.py's wall time, start to exit
    sample: str
    evals: list  # its eval records: its curve in the loss picture
    tokens: int = 0  # the training tokens it was given, where it was not a budget (its steps cover at least those)
    tokens_per_iter: int = 0  # its steps' tokens (rows written before they were kept: 0)
    heads: dict = field(default_factory=dict)  # {kind: [head, score]}: its strongest head of each kind ({}: none)
    formed: dict = field(default_factory=dict)  # {kind: step}: where that head's timeline first passed FORMED_AT
    model_settings: dict = field(default_factory=dict)  # {key: value}: those given to the lab it lacked ({}: none)
    # its model's positions see the tokens after them, its rung's mask or not (a mask taken out of model.py by hand)
    sees_ahead: bool = False

    @property
    def cheats(self):
        """Whether it sees the token it is asked to predict: its losses are not a result."""
        return self.rung.cheats or self.sees_ahead

    @property
    def training(self):
        return training_words(self.budget, self.tokens)

    @property
    def label(self):
        """Its name, and what sets it apart from the path's rung: 'encoder (cheats)', 'scaled (qk_norm=True)'."""
        marks = ["cheats"] * self.cheats + ([settings_words(self.model_settings)] if self.model_settings else [])
        return f"{self.rung.name} ({', '.join(marks)})" if marks else self.rung.name


def attention_entropy(model, idx):
    """The mean entropy in bits of every softmax row (layer, head, query) for the windows idx: 2**H is how
    many keys a query's attention would cover were they weighted equally. None without attention."""
    if model.config.n_layer == 0:
        return None
    maps = attention_maps(model, idx)
    rows = torch.cat([-torch.special.xlogy(w, w).sum(-1).flatten() for w in maps])  # 0 log 0 = 0
    return rows.mean().item() / math.log(2)


def strongest_heads(model, windows, vocab):
    """{kind: [head, score]}: the head (L0H3) with the highest score of each kind in gptkit.interp.experiments's
    head_scores, read on the val windows and on repeated random sequences of the first `vocab` tokens."""
    scores = head_scores(model, windows, induction_tokens(model, vocab))
    strongest = {}
    for kind in KINDS:
        best = int(scores[kind].argmax())
        layer, head = divmod(best, model.config.n_head)
        strongest[kind] = [f"L{layer}H{head}", round(scores[kind].flatten()[best].item(), 3)]
    return strongest


def formed_at(heads, records):
    """{kind: the first step at which the rung's strongest head of that kind scored FORMED_AT or more in its
    timeline}, for the kinds whose head got there."""
    formed = {}
    for t in timeline_of(records):
        for kind, (name, _) in heads.items():
            layer, head = map(int, name[1:].split("H"))
            if kind not in formed and t.get("heads") and t["heads"][kind][layer][head] >= FORMED_AT:
                formed[kind] = t["iter"]
    return formed


def val_windows(folder, meta, block_size, device):
    """The same few val windows for every rung of a context length."""
    split = Split(folder, "val", meta, block_size)
    return split.batch(fixed_offsets(split, ENTROPY_WINDOWS, 1)[0], device)[0]


def sample_text(model, tok, prompt, cfg, device):
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    idx = torch.tensor([tok.encode(prompt)], dtype=torch.long, device=device)
    out = generate(model, idx, cfg.sample_tokens, temperature=SAMPLE_TEMPERATURE, generator=generator,
                   vocab_size=tok.vocab_size)
    return tok.decode(out[0].tolist())


def read_rung(rung, cfg, seconds, data, prompt, device):
    """A trained rung's row, from its metrics and checkpoint, kept in its folder; draws its attention. Under
    the folder's lock, so that no other run changes what is read and written there meanwhile."""
    folder = run_dir(cfg, rung)
    with RunDir(folder).locked():
        records = read_metrics(folder)
        finals = [r for r in records if r["kind"] == "final"]
        evals = [r for r in records if r["kind"] == "eval"]
        if not finals:
            raise UserError(f"rung {rung.name}: {folder / 'metrics.jsonl'} has no final score; did train.py finish?")
        model, tok = load_model(folder, device, "latest")  # the final weights, whose val loss the row reports
        per_step = next(r["tokens_per_iter"] for r in records if r["kind"] == "run")
        entropy, heads = looked_inside(rung, folder, (model, tok), prompt, data, device) if model.config.n_layer \
            else (None, {})
        row = Row(rung, cfg.budget, cfg.seed, model.num_params(), finals[-1]["iter"], evals[-1]["train_loss"],
                  finals[-1]["val_loss"], entropy, seconds, sample_text(model, tok, prompt, cfg, device), evals,
                  0 if cfg.budget > 0 else cfg.tokens, per_step, heads, formed_at(heads, records),
                  changed_settings(rung, cfg), sees_ahead(model))
        save_row(row, folder, cfg.dataset, data[1])
    return row


def looked_inside(rung, folder, loaded, prompt, data, device):
    """(its attention's entropy, its strongest heads) for a rung's row, and its attention.png drawn; (None, {}), said
    in a note, where the learner's attention in model.py has no hook_pattern to read them from (the notes' heads
    written by hand): the rung trained, and its loss and sample still make its row."""
    from gptkit.interp.pictures import draw_model_attention

    model, tok = loaded
    windows = val_windows(*data, model.config.block_size, device)
    try:
        found = attention_entropy(model, windows), strongest_heads(model, windows, tok.vocab_size)
        draw_model_attention(model, tok, prompt, folder / "attention.png", name=rung.name)
    except MissingHookPoint as e:
        print(f"note: rung {rung.name}: {e}; its row has no attention entropy or heads, and no attention.png",
              flush=True)
        return None, {}
    return found


def tokens_digest(meta):
    """A digest of the dataset's token files' checksums: a dataset prepared again under its name from other text
    has another; None for one whose meta.json lists no checksums (prepared before they were kept)."""
    sums = [shard.get("sha256") for split in ("train", "val") for shard in shards_of(meta, split)]
    return None if None in sums else hashlib.sha256(" ".join(sums).encode()).hexdigest()


def save_row(row, folder, dataset, meta):
    """The row as lab.json, whole or not at all (written aside, then renamed)."""
    write_whole(folder / RESULT, json.dumps(dict(asdict(row), rung=row.rung.name, dataset=dataset,
                                                 tokens_digest=tokens_digest(meta), files=stamps(folder)),
                                            ensure_ascii=False))


def load_row(rung, folder, dataset, meta):
    """A rung's row from its lab.json, which must be of this lab's dataset, as prepared now: a table compares like
    with like."""
    path = folder / RESULT
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("object is not a mapping")
        trained_on, digest = data.pop("dataset"), data.pop("tokens_digest", None)  # rows from before: no digest
        named, files = data.pop("rung"), data.pop("files", {})  # rows from before: no stamps
        if not (digest is None or isinstance(digest, str)):
            raise TypeError(f"its tokens_digest is {str(digest)[:40]!r}, not what the lab writes there")
        if not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
            raise TypeError(f"its files is {str(files)[:40]!r}, not what the lab writes there")
        row = checked_row(Row(**dict(data, rung=rung)))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"{path} is not a row the lab wrote ({row_problem(e)}); train the rung again with "
                        f"--rungs={rung.name}") from None
    except RecursionError:
        raise UserError(f"{path} is nested too deeply to be a row the lab wrote; train the rung again with "
                        f"--rungs={rung.name}") from None
    if named != rung.name:  # a rung's folder renamed or copied: its row would stand in the table as another rung's
        raise UserError(f"{path} is the row of rung {str(named)[:40]!r}, not of {rung.name}, whose folder holds it; "
                        f"give the folder back its name, or train {rung.name} again with --rungs={rung.name}")
    if trained_on != dataset:
        raise UserError(f"{folder} was trained on dataset {trained_on!r}, not {dataset!r}, and its row would join "
                        f"this table; train it again with --rungs={rung.name}, or pick another --out_dir")
    if None not in (digest, tokens_digest(meta)) and digest != tokens_digest(meta):
        raise UserError(f"{folder} was trained on dataset {dataset!r} as it was before it was prepared again (its "
                        f"token files differ now), and its row would join this table; train it again with "
                        f"--rungs={rung.name}, or pick another --out_dir")
    return row


def row_problem(e):
    """What is wrong with a lab.json, in the words of its keys rather than of the code that read it."""
    if isinstance(e, KeyError):
        return f"it has no {e.args[0]!r}"
    if isinstance(e, AttributeError) or "object is not a mapping" in str(e):
        return "it is not a JSON object of the row's keys"
    key = re.search(r"unexpected keyword argument '(\w+)'|required (?:positional|keyword)[^']*'(\w+)'", str(e))
    if key:
        return f"it has a key the lab does not write, {key[1]!r}" if key[1] else f"it has no {key[2]!r}"
    return first_line(e)


LARGEST = 1e6  # no loss, entropy or time of a rung comes near it


def checked_row(row):
    """The row, where each field holds what the lab writes there (the table and the picture read them all); else a
    TypeError naming the first that does not. Numbers the lab writes are at least 0 (and losses, times and
    entropies far under LARGEST, past which the picture's arithmetic overflows)."""
    def number(v, none=False):
        return (none and v is None) or (type(v) in (int, float) and 0 <= v < LARGEST)

    def count(least=0):
        return lambda v: type(v) is int and v >= least

    checks = {**dict.fromkeys(("budget", "train_loss", "val_loss", "seconds"), number),
              **dict.fromkeys(("steps", "tokens"), count()), **dict.fromkeys(("params", "tokens_per_iter"), count(1)),
              "seed": lambda v: type(v) is int,
              "entropy": lambda v: number(v, none=True), "sample": lambda v: isinstance(v, str),
              "evals": lambda v: isinstance(v, list) and all(isinstance(r, dict) and count()(r.get("iter")) and
                                                             number(r.get("val_loss")) for r in v),
              "heads": lambda v: isinstance(v, dict) and all(isinstance(h, list) and len(h) == 2 and
                                                             isinstance(h[0], str) and type(h[1]) in (int, float)
                                                             and abs(h[1]) < LARGEST
                                                             for h in v.values()),
              "formed": lambda v: isinstance(v, dict) and all(type(step) is int for step in v.values()),
              "model_settings": lambda v: isinstance(v, dict) and all(
                  value is None or type(value) in (bool, int, float, str) for value in v.values()),
              "sees_ahead": lambda v: type(v) is bool}
    for name, check in checks.items():
        if not check(getattr(row, name)):
            raise TypeError(f"its {name} is {str(getattr(row, name))[:40]!r}, not what the lab writes there")
    return row


def saved_rows(cfg, meta, leave_out=()):
    """(the rows kept in out_dir, in the path's order, of every rung but those in leave_out; the rungs whose
    folder holds no row: trained by a lab before rows were kept, or stopped before the end)."""
    rows, missing = [], []
    for rung in RUNGS:
        folder = run_dir(cfg, rung)
        if rung.name in leave_out or not folder.is_dir():
            continue
        if (folder / RESULT).exists():
            rows.append(load_row(rung, folder, cfg.dataset, meta))
        else:
            missing.append(rung.name)
    return rows, missing


# ----------------------------------------------------------------------------- the lab's results


def markdown_table(header, rows, numeric):
    """A Markdown table padded to its columns, so that it reads as well in a terminal; the columns
    numbered in numeric are right-aligned."""
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i in numeric else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if i in numeric else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def per_char(val_loss, meta):
    """A val loss as bits per character of the dataset's val text (gptkit.data.dataset.bits_per_char), in a cell: '—'
    (as the table's other empty cells) where the dataset was prepared before its characters were counted."""
    bits = bits_per_char(val_loss, meta)
    return "—" if bits is None else f"{bits:.3f}"


def results_table(rows, unit, meta):
    """The rows as a table: val loss in nats per unit (char or token), and beside it bits per character, which
    compares rungs trained on differently tokenized copies of a text (char-level, the two bits columns are one)."""
    bits = ["bits/char"] if unit == "char" else ["bits/token", "bits/char"]
    header = ["rung", "training", "what it adds", "parameters", "steps", "train loss", "val loss", *bits,
              "attention entropy (bits)", "time"]
    cells = [[r.label, r.training, r.rung.adds, f"{r.params:,}", f"{r.steps:,}", f"{r.train_loss:.3f}",
              f"{r.val_loss:.3f}", *([] if unit == "char" else [f"{r.val_loss / math.log(2):.3f}"]),
              per_char(r.val_loss, meta), "—" if r.entropy is None else f"{r.entropy:.2f}", f"{r.seconds:.1f} s"]
             for r in rows]
    return markdown_table(header, cells, numeric={1, *range(3, len(header))})


def heads_table(rows):
    """Each rung's strongest head of each kind and its score: where a previous-token head, and then an induction
    head, first appear on the ladder."""
    header = ["rung", *(kind.replace("_", "-") for kind in KINDS)]
    def cell(r, k):
        step = f" (step {r.formed[k]:,})" if k in r.formed else ""
        return f"{r.heads[k][0]} {r.heads[k][1]:.2f}{step}" if k in r.heads else "—"
    cells = [[r.label, *(cell(r, k) for k in KINDS)] for r in rows]
    return markdown_table(header, cells, numeric=set())


HEADS_NOTES = (f"Strongest heads: each rung's head with the highest score of each kind, a share of its attention "
               f"in [0, 1] (docs/analysis.md defines each, and what chance gives it), on the same {ENTROPY_WINDOWS} "
               "val windows and on random sequences written twice; — without attention, or in a row from before the "
               f"lab kept them. (step N): the first step of the rung's timeline at which that head scored {FORMED_AT} "
               "or more (analyze.py timeline on the rung's folder shows the whole of it).")


BITS_NOTES = {
    "char": "bits/char = val loss / ln 2.",
    "token": "bits/token = val loss / ln 2; bits/char = val loss × val tokens / (ln 2 × the characters they spell), "
             "what compares runs whatever their tokens (— for a dataset prepared before its characters were "
             "counted: prepare it again).",
}


def results_notes(rows, missing, dataset, unit):
    """What the table's columns mean, and what sets its rows apart: how long each trained, rungs left out."""
    unfair = "; rows trained for different lengths do not compare mechanisms alone: more training buys more"
    notes = (f"Training: the tokens of {dataset} each rung learned from (the same for every rung: what each "
             "mechanism learns from the same text), or the seconds it was given (train.py's max_time: what each "
             f"buys per second on this machine){unfair if len({r.training for r in rows}) > 1 else ''}. "
             f"Losses in nats per {unit}: train loss from "
             f"the last evaluation's fixed batches, val loss on the whole val split (every {unit} once); "
             f"{BITS_NOTES[unit]} Attention entropy: mean over layers, heads and query positions of "
             f"{ENTROPY_WINDOWS} val windows. Time: train.py from start to exit.")
    if any(r.sees_ahead and not r.rung.cheats for r in rows):
        notes += (" A row marked cheats that its rung does not mark: its model's positions see the tokens after them, "
                  "the next one among them (model.py's mask taken out or changed by hand), so its losses are no "
                  "result.")
    if any(r.model_settings for r in rows):
        notes += (" A model setting in a rung's name was given to lab.py (--KEY=VALUE) over the rung's own: that row "
                  "differs from the path's rung by it too.")
    if missing:
        notes += (f" Not in the table, no {RESULT} in their folders (trained by an earlier version of the lab, or "
                  f"stopped before the end): {', '.join(missing)}; train again with --rungs={','.join(missing)}.")
    return notes


def write_results(cfg, rows, missing, trained, meta):
    """The table and the samples of every rung in out_dir, saved as Markdown, and the val-loss picture; the
    table and the samples of the rungs trained now (named in trained), printed. meta: the dataset's."""
    from gptkit.interp.pictures import draw_val_loss_vs_time

    out, unit = Path(cfg.out_dir), unit_of(meta)
    table, notes = results_table(rows, unit, meta), results_notes(rows, missing, cfg.dataset, unit)
    notes += f"\n\n{heads_table(rows)}\n\n{HEADS_NOTES}"
    samples = "\n\n".join(f"## {r.label}: {r.training} of training, seed {r.seed}\n\n```text\n{r.sample}\n```"
                           for r in rows)
    write_whole(out / "table.md", stamped(f"{table}\n\n{notes}\n"))
    write_whole(out / "samples.md", stamped(f"# Sampled {unit}s after the prompt, temperature {SAMPLE_TEMPERATURE}\n\n"
                                            f"{samples}\n"))
    lengths = sorted({r.training for r in rows})
    mixed, by_time = len(lengths) > 1, all(r.budget > 0 for r in rows)
    curves = {f"{r.label} ({r.training})" if mixed else r.label: r for r in rows}
    title = (f"{cfg.dataset}: val loss against {'wall time' if by_time else 'training tokens'}, "
             f"{'each rung with its own' if mixed else f'{lengths[0]} per rung'}")
    honest = {name: r.evals for name, r in curves.items() if not r.cheats}
    cheats = {name: r.evals for name, r in curves.items() if r.cheats}
    per_step = None if by_time else {name: r.tokens_per_iter for name, r in curves.items()}
    draw_val_loss_vs_time(honest, title, out / "loss_vs_time.png", aside=cheats, tokens_per_iter=per_step)
    for r in rows:
        if r.rung.name in trained:
            print(f"\n--- {r.label} ---\n{r.sample}")
    print(f"\n{table}\n\n{notes}\nwrote {out / 'table.md'} and {out / 'samples.md'}")


def run_lab(cfg):
    """Train every chosen rung in turn, then write and print what every rung in out_dir learned. A stop signal
    (Ctrl-C, SIGTERM) stops the rung's train.py too: the rungs done before it keep their rows."""
    with StopSignals() as stops:
        folder, meta, prompt = check_before_training(cfg)
        if cfg.model_settings:
            print(settings_line(cfg), flush=True)
        device = pick_device(cfg.device)
        unit = unit_of(meta)
        rungs = cfg.chosen()
        for i, rung in enumerate(rungs, 1):
            print(f"[{i}/{len(rungs)}] {rung.name}: {rung.adds} ({cfg.training()} of training)", flush=True)
            stops.doing = f"training rung {rung.name}"
            seconds = train_rung(rung, cfg, stops)
            stops.doing = f"reading rung {rung.name}"
            row = read_rung(rung, cfg, seconds, (folder, meta), prompt, device)
            entropy = "" if row.entropy is None else f", attention entropy {row.entropy:.2f} bits"
            bits = f"{row.val_loss / math.log(2):.3f} bits/{unit}"
            if unit != "char":
                bits += f", {per_char(row.val_loss, meta)} bits/char"
            print(f"    {row.steps:,} steps, val loss {row.val_loss:.3f} ({bits}){entropy}, {row.seconds:.0f} s",
                  flush=True)
        stops.doing = "writing the table"
        write_results(cfg, *saved_rows(cfg, meta), cfg.rung_names(), meta)


def unit_of(meta):
    """What a token of the dataset is, as the table names it: a char, or a token of a BPE."""
    return "char" if meta["tokenizer"] == "char" else "token"
