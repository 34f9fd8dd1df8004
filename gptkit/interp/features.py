"""The features of a trained run: a sparse autoencoder (gptkit/interp/sae.py) trained on one hook point's
activations over the run's own train split, kept in the run folder in SAELens's file format, and read back: the
standard metrics (L0, explained variance, CE loss recovered, the loss splicing adds, dead features), each
feature's top contexts, frequency and logit effect, and features switched off in the forward pass.

The folder of an SAE, out_dir/sae/<hook name>/ for best.pt's weights, out_dir/sae/latest/<hook name>/ and
out_dir/sae/iter_N/<hook name>/ for latest.pt's and a snapshot's (sae_folder):
    cfg.json, sae_weights.safetensors   SAELens's own files (SAE.load_from_disk reads them), raw activations in
    features.json                       every feature's row: frequency, top contexts, the tokens it pushes
    gptkit.json                         settings, metrics, each file's sha256 and its own, the weights it read
    features.html                       the rows as a page (analyze.py features writes it)
    training.pt                         while training: the state a stopped training continues from
    .features.lock                      held while analyze.py features works there (sae_lock)"""

import hashlib
import json
import math
import os
import re
import signal
import stat
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import accumulate
from operator import truediv
from pathlib import Path

import torch

from gptkit.base.errors import RunStopped, UserError, first_line, in_units
from gptkit.base.files import no_links, write_whole
from gptkit.base.locks import exclusive
from gptkit.base.signals import StopSignals
from gptkit.data.conversations import marker_name
from gptkit.interp.hooks import hook_points, hooked
from gptkit.run.checkpoint import COUNT, DICT, TENSOR, TEXT, TORCH_RANDOM, Each, Fields, Kind
from gptkit.run.run_folder import CHECKPOINT_CHOICE, remove_unused

SITES = {"resid_post": "hook_resid_post", "resid_mid": "hook_resid_mid", "mlp_out": "hook_mlp_out",
         "attn_out": "hook_attn_out"}
SAE_FORMAT = 2  # 2: gptkit.json holds its own sha256 and the iteration of the weights read; 1 is read too
MEASURE_WINDOWS = 32  # val windows a pass of the metrics and the contexts reads: memory stays that of these
WEIGHTS_FILE, CFG_FILE, OURS_FILE = "sae_weights.safetensors", "cfg.json", "gptkit.json"
TABLE_FILE, TRAINING_FILE, PAGE_FILE = "features.json", "training.pt", "features.html"
LOCK_FILE = ".features.lock"


def site_hook(model, layer, site):
    """The hook name of one site of one layer (blocks.2.hook_resid_post), or one line naming what is wrong."""
    L = model.config.n_layer
    if site not in SITES:
        raise UserError(f"unknown site {site!r}; choose one of {', '.join(SITES)}")
    if L == 0:
        raise UserError("this model has no layers (a bigram table): it has no site for features")
    if not 0 <= layer < L:
        raise UserError(f"layer {layer} is out of range: the model has {L} layer{'s' * (L > 1)}, 0 to {L - 1}")
    name = f"blocks.{layer}.{SITES[site]}"
    if name not in hook_points(model):
        raise UserError(f"this model has no {site} (it was built with mlp=False); choose resid_post or attn_out")
    return name


def weights_fingerprint(model):
    """sha256 of the model's weights: an SAE reads the activations of these weights and no others."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class StopAfter(Exception):
    """Raised by the hook of the site read: the layers after it have nothing to give."""


@torch.no_grad()
def site_activations(model, idx, hook, meanwhile=None):
    """The activation at hook for idx (B, T) as it arrives there: (B, T, d) in float32, the forward pass stopped
    right after it. meanwhile: a context (not yet entered) the pass runs in, entered once this read's hook is set,
    as the explorer's parts switched off: one at hook itself then acts after the read. idx goes where the model is,
    and the activation stays there."""
    kept = {}

    def keep(x, name):
        kept["x"] = x
        raise StopAfter

    with hooked(model, {hook: keep}), meanwhile or nullcontext():
        try:
            model(idx.to(next(model.parameters()).device))
        except StopAfter:
            pass
    return kept["x"].float()


class ActivationStream:
    """Activations at one hook point, (batch, d) at a time, from random windows of a split, through a shuffling
    buffer (neighbouring positions of one window are alike): never the whole stream in memory. Seeded; its state
    (the generator and the buffer) continues a stopped training exactly."""

    def __init__(self, model, split, hook, batch, buffer_windows=64, seed=0):
        self.model, self.split, self.hook, self.batch = model, split, hook, batch
        self.windows = buffer_windows
        self.generator = torch.Generator().manual_seed(seed)
        self.buffer = torch.empty(0)

    def refill(self):
        T = self.split.block_size
        offsets = torch.randint(0, self.split.length - T - 1, (self.windows,), generator=self.generator)
        idx, _ = self.split.batch(offsets, "cpu")
        fresh = site_activations(self.model, idx, self.hook).flatten(0, 1).cpu()  # the SAE trains on the CPU
        pool = torch.cat([self.buffer, fresh]) if self.buffer.numel() else fresh
        self.buffer = pool[torch.randperm(pool.size(0), generator=self.generator)]

    def next(self):
        # the buffer is kept at least twice a batch deep, so each batch mixes several refills' windows
        while self.buffer.size(0) < 2 * self.batch + self.windows * self.split.block_size // 2:
            self.refill()
        taken, self.buffer = self.buffer[:self.batch], self.buffer[self.batch:]
        return taken

    def state_dict(self):
        return {"generator": self.generator.get_state(), "buffer": self.buffer}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])
        self.buffer = state["buffer"]


@dataclass
class Metrics:
    l0: float
    explained_variance: float
    ce_loss_recovered: float
    delta_loss: float
    dead_fraction: float
    clean_loss: float
    spliced_loss: float
    zero_loss: float
    tokens: int
    notes: dict = field(default_factory=dict)  # why a figure that cannot be computed is missing, by its name

    def to_json(self):
        """The figures as JSON holds them: one that cannot be computed (NaN, infinite) is null, and "<name>_note"
        beside it says why."""
        out = {}
        for k, v in self.__dict__.items():
            if k == "notes":
                continue
            if finite(v):
                out[k] = round(v, 6) if isinstance(v, float) else v
            else:
                out[k], out[f"{k}_note"] = None, self.note(k)
        return out

    def note(self, name):
        return self.notes.get(name, "it is not a finite number: the activations or the losses are not")

    def shown(self, name, spec):
        """A figure as a line shows it: formatted by spec, or 'n/a (why)'."""
        value = getattr(self, name)
        return format(value, spec) if finite(value) else f"n/a ({self.note(name)})"


def spliced(sae, off=()):
    """A hook function that puts the SAE's reconstruction in place of the activation (with the features in off
    switched off first)."""
    def splice(x, name):
        values, indices = sae.encode_sparse(x.float().to(sae.W_dec.device))  # analyze.py's SAE is on the CPU
        if len(off):
            values = values.masked_fill(torch.isin(indices, torch.as_tensor(off, dtype=indices.dtype, device=indices.device)), 0.0)
        return sae.decode_sparse(values, indices).to(x.device, x.dtype)
    return splice


def features_off(sae, off):
    """A hook function that subtracts the decoded contribution of the features in off from the activation:
    each one's value times its decoder row, and nothing else (the rest of the activation, the SAE's error
    included, is kept)."""
    off = torch.as_tensor(sorted(set(off)), dtype=torch.long)

    def subtract(x, name):
        f = sae.encode(x.float().to(sae.W_dec.device))[..., off]  # (..., n) the switched-off features' values
        return (x.float() - (f @ sae.W_dec[off]).to(x.device)).to(x.dtype)
    return subtract


@torch.no_grad()
def measure(model, sae, hook, idx, targets, dead_fraction):
    """The standard metrics on val windows idx, targets (B, T): L0 and explained variance of the activations at
    hook; the loss clean, spliced (the reconstruction in place of the activation) and with the site zeroed; CE
    loss recovered = (zero - spliced) / (zero - clean); the loss splicing adds = spliced - clean. In chunks of
    MEASURE_WINDOWS windows, so that memory stays that of a chunk, summed in float64."""
    sums = torch.zeros(6, dtype=torch.float64)  # active, squared error, Σx² , clean, spliced, zeroed (token sums)
    total_x = torch.zeros(sae.d_in, dtype=torch.float64)
    device = next(model.parameters()).device
    for start in range(0, idx.size(0), MEASURE_WINDOWS):
        x_idx, y = idx[start:start + MEASURE_WINDOWS].to(device), targets[start:start + MEASURE_WINDOWS].to(device)
        x = site_activations(model, x_idx, hook).flatten(0, 1).to(sae.W_dec.device)
        values, indices = sae.encode_sparse(x)
        n = y.numel()
        losses = [model(x_idx, y)[1].item()]
        for replace in (spliced(sae), lambda a, name: torch.zeros_like(a)):
            with hooked(model, {hook: replace}):
                losses.append(model(x_idx, y)[1].item())
        sums += torch.tensor([(values > 0).sum().item(), (x - sae.decode_sparse(values, indices)).pow(2).sum().item(),
                              x.double().pow(2).sum().item(), *(loss * n for loss in losses)], dtype=torch.float64)
        total_x += x.double().sum(0)
    N = targets.numel()
    variance = (sums[2] - total_x.pow(2).sum() / N).item()  # Σ‖x − mean x‖²
    clean, spliced_loss, zero = (sums[3:] / N).tolist()
    notes = {}
    if variance <= 1e-9 * sums[2].item():  # what is left is rounding: the activations are one vector
        variance = float("nan")
        notes["explained_variance"] = (f"the activations at {hook} are the same at every token, so there is no "
                                       "variance to explain")
    if zero == clean:
        notes["ce_loss_recovered"] = f"zeroing {hook} leaves the loss as it is, so there is no loss to recover"
    return Metrics(sums[0].item() / N, 1 - sums[1].item() / variance, recovered(clean, spliced_loss, zero),
                   spliced_loss - clean, dead_fraction, clean, spliced_loss, zero, N, notes)


def recovered(clean, spliced_loss, zero):
    """CE loss recovered: 1 for a perfect reconstruction, 0 for one no better than zeroing the site."""
    return (zero - spliced_loss) / (zero - clean) if zero != clean else float("nan")


# ----------------------------------------------------------------------------- training


@dataclass(frozen=True)
class Recipe:
    """What an SAE is trained with: kept in its files, and a stopped training continues only with the same."""

    hook: str
    features: int
    k: int
    tokens: int
    batch: int
    lr: float
    seed: int

    @property
    def steps(self):
        return max(1, self.tokens // self.batch)

    @property
    def dead_after(self):
        """A feature that has not fired for this many activations is dead (and AuxK works on it): 1,000,000, or
        half of a shorter training."""
        return min(1_000_000, self.tokens // 2)


SAVE_EVERY_S = 30  # a stopped training loses at most this much


def free_memory():
    """Bytes of memory this machine has free now (Linux's MemAvailable), or None where it cannot tell."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(recipe, d_in, idx, vocab):
    """One line, before any work, where the SAE of recipe would not fit in the memory free (measured on the val
    windows idx). A feature takes its weights with their gradients, Adam's moments and the copies a save makes (12
    x d_in numbers), its row of the table (about 512 numbers' worth of Python text), and a row of the widest of a
    training step's (batch, features) tensors (6 of them), a measuring chunk's (its windows' tokens, features)
    ones (5) and the logit effects' (features, vocab) (2): within half of the peak measured either way."""
    free = free_memory()
    chunk = min(idx.size(0), MEASURE_WINDOWS) * idx.size(1)
    per_feature = 4 * (12 * d_in + 512 + max(6 * recipe.batch, 5 * chunk, 2 * vocab))
    need = recipe.features * per_feature
    if free is not None and need > free:
        largest = free // per_feature
        raise UserError(f"an SAE of {recipe.features:,} features on {recipe.hook} would need about "
                        f"{in_units(need)} of memory to train and measure, more than the {in_units(free)} free "
                        f"here; the largest --features that fits is about {largest:,}"
                        + (f", not above k={recipe.k}: lower --batch too" if largest <= recipe.k else ""))


def to_stderr(line):
    """A line about the work, on stderr: stdout holds the answer alone (JSON under --json)."""
    print(line, file=sys.stderr, flush=True)


def train_sae(model, split, recipe, folder, weights, say=to_stderr):
    """Train an SAE on recipe.tokens activations at recipe.hook, streamed from split; continue one stopped
    earlier (training.pt in folder) with the same recipe on the same weights (weights: weights_of the run).
    (the SAE, made to read raw activations; the scale it was trained at; the Trainer)."""
    from gptkit.interp.sae import SparseAutoencoder, Trainer, activation_scale
    from gptkit.run.checkpoint import save_checkpoint

    torch.manual_seed(recipe.seed)
    stream = ActivationStream(model, split, recipe.hook, recipe.batch, seed=recipe.seed)
    first = stream.next()
    sae = SparseAutoencoder(first.size(-1), recipe.features, recipe.k, torch.Generator().manual_seed(recipe.seed))
    trainer, scale = Trainer(sae, recipe.lr, recipe.steps, recipe.dead_after), activation_scale(first)
    with torch.no_grad():
        sae.b_dec.copy_(first.mean(0) * scale)  # the decoder's bias starts at the data's centre
    state_path = folder / TRAINING_FILE
    state = stopped_training(state_path, recipe, weights, say)
    if state is not None:
        scale = resumed(state_path, state, sae, trainer, stream)
        say(f"continuing the stopped training at step {trainer.step:,} of {recipe.steps:,}")
    bar, saved = progress(recipe, trainer.step), time.time()
    # a stop signal (Ctrl-C, SIGTERM) is seen between steps: the step finishes, and the state after it is saved
    with StopSignals() as stop, stop.deferred():
        while trainer.step < recipe.steps:
            mse, unexplained = trainer.train_step(stream.next() * scale)
            bar.update(1)
            if trainer.step % 50 == 0:
                bar.set_postfix_str(f"explained variance {1 - unexplained:.3f}, dead {trainer.dead_fraction():.1%}")
            # the last step's state too: a stop while the SAE is measured and saved, after, loses no training
            if stop.signum or time.time() - saved > SAVE_EVERY_S or trainer.step == recipe.steps:
                save_checkpoint({"sae": sae.state_dict(), "trainer": trainer.state_dict(),
                                 "stream": stream.state_dict(), "scale": scale, "recipe": recipe.__dict__,
                                 "weights": weights}, state_path)
                saved = time.time()
            if stop.signum:
                bar.close()
                raise RunStopped(f"stopped by {signal.Signals(stop.signum).name} at step {trainer.step:,} of "
                                 f"{recipe.steps:,}, saved in {state_path}; the same command continues from there",
                                 stop.signum)
    bar.close()
    sae.fold_scale(scale)
    return sae.eval().requires_grad_(False), scale, trainer


def stopped_training(path, recipe, weights, say):
    """The state of a training stopped earlier at path, to continue: None where there is none, and where it read
    other weights than `weights` (it starts again, and one line says why). One line where its settings differ."""
    from gptkit.run.checkpoint import load_checkpoint

    if not is_kept(path):
        return None
    state = load_checkpoint(path, required=TRAINING_STATE)
    if state["recipe"] != recipe.__dict__:
        raise UserError(f"{path} is a stopped training with other settings; continue it with those, or pass "
                        "--start_over=True")
    why = other_weights(state.get("weights", {}), weights, f"the stopped training in {path}")
    if why:
        say(f"note: {why}; starting it again on these weights")
        return None
    return state


def continues_exactly(path, recipe, weights):
    """Whether path holds a stopped training of recipe on weights, which --start_over=True continues rather than
    deletes: continued, it ends at the weights a training from the start would, sooner, and the command that
    stopped it, --start_over included, is the one its line says to run again."""
    try:
        return stopped_training(path, recipe, weights, say=lambda line: None) is not None
    except UserError:  # damaged, or of other settings: starting over is what is asked
        return False


def resumed(path, state, sae, trainer, stream):
    """A stopped training's state put into sae, trainer and stream: its scale. One line where it does not fit."""
    try:
        counts = state["trainer"]["since_fired"]
        for name, tensor in [*state["sae"].items(), ("the dead features' counts", counts)]:
            if not tensor.isfinite().all():
                raise ValueError(f"{name} holds numbers that are not finite")
        if counts.shape != (sae.d_sae,) or state["trainer"]["step"] > trainer.steps:
            raise ValueError("its step or its dead features' counts do not fit its settings")
        if state["stream"]["buffer"].numel() and state["stream"]["buffer"].size(-1) != sae.d_in:
            raise ValueError("its buffered activations are not of this site's width")
        sae.load_state_dict(state["sae"])
        trainer.load_state_dict(state["trainer"])
        stream.load_state_dict(state["stream"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(f"{path} cannot be continued ({first_line(e)}); pass --start_over=True to train from the "
                        "start") from None
    return state["scale"]


def progress(recipe, done):
    from gptkit.base.progress import progress as bar

    return bar(total=recipe.steps, initial=done, desc=f"training an SAE on {recipe.hook}", unit="step")


# ----------------------------------------------------------------------------- the weights it reads


def sae_folder(out_dir, hook, checkpoint="best"):
    """The folder of the SAE at hook that reads one checkpoint's weights: out_dir/sae/<hook>/ for best.pt's (the
    one a plain command and the explorer read), out_dir/sae/latest/<hook>/ for latest.pt's and
    out_dir/sae/iter_N/<hook>/ for a snapshot's: side by side, none in another's place."""
    base = Path(out_dir) / "sae"
    folder = base / hook if checkpoint == "best" else base / checkpoint.replace(":", "_") / hook
    for part in accumulate(folder.relative_to(base).parts, truediv, initial=base):  # base, then each folder in it
        if part.is_symlink():  # an SAE written there would land in the folder it points at, another run's maybe
            raise UserError(f"{part} is a link; an SAE's files are kept in its run's own folder, never read or "
                            "written through a link: remove it")
    return folder


@contextmanager
def sae_lock(folder):
    """Held while analyze.py features trains an SAE in folder, saves it and writes its page: a second one on the
    same folder stops at once with one line, rather than both training and each writing its files over the
    other's. The folders made for the lock go again where nothing else was written there (a refusal)."""
    made, at = [], folder.absolute()
    while not at.exists() and not at.is_symlink():
        made, at = [*made, at], at.parent
    lock = folder / LOCK_FILE
    with exclusive(lock, f"cannot write the SAE to {folder}",
                   lambda holder: f"{folder} is in use by another analyze.py features{holder}; wait for it to end",
                   opener=no_links):
        try:
            yield
        finally:
            if made and folder.is_dir() and [p.name for p in folder.iterdir()] == [LOCK_FILE]:
                remove_unused(made, lock)


def checkpoint_name(checkpoint):
    """A checkpoint as a line names it: 'best.pt', 'latest.pt', 'the snapshot of iteration 50'."""
    return f"the snapshot of iteration {checkpoint[5:]}" if checkpoint.startswith("iter:") else f"{checkpoint}.pt"


def weights_of(run):
    """What an SAE keeps of the weights it reads, a Run's: their fingerprint, the checkpoint they were opened
    from ('best', 'latest', 'iter:N') and the iteration they are of."""
    return {"run_weights": weights_fingerprint(run.model), "checkpoint": run.checkpoint,
            "iteration": run.iteration}


def other_weights(saved, now, what):
    """None where `saved` (weights_of's dict, as a file kept it) is the weights `now`; else why not, in words that
    name the checkpoint each belongs to. what: who read `saved` ('the SAE in out/sae/...')."""
    if saved.get("run_weights") == now["run_weights"]:
        return None
    theirs, then, later = saved.get("checkpoint", "best"), saved.get("iteration"), now["iteration"]
    if theirs != now["checkpoint"]:
        return (f"{what} belongs to {checkpoint_name(theirs)} (--checkpoint={theirs}), not to "
                f"{checkpoint_name(now['checkpoint'])}")
    if then is not None and later is not None and then != later:
        return (f"{what} was trained on {checkpoint_name(theirs)} as it was at iteration {then:,}; it now holds "
                f"iteration {later:,}'s weights")
    return (f"{what} was trained on other weights than this run's checkpoint, {checkpoint_name(theirs)} (the run "
            "was trained again from the start, or the files copied from another run)")


# ----------------------------------------------------------------------------- the files


def finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def exactly(value):
    return Kind(repr(value), lambda v: type(v) is type(value) and v == value)


WHOLE = Kind("a whole number of at least 1", lambda v: type(v) is int and v >= 1)
SHARE = Kind("a number from 0 to 1", lambda v: finite(v) and 0 <= v <= 1)
POSITIVE = Kind("a finite number above 0", lambda v: finite(v) and v > 0)
FIGURE = Kind("a finite number, or null", lambda v: v is None or finite(v))
SHA256 = Kind("a sha256 (64 hexadecimal digits)", lambda v: isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v))
FIGURES = ("l0", "explained_variance", "ce_loss_recovered", "delta_loss", "clean_loss", "spliced_loss",
           "zero_loss")
CHECKPOINT = Kind("'best', 'latest' or 'iter:N'", lambda v: isinstance(v, str) and CHECKPOINT_CHOICE.fullmatch(v))
ITERATION = Kind("a whole number, or null", lambda v: v is None or type(v) is int and v >= 0)
CHECKED_FILES = (WEIGHTS_FILE, CFG_FILE, TABLE_FILE)  # those gptkit.json holds the sha256 of
SAVED_FILES = (*CHECKED_FILES, PAGE_FILE)  # what a trained SAE leaves beside gptkit.json, which claims them
# what a reader uses of each file, and what each value must be (gptkit/run/checkpoint.py's Fields)
OURS = Fields({
    "format": Kind(f"a format this tool reads, 1 to {SAE_FORMAT}",
                   lambda v: type(v) is int and 1 <= v <= SAE_FORMAT),
    "hook": TEXT,
    "files": Fields({name: SHA256 for name in CHECKED_FILES}),
    "metrics": Fields({**{name: FIGURE for name in FIGURES}, **{f"{name}_note": TEXT for name in FIGURES},
                       "dead_fraction": SHARE, "tokens": COUNT}, optional=[f"{name}_note" for name in FIGURES]),
    "run_weights": SHA256,
    "recipe": Fields({"hook": TEXT, "features": WHOLE, "k": WHOLE, "tokens": WHOLE, "batch": WHOLE,
                      "lr": POSITIVE, "seed": Kind("a whole number", lambda v: type(v) is int)}),
    "scale": POSITIVE,
    "checkpoint": CHECKPOINT,
    "iteration": ITERATION,
    "checksum": SHA256,
}, optional=("recipe", "scale", "checkpoint", "iteration", "checksum"))
CFG = Fields({"d_in": WHOLE, "d_sae": WHOLE, "k": WHOLE, "architecture": exactly("topk"),
              "apply_b_dec_to_input": exactly(True), "normalize_activations": exactly("none"),
              "dtype": exactly("float32"), "metadata": Fields({"hook_name": TEXT})})
CONTEXT = Kind("[before, token, after, value]", lambda c: isinstance(c, list) and len(c) == 4 and finite(c[3])
               and all(isinstance(t, str) for t in c[:3]))
ROWS = Each(Fields({"index": Kind("a whole number", lambda v: type(v) is int), "frequency": SHARE,
                    "contexts": Each(CONTEXT), "promotes": Each(TEXT), "demotes": Each(TEXT)}))
TRAINING_STATE = Fields({
    "sae": Each(TENSOR, keyed=True),
    "trainer": Fields({"opt": DICT, "step": COUNT, "since_fired": TENSOR}),
    "stream": Fields({"generator": TORCH_RANDOM, "buffer": TENSOR}),
    "scale": POSITIVE, "recipe": DICT,
    "weights": Fields({"run_weights": SHA256, "checkpoint": CHECKPOINT, "iteration": ITERATION}),
}, optional=("weights",))
AGAIN = "train the SAE again with --start_over=True"


def is_kept(path):
    """Whether one of an SAE's files is at path. One line where a link, a pipe, a device or a folder is at its
    name: never followed, never read (a pipe would hang its reader)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e})") from None
    if stat.S_ISLNK(mode):
        raise UserError(f"{path} is a link; an SAE's files are its own, never read or written through a link: "
                        "remove it")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path} is not a regular file (a pipe, a device or a folder); remove it")
    return True


def unclaimed_files(folder):
    """The files at the names an SAE saves in folder where no gptkit.json claims them: another tool's SAE (SAELens
    writes cfg.json and sae_weights.safetensors too), or one whose gptkit.json was deleted. [] where it is there."""
    if is_kept(folder / OURS_FILE):
        return []
    return [name for name in SAVED_FILES if is_kept(folder / name)]


def refuse_unclaimed(folder):
    """One line where folder holds files no gptkit.json claims: the user's, never replaced without --start_over."""
    found = unclaimed_files(folder)
    if found:
        raise UserError(f"{folder} holds {', '.join(found)} but no {OURS_FILE}: not an SAE this tool saved, or one "
                        f"whose {OURS_FILE} was deleted; move them elsewhere, or pass --start_over=True to replace "
                        "them")


def kept_bytes(path):
    """The bytes of one of an SAE's files (is_kept), None where there is none."""
    if not is_kept(path):
        return None
    try:
        with open(path, "rb", opener=no_links) as f:
            return f.read()
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e})") from None


def problem_in(value, kinds, where=""):
    """What in value is not as kinds (a Fields or an Each) has it, in words, or None."""
    problem = kinds.problem(value, where)
    return "it" + problem if problem and problem.startswith(" ") else problem  # the file itself: "it has no k"


def damaged(path, problem):
    return UserError(f"{path} is damaged: {problem}; {AGAIN}")


def parsed_json(path, blob):
    try:
        return json.loads(blob.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # not UTF-8 (a ValueError too), not JSON, nested past reading
        raise damaged(path, first_line(e)) from None


def own_checksum(ours):
    """The sha256 gptkit.json holds of the rest of itself: an edit to its settings or metrics is told."""
    rest = {k: v for k, v in ours.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def read_ours(folder):
    """gptkit.json of an SAE folder, checked (ours_problem). None where there is none; one line where it is
    damaged."""
    path = folder / OURS_FILE
    blob = kept_bytes(path)
    if blob is None:
        return None
    ours = parsed_json(path, blob)
    problem = ours_problem(ours, folder.name)
    if problem:
        raise damaged(path, problem)
    return ours


def ours_problem(ours, hook):
    """What is wrong with gptkit.json's content in the folder of hook, or None: its fields each of its kind, the
    files it names the SAE's own, its hook the folder's, its content as saved (its own checksum), and its recipe
    one analyze.py trains."""
    problem = problem_in(ours, OURS)
    if problem:
        return problem
    others = sorted(set(ours["files"]) - set(CHECKED_FILES))
    if others:
        return f"its files name {others[0]!r}, not one of the SAE's own"
    if ours["hook"] != hook:
        return f"it is the SAE of {ours['hook']!r}, in the folder of {hook!r}"
    if ours["format"] >= 2 and ours.get("checksum") != own_checksum(ours):
        return "it was edited (its checksum differs from the one saved with it)"
    r = ours.get("recipe")
    if r and (r["hook"] != hook or r["k"] >= r["features"] or r["tokens"] < r["batch"]):
        return "its recipe is not one analyze.py trains (of its hook, k below features, a batch or more)"
    return None


def checked_blob(path, digest):
    """A file of the SAE as gptkit.json recorded it (its sha256), or one line."""
    blob = kept_bytes(path)
    if blob is None:
        raise UserError(f"{path} is missing; {AGAIN}")
    if hashlib.sha256(blob).hexdigest() != digest:
        raise UserError(f"{path} is damaged or was edited (its checksum differs from the one saved with it); "
                        f"{AGAIN}")
    return blob


def checked_cfg(path, blob, ours, width):
    """cfg.json as save_sae writes it: a TopK SAE of this hook reading `width` numbers, k below d_sae, and the
    recipe's features and k."""
    cfg = parsed_json(path, blob)
    problem = problem_in(cfg, CFG)
    if problem is None:
        recipe = ours.get("recipe", {"features": cfg["d_sae"], "k": cfg["k"]})
        if cfg["k"] >= cfg["d_sae"]:
            problem = f"k is {cfg['k']}, not below d_sae ({cfg['d_sae']})"
        elif cfg["d_in"] != width:
            problem = f"d_in is {cfg['d_in']}, not the model's width at the hook ({width})"
        elif cfg["metadata"]["hook_name"] != ours["hook"]:
            problem = f"its hook is {cfg['metadata']['hook_name']!r}, not {ours['hook']!r}"
        elif (cfg["d_sae"], cfg["k"]) != (recipe["features"], recipe["k"]):
            problem = f"d_sae and k are {cfg['d_sae']} and {cfg['k']}, not the recipe's in {OURS_FILE}"
    if problem:
        raise damaged(path, problem)
    return cfg


def checked_weights(path, blob, cfg):
    """The SAE's tensors, each float32 of its shape and finite, or one line."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        state = load(blob)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise damaged(path, first_line(e)) from None
    d_in, d_sae = cfg["d_in"], cfg["d_sae"]
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    if set(state) != set(shapes):
        raise damaged(path, f"it holds {', '.join(sorted(state)) or 'nothing'}, not {', '.join(shapes)}")
    for name, shape in shapes.items():
        t = state[name]
        if t.dtype != torch.float32 or tuple(t.shape) != shape:
            raise damaged(path, f"{name} is {str(t.dtype)[6:]} {tuple(t.shape)}, not float32 {shape}")
        if not t.isfinite().all():
            raise damaged(path, f"{name} holds numbers that are not finite (NaN or infinity)")
    return state


def checked_table(path, blob, d_sae):
    """features.json's rows as feature_rows writes them, each of a feature below d_sae, once."""
    table = parsed_json(path, blob)
    problem = problem_in(table, ROWS, "rows")
    if problem is None:
        indices = [row["index"] for row in table]
        if not all(0 <= i < d_sae for i in indices) or len(set(indices)) != len(indices):
            problem = f"its rows are not of distinct features 0 to {d_sae - 1}"
    if problem:
        raise damaged(path, problem)
    return table


def sae_lens_cfg(sae, hook, run_name):
    """cfg.json as SAELens 6 writes it for a TopKSAE (architecture 'topk'), raw activations in and out."""
    return {"d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
            "normalize_activations": "none", "reshape_activations": "none", "k": sae.k,
            "rescale_acts_by_decoder_norm": False, "architecture": "topk",
            "metadata": {"hook_name": hook, "model_name": run_name}}


def save_sae(folder, sae, hook, run_name, ours, table=()):
    """The SAE in SAELens's files, features.json with every feature's row (feature_rows), and gptkit.json with
    ours (settings, metrics, weights_of the run), the sha256 of each and its own: written whole, never through a
    link."""
    from safetensors.torch import save

    blobs = {WEIGHTS_FILE: save({name: p.detach().contiguous() for name, p in sae.state_dict().items()}),
             CFG_FILE: (json.dumps(sae_lens_cfg(sae, hook, run_name), indent=1) + "\n").encode(),
             TABLE_FILE: json.dumps(list(table), ensure_ascii=False).encode()}
    for name, blob in blobs.items():
        write_whole(folder / name, blob)
    ours = dict(ours, format=SAE_FORMAT, hook=hook, files={name: hashlib.sha256(blob).hexdigest()
                                                            for name, blob in blobs.items()})
    write_whole(folder / OURS_FILE, json.dumps(dict(ours, checksum=own_checksum(ours)), indent=1,
                                               ensure_ascii=False) + "\n")


def load_sae(folder, run):
    """The SAE saved in folder for run (a Run: its weights, and the checkpoint they are), every file checked
    (gptkit.json's fields, the sha256 it holds of the others, their shapes and values) and the weights it read.
    (SparseAutoencoder, gptkit.json's content, features.json's rows), each read from the bytes checked."""
    from gptkit.interp.sae import SparseAutoencoder

    ours = read_ours(folder)
    if ours is None:
        at = "" if run.checkpoint == "best" else f" --checkpoint={run.checkpoint}"
        raise UserError(f"no SAE in {folder}; train one with `python analyze.py features ...{at}`")
    blobs = {name: checked_blob(folder / name, digest) for name, digest in ours["files"].items()}
    cfg = checked_cfg(folder / CFG_FILE, blobs[CFG_FILE], ours, run.config.n_embd)
    state = checked_weights(folder / WEIGHTS_FILE, blobs[WEIGHTS_FILE], cfg)
    table = checked_table(folder / TABLE_FILE, blobs[TABLE_FILE], cfg["d_sae"])
    refuse_other_weights(folder, ours, run)
    sae = SparseAutoencoder(cfg["d_in"], cfg["d_sae"], cfg["k"])
    sae.load_state_dict(state)
    return sae.eval().requires_grad_(False), ours, table


def refuse_other_weights(folder, ours, run):
    """One line where the SAE in folder (gptkit.json's content ours) read other weights than run's, naming whose
    they are and the way on."""
    why = other_weights(ours, weights_of(run), f"the SAE in {folder}")
    if why is None:
        return
    theirs = ours.get("checkpoint", "best")
    home = sae_folder(run.out_dir, ours["hook"], theirs)
    if theirs == run.checkpoint:
        raise UserError(f"{why}; train it again on these weights with --start_over=True")
    if home == folder:
        raise UserError(f"{why}: read it with that checkpoint's weights")
    raise UserError(f"{why}: move it to {home}, where that checkpoint's SAE is read, or train one on these weights "
                    "with --start_over=True")


# ----------------------------------------------------------------------------- from Python


class Features:
    """The SAE trained on a run at one hook point, as the API gives it: encode and decode, each feature's top
    contexts, frequency and logit effect (`table`), and the metrics it was saved with."""

    def __init__(self, sae, hook, ours, table):
        self.sae, self.hook, self.metrics, self.table = sae, hook, ours["metrics"], table

    @classmethod
    def of(cls, run, hook):
        if not isinstance(hook, str) or hook not in hook_points(run.model):
            raise UserError(f"features are read at a hook point of the model, e.g. 'blocks.0.hook_resid_post'; got "
                            f"{str(hook)[:60]!r}")
        sae, ours, table = load_sae(sae_folder(run.out_dir, hook, run.checkpoint), run)
        return cls(sae, hook, ours, table)

    @property
    def d_sae(self):
        return self.sae.d_sae

    def encode(self, x):
        """Every feature's activation for activations x (..., d_in) at the hook: (..., d_sae), all but k zero."""
        return self.sae.encode(numbers(x, "activations").to(self.sae.W_dec.device))

    def decode(self, f):
        """The activation (..., d_in) features f (..., d_sae) write."""
        return self.sae.decode(numbers(f, "feature values").to(self.sae.W_dec.device))

    def indices(self, off):
        """Feature indices, checked: whole numbers below d_sae, one or a list."""
        listed = [off] if isinstance(off, int) else off
        if not isinstance(listed, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                             for i in listed):
            raise UserError(f"features are given by index, a whole number or a list of them; got {str(off)[:60]}")
        bad = [i for i in listed if not 0 <= i < self.d_sae]
        if bad:
            raise UserError(f"feature {bad[0]} is out of range: the SAE at {self.hook} has features 0 to "
                            f"{self.d_sae - 1}")
        return sorted(set(listed))


def numbers(x, what):
    """x (a tensor, an array, nested lists) as a float32 tensor, or one line."""
    try:
        x = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        raise UserError(f"{what} are numbers (a tensor, an array or nested lists); got a "
                        f"{type(x).__name__}") from None
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise UserError(f"{what} are real numbers; got a tensor of {str(x.dtype)[6:]}")
    return x.float()


def feature_hooks(run, features):
    """[(hook, function, label)] switching off features given as {hook: [index, ...]} (None: none)."""
    if not features:
        return []
    if not isinstance(features, dict):
        raise UserError("features to switch off are given as {hook: [index, ...]}, e.g. "
                        "{'blocks.2.hook_resid_post': [12]}")
    out = []
    for hook, off in features.items():
        f = run.features(hook)
        indices = f.indices(off)
        out.append((hook, features_off(f.sae, indices), ", ".join(f"{hook} F{i}" for i in indices)))
    return out


# ----------------------------------------------------------------------------- what each feature is


@torch.no_grad()
def top_contexts(model, sae, hook, idx, n_top):
    """Each feature's n_top strongest activations over the windows idx (B, T): (values, flat positions), each
    (d_sae, n_top), and how often each fires (a share of the tokens)."""
    B, T = idx.shape
    best_v = torch.full((sae.d_sae, n_top), -1.0)
    best_p = torch.zeros(sae.d_sae, n_top, dtype=torch.long)
    fires = torch.zeros(sae.d_sae)
    for start in range(0, B, MEASURE_WINDOWS):
        x = site_activations(model, idx[start:start + MEASURE_WINDOWS], hook).to(sae.W_dec.device)
        f = sae.encode(x).flatten(0, 1)  # (n, d_sae)
        fires += (f > 0).sum(0)
        positions = torch.arange(start * T, start * T + f.size(0)).expand(sae.d_sae, -1)
        v = torch.cat([best_v, f.T], 1)
        p = torch.cat([best_p, positions], 1)
        best_v, order = v.topk(n_top, dim=1)
        best_p = p.gather(1, order)
    return best_v, best_p, fires / (B * T)


def logit_effects(model, sae, n, vocab):
    """Each feature's decoder direction through the final norm's scale and the unembedding: ([n promoted token
    ids], [n demoted]) a feature, among the tokenizer's `vocab` (a padded vocabulary's rest is no token): the logit
    lens of one direction."""
    ln = model.transformer.ln_f
    direction = sae.W_dec.to(model.lm_head.weight.device) * (ln.weight if ln.weight is not None else 1.0)
    logits = direction @ model.lm_head.weight[:vocab].T  # (d_sae, vocab)
    return logits.topk(n, dim=1).indices.tolist(), (-logits).topk(n, dim=1).indices.tolist()


def token_text(tok, token):
    """A token's text as a feature's rows show it: a chat model's marker by its name (<|user|>), not its private-use
    character, which no font draws."""
    text = tok.decode([token])
    return marker_name(tok, text) or text


def context_of(tok, idx, position, width):
    """(before, the token, after) around a flat position of idx (B, T), width tokens either side, within its
    window."""
    row, t = divmod(position, idx.size(1))
    start = max(0, t - width)
    text = [token_text(tok, i) for i in idx[row, start:t + 1 + width].tolist()]  # the tokens shown, decoded once
    return "".join(text[:t - start]), text[t - start], "".join(text[t - start + 1:])


def feature_rows(model, tok, sae, hook, idx, count, n_contexts=4, width=12):
    """The `count` most frequent features, each a dict: index, frequency, contexts ([before, token, after,
    value]), promotes and demotes (tokens)."""
    values, positions, frequency = top_contexts(model, sae, hook, idx, n_contexts)
    promotes, demotes = logit_effects(model, sae, 5, tok.vocab_size)
    order = frequency.argsort(descending=True)[:count].tolist()
    return [{"index": i, "frequency": round(frequency[i].item(), 6),
             "contexts": [[*context_of(tok, idx, p, width), round(v, 4)]
                          for v, p in zip(values[i].tolist(), positions[i].tolist()) if v > 0],
             "promotes": [token_text(tok, t) for t in promotes[i]], "demotes": [token_text(tok, t) for t in demotes[i]]}
            for i in order]


