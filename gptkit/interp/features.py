"""The features of a trained run: a sparse autoencoder (gptkit/interp/sae.py) trained on one hook point's
activations over the run's own train split, kept in the run folder in SAELens's file format, and read back: the
standard metrics (L0, explained variance, CE loss recovered, the loss splicing adds, dead features), each
feature's top contexts, frequency and logit effect, and features switched off in the forward pass.

The folder of an SAE, out_dir/sae/<hook name>/:
    cfg.json, sae_weights.safetensors   SAELens's own files (SAE.load_from_disk reads them), raw activations in
    features.json                       every feature's row: frequency, top contexts, the tokens it pushes
    gptkit.json                         settings, metrics, each file's sha256, and the run's weights it read
    features.html                       the rows as a page (analyze.py features writes it)
    training.pt                         while training: the state a stopped training continues from"""

import hashlib
import json
import signal
import sys
import time
from dataclasses import dataclass

import torch

from gptkit.base.errors import RunStopped, UserError, first_line
from gptkit.base.files import write_whole
from gptkit.base.signals import StopSignals
from gptkit.interp.hooks import hook_points, hooked

SITES = {"resid_post": "hook_resid_post", "resid_mid": "hook_resid_mid", "mlp_out": "hook_mlp_out",
         "attn_out": "hook_attn_out"}
SAE_FORMAT = 1
MEASURE_WINDOWS = 32  # val windows a pass of the metrics and the contexts reads: memory stays that of these
WEIGHTS_FILE, CFG_FILE, OURS_FILE = "sae_weights.safetensors", "cfg.json", "gptkit.json"
TABLE_FILE, TRAINING_FILE = "features.json", "training.pt"


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
def site_activations(model, idx, hook):
    """The activation at hook for idx (B, T): (B, T, d), the forward pass stopped right after it."""
    kept = {}

    def keep(x, name):
        kept["x"] = x
        raise StopAfter

    with hooked(model, {hook: keep}):
        try:
            model(idx)
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
        fresh = site_activations(self.model, idx, self.hook).flatten(0, 1)
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

    def to_json(self):
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def spliced(sae, off=()):
    """A hook function that puts the SAE's reconstruction in place of the activation (with the features in off
    switched off first)."""
    def splice(x, name):
        values, indices = sae.encode_sparse(x.float())
        if len(off):
            values = values.masked_fill(torch.isin(indices, torch.as_tensor(off, dtype=indices.dtype)), 0.0)
        return sae.decode_sparse(values, indices).to(x.dtype)
    return splice


def features_off(sae, off):
    """A hook function that subtracts the decoded contribution of the features in off from the activation:
    each one's value times its decoder row, and nothing else (the rest of the activation, the SAE's error
    included, is kept)."""
    off = torch.as_tensor(sorted(set(off)), dtype=torch.long)

    def subtract(x, name):
        f = sae.encode(x.float())[..., off]  # (..., n) the switched-off features' values
        return (x.float() - f @ sae.W_dec[off]).to(x.dtype)
    return subtract


@torch.no_grad()
def measure(model, sae, hook, idx, targets, dead_fraction):
    """The standard metrics on val windows idx, targets (B, T): L0 and explained variance of the activations at
    hook; the loss clean, spliced (the reconstruction in place of the activation) and with the site zeroed; CE
    loss recovered = (zero - spliced) / (zero - clean); the loss splicing adds = spliced - clean. In chunks of
    MEASURE_WINDOWS windows, so that memory stays that of a chunk, summed in float64."""
    sums = torch.zeros(6, dtype=torch.float64)  # active, squared error, Σx² , clean, spliced, zeroed (token sums)
    total_x = torch.zeros(sae.d_in, dtype=torch.float64)
    for start in range(0, idx.size(0), MEASURE_WINDOWS):
        x_idx, y = idx[start:start + MEASURE_WINDOWS], targets[start:start + MEASURE_WINDOWS]
        x = site_activations(model, x_idx, hook).flatten(0, 1)
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
    variance = sums[2] - total_x.pow(2).sum() / N  # Σ‖x − mean x‖²
    clean, spliced_loss, zero = (sums[3:] / N).tolist()
    return Metrics(sums[0].item() / N, 1 - (sums[1] / variance).item(), recovered(clean, spliced_loss, zero),
                   spliced_loss - clean, dead_fraction, clean, spliced_loss, zero, N)


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


def train_sae(model, split, recipe, folder, say=print):
    """Train an SAE on recipe.tokens activations at recipe.hook, streamed from split; continue one stopped
    earlier with the same recipe (training.pt in folder). (the SAE, made to read raw activations; the scale it
    was trained at; the Trainer)."""
    from gptkit.base.files import refuse_link
    from gptkit.interp.sae import SparseAutoencoder, Trainer, activation_scale
    from gptkit.run.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(recipe.seed)
    stream = ActivationStream(model, split, recipe.hook, recipe.batch, seed=recipe.seed)
    first = stream.next()
    sae = SparseAutoencoder(first.size(-1), recipe.features, recipe.k, torch.Generator().manual_seed(recipe.seed))
    trainer, scale = Trainer(sae, recipe.lr, recipe.steps, recipe.dead_after), activation_scale(first)
    with torch.no_grad():
        sae.b_dec.copy_(first.mean(0) * scale)  # the decoder's bias starts at the data's centre
    state_path = folder / TRAINING_FILE
    refuse_link(state_path)
    if state_path.exists():
        state = load_checkpoint(state_path)
        if state.get("recipe") != recipe.__dict__:
            raise UserError(f"{state_path} is a stopped training with other settings; continue it with those, or "
                            "pass --start_over=True")
        sae.load_state_dict(state["sae"])
        trainer.load_state_dict(state["trainer"])
        stream.load_state_dict(state["stream"])
        scale = state["scale"]
        say(f"continuing the stopped training at step {trainer.step:,} of {recipe.steps:,}")
    bar, saved = progress(recipe, trainer.step), time.time()
    # a stop signal (Ctrl-C, SIGTERM) is seen between steps: the step finishes, and the state after it is saved
    with StopSignals() as stop, stop.deferred():
        while trainer.step < recipe.steps:
            mse, unexplained = trainer.train_step(stream.next() * scale)
            bar.update(1)
            if trainer.step % 50 == 0:
                bar.set_postfix_str(f"explained variance {1 - unexplained:.3f}, dead {trainer.dead_fraction():.1%}")
            if stop.signum or time.time() - saved > SAVE_EVERY_S and trainer.step < recipe.steps:
                save_training(save_checkpoint, state_path, sae, trainer, stream, scale, recipe)
                saved = time.time()
            if stop.signum:
                bar.close()
                raise RunStopped(f"stopped by {signal.Signals(stop.signum).name} at step {trainer.step:,} of "
                                 f"{recipe.steps:,}, saved in {state_path}; the same command continues from there",
                                 stop.signum)
    bar.close()
    sae.fold_scale(scale)
    return sae.eval().requires_grad_(False), scale, trainer


def save_training(save_checkpoint, path, sae, trainer, stream, scale, recipe):
    save_checkpoint({"sae": sae.state_dict(), "trainer": trainer.state_dict(), "stream": stream.state_dict(),
                     "scale": scale, "recipe": recipe.__dict__}, path)


def progress(recipe, done):
    from tqdm import tqdm

    return tqdm(total=recipe.steps, initial=done, desc=f"training an SAE on {recipe.hook}", unit="step",
                file=sys.stderr, disable=not sys.stderr.isatty(), dynamic_ncols=True)


# ----------------------------------------------------------------------------- the files


def sae_lens_cfg(sae, hook, run_name):
    """cfg.json as SAELens 6 writes it for a TopKSAE (architecture 'topk'), raw activations in and out."""
    return {"d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
            "normalize_activations": "none", "reshape_activations": "none", "k": sae.k,
            "rescale_acts_by_decoder_norm": False, "architecture": "topk",
            "metadata": {"hook_name": hook, "model_name": run_name}}


def save_sae(folder, sae, hook, run_name, ours, table=()):
    """The SAE in SAELens's files, features.json with every feature's row (feature_rows), and gptkit.json with
    ours (settings, metrics, the run's fingerprint) and the sha256 of each: written whole, never through a link."""
    from safetensors.torch import save

    blobs = {WEIGHTS_FILE: save({name: p.detach().contiguous() for name, p in sae.state_dict().items()}),
             CFG_FILE: (json.dumps(sae_lens_cfg(sae, hook, run_name), indent=1) + "\n").encode(),
             TABLE_FILE: json.dumps(list(table), ensure_ascii=False).encode()}
    for name, blob in blobs.items():
        write_whole(folder / name, blob)
    files = {name: hashlib.sha256(blob).hexdigest() for name, blob in blobs.items()}
    write_whole(folder / OURS_FILE, json.dumps(dict(ours, format=SAE_FORMAT, hook=hook, files=files), indent=1,
                                               ensure_ascii=False) + "\n")


def read_ours(folder):
    """gptkit.json of an SAE folder, or None where there is none; one line where it is damaged."""
    path = folder / OURS_FILE
    if not path.exists():
        return None
    try:
        ours = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(ours, dict) and isinstance(ours.get("files"), dict)
    except (ValueError, AssertionError, RecursionError) as e:
        raise UserError(f"{path} is damaged ({first_line(e)}); train the SAE again with --start_over=True") from None
    return ours


def load_sae(folder, model):
    """The SAE saved in folder, checked: its files as gptkit.json recorded them, and read from these weights.
    (SparseAutoencoder, gptkit.json's content, features.json's rows), each read from the bytes checked."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    from gptkit.interp.sae import SparseAutoencoder

    ours = read_ours(folder)
    if ours is None or not (folder / WEIGHTS_FILE).exists():
        raise UserError(f"no SAE in {folder}; train one with `python analyze.py features ...`")
    again = "train it again with --start_over=True"
    blobs = {}
    for name, digest in ours["files"].items():
        try:
            blobs[name] = (folder / name).read_bytes()
        except FileNotFoundError:
            raise UserError(f"{folder / name} is missing; {again}") from None
        if hashlib.sha256(blobs[name]).hexdigest() != digest:
            raise UserError(f"{folder / name} is damaged or was edited (its checksum differs from the one saved "
                            f"with it); {again}")
    if ours.get("run_weights") != weights_fingerprint(model):
        raise UserError(f"the SAE in {folder} was trained on other weights than this run's checkpoint (the run was "
                        f"trained again, or the SAE copied from another run); {again}")
    try:
        state, cfg, table = load(blobs[WEIGHTS_FILE]), json.loads(blobs[CFG_FILE]), json.loads(blobs[TABLE_FILE])
        sae = SparseAutoencoder(cfg["d_in"], cfg["d_sae"], cfg["k"])
        sae.load_state_dict(state)
    except (SafetensorError, ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"the SAE in {folder} cannot be read ({first_line(e)}); {again}") from None
    return sae.eval().requires_grad_(False), ours, table


# ----------------------------------------------------------------------------- from Python


class Features:
    """The SAE trained on a run at one hook point, as the API gives it: encode and decode, each feature's top
    contexts, frequency and logit effect (`table`), and the metrics it was saved with."""

    def __init__(self, sae, hook, ours, table):
        self.sae, self.hook, self.metrics, self.table = sae, hook, ours.get("metrics", {}), table

    @classmethod
    def of(cls, run, hook):
        if not isinstance(hook, str) or hook not in hook_points(run.model):
            raise UserError(f"features are read at a hook point of the model, e.g. 'blocks.0.hook_resid_post'; got "
                            f"{str(hook)[:60]!r}")
        sae, ours, table = load_sae(run.out_dir / "sae" / hook, run.model)
        return cls(sae, hook, ours, table)

    @property
    def d_sae(self):
        return self.sae.d_sae

    def encode(self, x):
        """Every feature's activation for activations x (..., d_in) at the hook: (..., d_sae), all but k zero."""
        return self.sae.encode(torch.as_tensor(x).float())

    def decode(self, f):
        """The activation (..., d_in) features f (..., d_sae) write."""
        return self.sae.decode(torch.as_tensor(f).float())

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
        f = sae.encode(site_activations(model, idx[start:start + MEASURE_WINDOWS], hook)).flatten(0, 1)  # (n, d_sae)
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
    direction = sae.W_dec * (ln.weight if ln.weight is not None else 1.0)
    logits = direction @ model.lm_head.weight[:vocab].T  # (d_sae, vocab)
    return logits.topk(n, dim=1).indices.tolist(), (-logits).topk(n, dim=1).indices.tolist()


def context_of(tok, idx, position, width):
    """(before, the token, after) around a flat position of idx (B, T), width tokens either side, within its
    window."""
    row, t = divmod(position, idx.size(1))
    start = max(0, t - width)
    text = [tok.decode([i]) for i in idx[row, start:t + 1 + width].tolist()]  # the tokens shown, decoded once
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
             "promotes": [tok.decode([t]) for t in promotes[i]], "demotes": [tok.decode([t]) for t in demotes[i]]}
            for i in order]


