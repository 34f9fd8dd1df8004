"""
Experiments on a trained model: switch each head off, score what each head does, patch activations from one
prompt into another, attribute a prediction to the parts that wrote it. The same from Python:
gptkit/interp/experiments.py (docs/analysis.md).

    python analyze.py heads out                                   # a table of every head, and out/heads.png
    python analyze.py heads out --ablation=mean --json            # mean ablation, as JSON
    python analyze.py patch out --clean="KING HENR" --corrupt="KING RICH" --target=Y --foil=A   # and out/patch.png
    python analyze.py attribute out --text="First Citizen"        # what pushed each part of the last prediction
"""

import json
import math
import sys
from contextlib import nullcontext, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from gptkit.base.errors import UserError, run_main  # first: a Ctrl-C while torch loads is one line too
import torch

from gptkit.base.settings import parse_config, pick_subcommand, require
from gptkit.machine.runtime import check_device_name, pick_device



@dataclass
class AnalyzeConfig:
    """Every subcommand's settings: the run, and how to answer."""

    out_dir: str = "out"  # the run folder (also the argument after the subcommand: analyze.py NAME OUT_DIR)
    checkpoint: str = "best"  # 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' (a snapshot: train.py --snapshots)
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    json: bool = False  # print JSON, for programs, instead of tables

    def __post_init__(self):
        from gptkit.run.run_folder import check_checkpoint

        check_checkpoint(self.checkpoint)
        check_device_name(self.device)


@dataclass
class PictureConfig(AnalyzeConfig):
    """The settings of a subcommand that draws: every subcommand's, and where the picture goes."""

    picture: ClassVar[str] = ""
    of_checkpoint: ClassVar[bool] = True  # the picture is of the checkpoint's weights (the timeline's is not)
    output: str = ""  # the picture's path ('' = out_dir/NAME.png; of --checkpoint=iter:150, out_dir/NAME-iter150.png)

    def __post_init__(self):
        from gptkit.interp.pictures import check_picture_path

        super().__post_init__()
        check_picture_path(self.output_path())  # here, not after the work

    def output_path(self):
        from gptkit.interp.pictures import picture_name

        if self.output:
            return Path(self.output)
        return Path(self.out_dir) / picture_name(self.picture, self.checkpoint if self.of_checkpoint else "best")


@dataclass
class DataConfig(AnalyzeConfig):
    """The settings of a subcommand that reads the run's dataset: every subcommand's, and which dataset."""

    dataset: str = ""  # whose splits ('' = the dataset the run trained on)
    data_dir: str = ""  # with --dataset: where prepared datasets live ('' = this project's data/)


@dataclass
class HeadsConfig(PictureConfig, DataConfig):
    picture: ClassVar[str] = "heads"
    tokens: int = 65_536  # val tokens each head's ablation is measured on: the split's first ones, in windows
    ablation: Literal["zero", "mean"] = "zero"  # a head's output (its slice of hook_z) set to 0, or to its mean there
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # 'auto': bfloat16 where the device has fast bf16 matmuls

    def __post_init__(self):
        super().__post_init__()
        require(self, ["tokens"], lambda v: v >= 1, "at least 1")


@dataclass
class FeaturesConfig(DataConfig):
    layer: int = -1  # the layer whose site is read, counted from 0 (-1 = the last)
    site: str = "resid_post"  # resid_post, resid_mid, mlp_out or attn_out (blocks.LAYER.hook_SITE)
    features: int = 0  # the SAE's features (0 = 8 x the model's width)
    k: int = 16  # features kept active for each token (TopK)
    tokens: int = 2_000_000  # train activations the SAE learns from, streamed from the train split
    batch: int = 2048  # activations a step
    lr: float = 2e-3  # Adam's learning rate (on activations scaled to a mean norm of sqrt(width))
    seed: int = 0  # the SAE's initial weights and the windows it reads
    eval_tokens: int = 65_536  # val tokens the metrics and each feature's contexts are read on (the first ones)
    show: int = 20  # features in the table, the most frequent first
    start_over: bool = False  # train again where an SAE with other settings (or a stopped training) is there

    def __post_init__(self):
        super().__post_init__()
        require(self, ["layer"], lambda v: v >= -1, "-1 (the last layer) or more")
        require(self, ["features", "show"], lambda v: v >= 0, "at least 0")
        require(self, ["k", "batch", "eval_tokens"], lambda v: v >= 1, "at least 1")
        require(self, ["lr"], lambda v: v > 0, "above 0")
        if self.features and self.k >= self.features:
            raise ValueError(f"k must be below features (got k={self.k}, features={self.features})")
        if self.tokens < self.batch:
            raise ValueError(f"tokens must be at least one batch of {self.batch} activations to train on (got "
                             f"{self.tokens})")


@dataclass
class PatchConfig(PictureConfig):
    picture: ClassVar[str] = "patch"
    clean: str = ""  # the prompt whose activations are copied in (\n for a newline, FILE:path to read one)
    corrupt: str = ""  # the prompt they are copied into, as many tokens long
    target: str = ""  # the token the metric scores ('' = the clean run's top prediction after the clean prompt)
    foil: str = ""  # a second token: the metric becomes the logit difference target - foil ('' = target's log-prob)


@dataclass
class TimelineConfig(PictureConfig):
    picture: ClassVar[str] = "timeline"
    of_checkpoint: ClassVar[bool] = False


@dataclass
class AttributeConfig(AnalyzeConfig):
    text: str = ""  # the text whose prediction is attributed (\n for a newline, FILE:path to read one)
    position: int = -1  # which position's prediction of the token that came next (-1 = the last that has one)

    def __post_init__(self):
        super().__post_init__()
        require(self, ["position"], lambda v: v >= -1, "-1 (the last position with a next token) or more")


# ----------------------------------------------------------------------------- heads


def run_split(run, cfg, name, block_size):
    """The run's dataset's split `name` (--dataset's where given), in windows of block_size: (Split, the
    dataset's name)."""
    from gptkit.data.dataset import Split, load_meta
    from gptkit.data.tokenizer import same_token_ids

    dataset, data_dir = (cfg.dataset, cfg.data_dir) if cfg.dataset else (
        run.trained_on.get("dataset"), run.trained_on.get("data_dir", ""))
    if not dataset:
        raise UserError(f"{run.out_dir} does not say which dataset it trained on; pass --dataset")
    folder, meta = load_meta(data_dir, dataset)
    if not same_token_ids(meta, run.tok.to_meta()):
        raise UserError(f"dataset {dataset} is tokenized differently from the run in {run.out_dir}; pass the "
                        "--dataset it trained on")
    return Split(folder, name, meta, block_size), dataset


def val_windows(run, cfg, device, tokens):
    """(idx, targets), (B, T) each: the first `tokens` tokens of the val split (fewer where it holds fewer), in
    consecutive windows of the run's block_size; and the split's name in words."""
    T = min(run.config.block_size, tokens)
    split, dataset = run_split(run, cfg, "val", T)
    windows = min(max(1, tokens // T), (split.length - 1) // T)
    idx, targets = split.batch(torch.arange(windows) * T, device)
    return idx, targets, f"{dataset}'s val split ({windows:,} windows of {T})"


def heads_rows(deltas, scores, labels):
    """One dict a head, the --json entries: layer, head, name (L0H3), ablation_delta, each score and the label."""
    L, H = deltas.shape
    return [{"layer": layer, "head": head, "name": f"L{layer}H{head}",
             "ablation_delta": round(deltas[layer, head].item(), 6),
             **{kind: round(s[layer, head].item(), 4) for kind, s in scores.items()}, "label": labels[layer][head]}
            for layer in range(L) for head in range(H)]


def answer(cfg, data, text):
    """The answer on stdout: JSON for programs (strict JSON, finite_json's), or the tables for a person."""
    print(json.dumps(finite_json(data), ensure_ascii=False, allow_nan=False) if cfg.json else text, flush=True)


def finite_json(value, notes=True):
    """value with each number JSON cannot hold (NaN, Infinity) as null, and beside each key whose value held one
    KEY_note saying so: a number's in the object that holds it, or for a list or a mapping (an object inside an
    object, e.g. attribute's parts) one note beside it, which keeps its keys what they name. Every program reads
    the answer; none has to accept NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        out[key] = finite_json(v, notes=not isinstance(v, dict))
        bad = not_finite(v)
        if notes and bad and f"{key}_note" not in value:
            out[f"{key}_note"] = (f"came out as {bad[0]}, which JSON cannot hold: null" if isinstance(v, float) else
                                  f"{len(bad)} of its numbers came out as NaN or infinite, which JSON cannot hold: "
                                  "null there")
    return out


def not_finite(value):
    """The numbers in value (a number, or lists and mappings of them) that are not finite, as text; those in the
    objects of a list are noted in each object."""
    if isinstance(value, float) and not math.isfinite(value):
        return [str(value)]
    if isinstance(value, (list, tuple)):
        return [bad for v in value if not isinstance(v, dict) for bad in not_finite(v)]
    if isinstance(value, dict):
        return [bad for v in value.values() for bad in not_finite(v)]
    return []


def drawing(cfg):
    """Where a picture's `wrote ...` line goes: stderr under --json, whose stdout holds the JSON alone."""
    return redirect_stdout(sys.stderr) if cfg.json else nullcontext()


def analyze_heads(cfg):
    from gptkit.interp.experiments import (KINDS, LABEL_AT_LEAST, ablation_deltas, chance_scores, head_labels,
                                           head_scores, induction_tokens, no_attention, open_run)
    from gptkit.interp.pictures import draw_heads
    from gptkit.interp.timeline import SCORE_WINDOWS
    from gptkit.lab.ladder import markdown_table
    from gptkit.machine.precision import fast_dtype
    from gptkit.machine.runtime import autocast

    device = pick_device(cfg.device)
    run = open_run(cfg.out_dir, cfg.checkpoint, device)
    no_attention(run.model)
    idx, targets, where = val_windows(run, cfg, device, cfg.tokens)
    dtype = fast_dtype(device) if cfg.dtype == "auto" else cfg.dtype
    c, scored = run.config, int((targets != -1).sum())  # a chat dataset's prompts are not scored, as in training
    # the scores first: an attention of the learner's with no hook_pattern is its one line before minutes of ablating
    repeated = induction_tokens(run.model, run.tok.vocab_size)
    scores = head_scores(run.model, idx[:SCORE_WINDOWS], repeated)
    print(f"ablating each of {c.n_layer * c.n_head} heads in turn on {scored:,} tokens of {where}, in "
          f"{dtype}", file=sys.stderr, flush=True)
    with autocast(device, dtype):
        loss, deltas = ablation_deltas(run.model, idx, targets, cfg.ablation)
    labels = head_labels(scores, chance_scores(idx[:SCORE_WINDOWS], repeated))
    rows = heads_rows(deltas, scores, labels)
    title = (f"{weights_words(run)}: each head {cfg.ablation}-ablated on {scored:,} val tokens "
             f"(val loss {loss:.3f}), and what each head does")
    with drawing(cfg):  # the picture first: a table printed, then a failure, would be work half kept
        draw_heads(deltas, scores, title, cfg.output_path())
    header = ["layer", "head", "ablation Δ val loss", *(k.replace("_", "-") for k in KINDS), "label"]
    cells = [[str(r["layer"]), r["name"], f"{r['ablation_delta']:+.4f}", *(f"{r[k]:.2f}" for k in KINDS),
              r["label"].replace("_", "-")] for r in rows]
    answer(cfg, {"val_loss": round(loss, 6), "tokens": scored, "ablation": cfg.ablation, "dtype": dtype,
                 "heads": rows},
           f"val loss {loss:.4f} on {scored:,} tokens of {where}, in {dtype}{final_score_note(run)}; each "
           f"head {cfg.ablation}-ablated in turn (docs/analysis.md defines each score)\n\n"
           f"{markdown_table(header, cells, numeric=set(range(2, len(header) - 1)))}\n\n"
           f"label: the kind whose score goes furthest from chance toward 1, (score - chance) / (1 - chance), where "
           f"that reaches {LABEL_AT_LEAST}; local only where no other kind does (the explorer's labels)")
    if len(rows) == 1:
        print("note: the model has one head, so ablating it switches every head off (allowed: its row is what all "
              "of attention adds)", file=sys.stderr)


def weights_words(run):
    """Whose weights a picture is of, for its title: the run's name and the checkpoint (e.g. 'out, the snapshot of
    step 150', 'out, best.pt of step 1,200')."""
    from gptkit.interp.pictures import checkpoint_words

    return f"{run.out_dir.resolve().name}, {checkpoint_words(run.checkpoint, run.iteration)}"


def final_score_note(run):
    """Why the val loss here is not the run's own final score, where metrics.jsonl has one."""
    from gptkit.run.metrics import read_metrics

    try:
        final = [r for r in read_metrics(run.out_dir) if r.get("kind") == "final"]
    except UserError:
        return ""
    if not final:
        return ""
    return (f" (the run's final score, {final[-1]['val_loss']:.4f}, reads the whole split with the weights it ended "
            "with; this reads part of it, with the checkpoint's)")


# ----------------------------------------------------------------------------- patch


def one_token(run, text, option):
    """The token id of a --target or --foil, which must be one token the model knows."""
    from gptkit.data.conversations import typed
    from gptkit.sampling.prompts import read_prompt

    try:
        ids = run.tok.encode(typed(run.tok, read_prompt(text)))
    except UserError as e:
        raise UserError(f"--{option}: {e}") from None
    if len(ids) != 1:
        raise UserError(f"--{option} must be one token; {text!r} is {len(ids)} tokens")
    if ids[0] >= run.config.vocab_size:
        raise UserError(f"--{option} {text!r} is token {ids[0]}, outside the model's vocabulary of "
                        f"{run.config.vocab_size}")
    return ids[0]


def prompt_tokens(run, text, option):
    """The tokens of a --clean, --corrupt or --text prompt, or one line naming the option."""
    from gptkit.sampling.prompts import read_prompt

    if not text:
        raise UserError(f"--{option} is empty: pass a text, e.g. --{option}=\"First Citizen\"")
    try:
        return run.tokens(read_prompt(text))
    except UserError as e:
        raise UserError(f"--{option}: {e}") from None


def patch_tables(p, labels, n_head):
    """The patching answer as two Markdown tables: positions down and layers across, then layers and heads."""
    from gptkit.lab.ladder import markdown_table

    layers = [f"L{layer}" for layer in range(len(p.resid))]
    resid = markdown_table(["position", "token", *layers], [[str(t), labels[t], *(f"{v:.3f}" for v in column)]
                                                            for t, column in enumerate(p.resid.T.tolist())],
                           numeric=set(range(2, 2 + len(layers))))
    heads = markdown_table(["layer", *(f"H{h}" for h in range(n_head))],
                           [[layers[i], *(f"{v:.3f}" for v in row)] for i, row in enumerate(p.heads.tolist())],
                           numeric=set(range(1, 1 + n_head)))
    return (f"the residual stream (each layer's resid_pre) patched from clean at one position:\n\n{resid}\n\n"
            f"one head's output (hook_z) patched from clean at every position:\n\n{heads}")


def analyze_patch(cfg):
    from gptkit.interp.experiments import open_run, patching
    from gptkit.interp.hooks import token_label
    from gptkit.interp.pictures import draw_patching

    run = open_run(cfg.out_dir, cfg.checkpoint, pick_device(cfg.device))
    clean, corrupt = prompt_tokens(run, cfg.clean, "clean"), prompt_tokens(run, cfg.corrupt, "corrupt")
    target = one_token(run, cfg.target, "target") if cfg.target else None
    foil = one_token(run, cfg.foil, "foil") if cfg.foil else None
    p = patching(run.model, clean, corrupt, target, foil)
    labels = [token_label(run.tok, t) for t in corrupt[0].tolist()]
    shown, foil_shown = token_label(run.tok, p.target), None if foil is None else token_label(run.tok, foil)
    metric = (f"logit({shown}) - logit({foil_shown})" if foil is not None else
              f"log-prob of {shown}{'' if cfg.target else ', the clean run’s top prediction,'} after the prompt")
    ends = [p.clean, p.corrupt, *p.resid.aminmax(), *p.heads.aminmax()]
    title = (f"{weights_words(run)}: activation patching from {cfg.clean!r} into {cfg.corrupt!r}\n{metric}: "
             f"clean {p.clean:.3f}, corrupt {p.corrupt:.3f}")
    with drawing(cfg):  # before the answer, which a reader that stops early (`| head`) would cut off
        draw_patching(p.resid, p.heads, labels, (float(min(ends)), float(max(ends))), title, cfg.output_path())
    answer(cfg, {"metric": metric, "target": shown, "foil": foil_shown, "clean": p.clean, "corrupt": p.corrupt,
                 "tokens": labels, "resid": p.resid.tolist(), "heads": p.heads.tolist()},
           f"metric: {metric}; clean {p.clean:.4f}, corrupt {p.corrupt:.4f}\n\n"
           f"{patch_tables(p, labels, run.config.n_head)}")


# ----------------------------------------------------------------------------- attribute


def analyze_attribute(cfg):
    from gptkit.interp.experiments import attribute, open_run
    from gptkit.interp.hooks import token_label
    from gptkit.lab.ladder import markdown_table

    run = open_run(cfg.out_dir, cfg.checkpoint, pick_device(cfg.device))
    idx = prompt_tokens(run, cfg.text, "text")
    position = idx.size(1) - 2 if cfg.position == -1 else cfg.position
    a = attribute(run.model, idx, position)
    read, target = token_label(run.tok, idx[0, position].item()), token_label(run.tok, a.target)
    rows = [[name, f"{value:+.4f}"] for name, value in a.parts.items()]
    if run.model.transformer.ln_f.bias is not None:
        rows.append(["final norm's bias", f"{a.norm_bias:+.4f}"])
    rows.append(["sum", f"{sum(a.parts.values()) + a.norm_bias:+.4f}"])
    capped = f" ({a.raw_logit:.4f} before the soft-cap)" if run.config.logit_softcap else ""
    sums = f"they sum to the logit{' before the soft-cap' if capped else ''}" if a.adds_up else \
        ("they do not sum to the logit: model.py, as edited, builds the stream or the logit otherwise than as these "
         "parts added up, through the final norm and the head")
    answer(cfg, {"position": position, "token": read, "target": target, "parts": a.parts, "norm_bias": a.norm_bias,
                 "raw_logit": a.raw_logit, "logit": a.logit, "adds_up": a.adds_up},
           f"the logit of {target}, the token that came next, at position {position} ({read}): {a.logit:.4f}{capped}"
           f"\neach part's output through the final norm, its scale frozen at this pass's; {sums} (docs/analysis.md)"
           f"\n\n{markdown_table(['part', f'logit of {target}'], rows, numeric={1})}")


# ----------------------------------------------------------------------------- timeline


def timeline_steps(steps):
    """The --json steps: iter, val_loss, icl, and each head's scores."""
    from gptkit.interp.experiments import KINDS

    out = []
    for s in steps:
        heads = s.get("heads") or {}
        rows = [{"layer": layer, "head": head, **{k: heads[k][layer][head] for k in KINDS}}
                for layer in range(len(heads.get("induction", []))) for head in range(len(heads["induction"][layer]))]
        out.append({"iter": s["iter"], "val_loss": s.get("val_loss"), "icl": s["icl"], "heads": rows})
    return out


def timeline_table(steps, phase):
    from gptkit.interp.experiments import KINDS
    from gptkit.lab.ladder import markdown_table

    def strongest(s, kind):
        best = max(s["heads"], key=lambda h: h[kind])
        return f"{best[kind]:.2f} L{best['layer']}H{best['head']}"

    cells = [[f"{s['iter']:,}", "" if s["val_loss"] is None else f"{s['val_loss']:.4f}", f"{s['icl']:+.3f}",
              *(strongest(s, k) for k in KINDS)] for s in steps]
    table = markdown_table(["step", "val loss", "in-context learning", *(f"strongest {k.replace('_', '-')}"
                                                                          for k in KINDS)], cells, numeric={0, 1, 2})
    return f"{table}\n\n{phase_words(phase)}"


def phase_words(phase):
    """phase_change's answer in a line: the two steps where a phase change happened, else why none is located."""
    if phase["induction_iter"] is None:
        return phase["note"]
    return (f"the phase change: the strongest induction head, L{phase['layer']}H{phase['head']}, rose fastest at step "
            f"{phase['induction_iter']:,}; the in-context learning score fell fastest at step {phase['icl_iter']:,} "
            "(docs/analysis.md#python-analyzepy-timeline defines both)")


def analyze_timeline(cfg):
    from gptkit.interp.pictures import draw_timeline
    from gptkit.interp.timeline import RECORD_AGAIN, phase_change, timeline_of, why_no_timeline
    from gptkit.run.metrics import loss_series, read_metrics

    records = read_metrics(cfg.out_dir)
    timeline, left_out = timeline_of(records), records.note("timeline")
    if not timeline:
        why = f"no whole record: {left_out.removeprefix('note: ')}; {RECORD_AGAIN}" if left_out \
            else why_no_timeline(records)
        raise UserError(f"{cfg.out_dir} has no timeline: {why}")
    if not any(t.get("heads") for t in timeline):
        raise UserError(f"{cfg.out_dir}'s timeline has no head scores to follow: its model has no attention (a "
                        "bigram table), or its attention passes no hook point the records read (its run named it as "
                        "it trained)")
    if left_out:
        print(left_out, file=sys.stderr, flush=True)
    phase = phase_change(timeline)
    steps = timeline_steps(timeline)
    name = Path(cfg.out_dir).resolve().name
    marks = ("red dashes: the induction score's steepest rise; black dots: the in-context score's steepest fall"
             if phase["induction_iter"] is not None else phase["note"])
    with drawing(cfg):  # the picture first: the answer, then a failure, would be work half kept
        draw_timeline(timeline, loss_series(records), phase, f"{name}: what each head does as it trains\n{marks}",
                      cfg.output_path())
    left = [{"line": line, "why": why} for line, kind, why in records.left_out if kind == "timeline"]
    answer(cfg, {"steps": steps, "phase_change": phase, "left_out": left},
           f"{len(steps)} records of {name}'s timeline, each head's scores read as analyze.py heads reads them\n\n"
           f"{timeline_table([s for s in steps if s['heads']], phase)}")


# ----------------------------------------------------------------------------- features


def sae_recipe(run, cfg):
    """The hook point (its layer and site checked) and the Recipe the settings make for this run."""
    from gptkit.interp.features import Recipe, site_hook

    layer = run.config.n_layer - 1 if cfg.layer == -1 else cfg.layer
    hook = site_hook(run.model, layer, cfg.site)
    features = cfg.features or 8 * run.config.n_embd
    if cfg.k >= features:
        raise UserError(f"k must be below features (got k={cfg.k}, features={features})")
    return Recipe(hook, features, cfg.k, cfg.tokens, cfg.batch, cfg.lr, cfg.seed)


def trained_sae(run, cfg, recipe, folder):
    """The SAE of this recipe in folder, trained now unless it is there already: (SAE, its dead fraction, the
    scale it was trained at, its feature table), the last two None for one trained now and one read back."""
    from gptkit.base.files import writable
    from gptkit.interp.features import (OURS_FILE, TRAINING_FILE, continues_exactly, load_sae, read_ours,
                                        refuse_unclaimed, train_sae, unclaimed_files, weights_of)

    ours = None if cfg.start_over else read_ours(folder)  # --start_over replaces even a damaged one
    if ours is not None:
        if ours.get("recipe") != recipe.__dict__:
            raise UserError(f"{folder} holds an SAE trained with other settings "
                            f"({settings_diff(ours.get('recipe'), recipe)}); pass those to read it, or "
                            "--start_over=True to replace it")
        sae, ours, table = load_sae(folder, run)
        print(f"the SAE trained earlier, from {folder}", file=sys.stderr)
        return sae, ours["metrics"]["dead_fraction"], None, table
    if not cfg.start_over:
        refuse_unclaimed(folder)
    writable(folder / OURS_FILE)
    if cfg.start_over and folder.is_dir():
        if not continues_exactly(folder / TRAINING_FILE, recipe, weights_of(run)):
            (folder / TRAINING_FILE).unlink(missing_ok=True)
        if (folder / OURS_FILE).exists() or unclaimed_files(folder):
            print(f"note: replacing the SAE in {folder} (--start_over=True)", file=sys.stderr)
    split, _ = run_split(run, cfg, "train", run.config.block_size)
    if split.length < 2 * recipe.batch:
        raise UserError(f"the train split has {split.length:,} tokens: too few to train an SAE on batches of "
                        f"{recipe.batch:,}; lower --batch or prepare more text")
    sae, scale, trainer = train_sae(run.model.requires_grad_(False), split, recipe, folder, weights_of(run))
    return sae, trainer.dead_fraction(), scale, None


def settings_diff(saved, recipe):
    saved = saved if isinstance(saved, dict) else {}
    return ", ".join(f"{k}={saved.get(k)!r}" for k, v in recipe.__dict__.items() if saved.get(k) != v) or "unknown"


FEATURE_METRICS = ("l0", "explained_variance", "ce_loss_recovered", "delta_loss", "dead_fraction")  # --json's


def analyze_features(cfg):
    from gptkit.base.signals import StopSignals
    from gptkit.interp.experiments import open_run
    from gptkit.interp.features import (PAGE_FILE, TRAINING_FILE, check_memory, feature_rows, measure, sae_folder,
                                        sae_lock, save_sae, weights_of)

    run = open_run(cfg.out_dir, cfg.checkpoint, pick_device(cfg.device))
    recipe = sae_recipe(run, cfg)
    folder = sae_folder(run.out_dir, recipe.hook, cfg.checkpoint)  # each checkpoint's SAEs apart
    idx, targets, where = val_windows(run, cfg, "cpu", cfg.eval_tokens)
    check_memory(recipe, run.config.n_embd, idx, run.tok.vocab_size)
    with sae_lock(folder):
        sae, dead, scale, table = trained_sae(run, cfg, recipe, folder)
        with StopSignals() as stop:  # a stop now is one line, the trained SAE kept (its training's last state)
            stop.doing = (f"measuring the SAE; its training is saved in {folder / TRAINING_FILE}, and the same "
                          "command measures and saves it" if scale is not None else f"measuring the SAE in {folder}")
            metrics = measure(run.model, sae, recipe.hook, idx, targets, dead)
            if scale is not None:  # trained now: kept with its metrics, every feature's row and the weights it read
                table = feature_rows(run.model, run.tok, sae, recipe.hook, idx, sae.d_sae)
                with stop.deferred():  # its files all saved: some of them alone would be refused as not its own
                    save_sae(folder, sae, recipe.hook, run.out_dir.resolve().name,
                             {"recipe": recipe.__dict__, "scale": scale, "metrics": metrics.to_json(),
                              **weights_of(run), "contexts_from": where}, table)
                    (folder / TRAINING_FILE).unlink(missing_ok=True)
                stop.doing = f"writing {folder / PAGE_FILE}; the SAE is saved"
            rows = table[:cfg.show]
            write_feature_page(folder / PAGE_FILE, recipe, metrics, rows, where)
    shown = {k: v for k, v in metrics.to_json().items() if k.removesuffix("_note") in FEATURE_METRICS}
    answer(cfg, {"metrics": shown, "hook": recipe.hook, "folder": str(folder), "features": rows},
           features_text(recipe, metrics, rows, where, folder))


def features_text(recipe, metrics, rows, where, folder):
    from gptkit.data.tokenizer import visible
    from gptkit.lab.ladder import markdown_table

    m = metrics
    cells = [[str(r["index"]), f"{r['frequency']:.2%}",
              "  ".join(f"{visible(b)}[{visible(t)}]{visible(a)}" for b, t, a, _ in r["contexts"][:3]),
              " ".join(visible(t) for t in r["promotes"][:3]), " ".join(visible(t) for t in r["demotes"][:3])]
             for r in rows]
    table = markdown_table(["feature", "fires", "top contexts ([the token it fires on])", "pushes up", "pushes down"],
                           cells, numeric={0, 1})
    return (f"an SAE of {recipe.features:,} features, k={recipe.k}, on {recipe.hook}, trained on {recipe.tokens:,} "
            f"activations; saved in {folder} (SAELens's format)\n"
            f"on {m.tokens:,} tokens of {where}: L0 {m.shown('l0', '.1f')}, explained variance "
            f"{m.shown('explained_variance', '.4f')}, CE loss recovered {m.shown('ce_loss_recovered', '.4f')} "
            f"(val loss {m.shown('clean_loss', '.4f')} clean, {m.shown('spliced_loss', '.4f')} spliced, "
            f"{m.shown('zero_loss', '.4f')} zeroed), splicing adds {m.shown('delta_loss', '+.4f')} nats, dead "
            f"features {m.dead_fraction:.1%} (docs/analysis.md defines each)\n\n"
            f"the {len(rows)} features that fire most often:\n\n{table}\n\nevery feature's contexts: "
            f"{folder / 'features.html'}")


def write_feature_page(path, recipe, metrics, rows, where):
    """features.html: each feature's top contexts with the token it fires on marked, its frequency and logit
    effect; a page reads contexts of text better than a picture does."""
    from html import escape

    from gptkit.base.files import write_whole
    from gptkit.data.tokenizer import VISIBLE

    def shown(text):  # a newline, tab or carriage return as its mark: the page shows each context on one line
        return escape("".join(VISIBLE[c] if c in "\n\r\t" else c for c in text))

    def context(before, token, after, value):
        return (f"<li><code>{shown(before)}<mark title='{value:.3f}'>{shown(token)}</mark>{shown(after)}</code>"
                f" <small>{value:.2f}</small></li>")

    items = "\n".join(f"<section><h2>feature {r['index']} <small>fires on {r['frequency']:.2%} of tokens</small></h2>"
                       f"<ul>{''.join(context(*c) for c in r['contexts'])}</ul>"
                       f"<p>pushes up: <code>{shown(' '.join(r['promotes']))}</code> · pushes down: "
                       f"<code>{shown(' '.join(r['demotes']))}</code></p></section>" for r in rows)
    m, listed = metrics, f"{len(rows):,}" + (f" of {recipe.features:,}" if len(rows) < recipe.features else "")
    hook = escape(recipe.hook)
    write_whole(path, f"""<!doctype html><meta charset="utf-8"><title>{listed} features of {hook}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}code{{white-space:pre;background:#f4f4f4}}
mark{{background:#fc6}}section{{border-top:1px solid #ddd}}</style>
<h1>{listed} features of {hook}, k={recipe.k}: those that fire most often</h1>
<p>On {m.tokens:,} tokens of {escape(where)}: L0 {escape(m.shown('l0', '.1f'))}, explained variance
{escape(m.shown('explained_variance', '.4f'))}, CE loss recovered {escape(m.shown('ce_loss_recovered', '.4f'))},
splicing adds {escape(m.shown('delta_loss', '+.4f'))} nats, dead {m.dead_fraction:.1%}.</p>
{items}
""")


COMMANDS = {"heads": (analyze_heads, HeadsConfig), "patch": (analyze_patch, PatchConfig),
            "attribute": (analyze_attribute, AttributeConfig), "timeline": (analyze_timeline, TimelineConfig),
            "features": (analyze_features, FeaturesConfig)}


def out_dir_first(argv):
    """`analyze.py NAME OUT_DIR --key=value ...`: a first argument that is not an option names the run folder."""
    if argv and not argv[0].startswith("--"):
        return [f"--out_dir={argv[0]}", *argv[1:]]
    return argv


def main(argv=None):
    picked = pick_subcommand("analyze.py", COMMANDS, sys.argv[1:] if argv is None else argv, "analysis")
    if picked:
        name, rest = picked
        analyze, config = COMMANDS[name]
        analyze(parse_config(config, out_dir_first(rest), prog=f"analyze.py {name}"))


if __name__ == "__main__":
    run_main(main, memory_settings=("tokens",))
