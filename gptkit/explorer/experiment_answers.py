"""The explorer's experiments (gptkit/explorer/app.py serves them): heads, MLPs and features switched off for one
request, what each head does as a label, one head's scores before and after its softmax, and the lab's runs' curves
together.

What is off travels with each request, as names ("L0H3", "MLP1", "blocks.1.hook_resid_post F12"): the hooks that
switch it off are put on the shared model under the shelf's lock and taken off before the lock is let go, so one
tab's experiment is never another's. They are gptkit.interp's own: experiments's zero ablation for heads and MLPs
(without its printed note: the note travels in the answer), and features's features_off for a feature of an SAE
trained on the run."""

import math
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Annotated
from weakref import WeakKeyDictionary

import torch
from pydantic import BaseModel, Field, Strict

from gptkit.base.errors import UserError, first_line
from gptkit.data.dataset import Split, load_meta
from gptkit.data.tokenizer import same_token_ids
from gptkit.explorer.runs import without_paths
from gptkit.explorer.timeline_answers import AtRequest
from gptkit.interp.experiments import (HEAD_NAME, MLP_NAME, ablation_hooks, chance_scores, everything_note, head_labels,
                                       head_scores, induction_tokens, number_in, parse_heads, parse_mlps, part_names,
                                       shown_value)
from gptkit.interp.features import features_off
from gptkit.interp.hooks import hook_points, hooked, run_with_cache

LABEL_WINDOWS = 8  # val windows the text scores of the labels read: enough to tell the kinds apart, and cheap
MAX_OFF = 10_000  # names in one request's "off", and the highest layer or head it names: past any model here
MAX_NAME = 64  # characters in one of those names: 'L10000H10000', 'blocks.10.hook_resid_post F65535' and room
FEATURE_NAME = re.compile(r"\s*(\S+)\s+F([0-9]+)\s*", re.IGNORECASE)  # 'blocks.1.hook_resid_post F12': a feature
MAX_TOKENS = 100_000  # token ids in one request: far past any model's context here, which each request checks
# a number the page sends: a JSON number of its kind, never true (1 to Python) or "3" (which pydantic would take)
Whole = Annotated[int, Strict()]
Real = Annotated[float, Strict()]


class OffRequest(BaseModel):
    """What a request switches off: heads as L0H3, MLPs as MLP1 and features as 'blocks.1.hook_resid_post F12',
    for this request only."""

    off: list[Annotated[str, Field(max_length=MAX_NAME)]] = Field([], max_length=MAX_OFF)


@dataclass(frozen=True)
class Off:
    """The heads ((layer, head) pairs), MLPs (layers) and features ((hook, its Features, (index, ...)) a hook) a
    request switches off, and the note when every head is."""

    heads: tuple = ()
    mlps: tuple = ()
    note: str | None = None
    features: tuple = ()

    @property
    def names(self):
        return [*part_names(self.heads, self.mlps), *(f"{hook} F{i}" for hook, _, off in self.features for i in off)]

    def on(self, *models):
        """A context in which each of models (the analysis model, the decoding copy) runs with these parts off."""
        if not self.heads and not self.mlps and not self.features:
            return nullcontext()
        return switched_off(models, self.hooks)

    def hooks(self, model):
        """[(hook name, function)] that switch these parts off in model: the API's own (ablated, features_off)."""
        return [*ablation_hooks(model, self.heads, self.mlps, {}),
                *((hook, features_off(f.sae, off)) for hook, f, off in self.features)]

    def to_json(self):
        return {"names": self.names, "label": ", ".join(self.names), "note": self.note}


@contextmanager
def switched_off(models, hooks_of):
    with hooked(models[0], hooks_of(models[0])):
        if len(models) == 1:
            yield
        else:
            with switched_off(models[1:], hooks_of):
                yield


def off_of(model, names, sae_at):
    """The Off that names ('L0H3', 'MLP1', any case, and 'blocks.1.hook_resid_post F12') ask of model, sae_at(hook)
    giving the run's SAE there (gptkit/explorer/feature_answers.py's Kept, or a 4xx line where it has none); one line (a
    UserError) for a part it lacks."""
    features = [n for n in names if FEATURE_NAME.fullmatch(n)]
    parts = [n for n in names if not FEATURE_NAME.fullmatch(n)]
    for name in parts:
        if not HEAD_NAME.fullmatch(name) and not MLP_NAME.fullmatch(name):
            raise UserError(f"{shown_value(name)} is not a head, an MLP or a feature: write L0H3 (layer 0, head 3), "
                            "MLP1, or a feature of an SAE as 'blocks.1.hook_resid_post F12'")
    heads = parse_heads(model, [n for n in parts if not MLP_NAME.fullmatch(n)])
    mlps = parse_mlps(model, [n for n in parts if MLP_NAME.fullmatch(n)])
    return Off(heads, mlps, everything_note(model, heads, mlps), features_named(model, features, sae_at))


def features_named(model, names, sae_at):
    """((hook, Features, (index, ...)), ...) for feature names, the hooks in the model's order, the indices checked
    against each hook's SAE (Features.indices: a line for one out of range)."""
    wanted = {}
    for name in names:
        hook, digits = FEATURE_NAME.fullmatch(name).groups()
        wanted.setdefault(hook, set()).add(number_in(digits))
    order = {hook: i for i, hook in enumerate(hook_points(model))}
    found = []
    for hook in sorted(wanted, key=lambda h: order.get(h, -1)):  # a hook the model lacks: refused first
        f = sae_at(hook).features
        found.append((hook, f, tuple(f.indices(sorted(wanted[hook])))))
    return tuple(found)


# ----------------------------------------------------------------------------- what each head does


_labels = WeakKeyDictionary()  # model -> its heads' labels: computed once for each loaded model


def text_windows(model, ckpt, tok):
    """(B, T) windows of the val split the run trained on, when it is on this machine and tokenized as the run
    is, and where they come from in words; else (None, why not)."""
    trained = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    dataset = trained.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        return None, "the run does not say which dataset it trained on"
    try:
        folder, meta = load_meta(trained.get("data_dir") or "", dataset)
        if not same_token_ids(meta, tok.to_meta()):
            return None, f"{dataset} is tokenized differently from the run"
        T = model.config.block_size
        split = Split(folder, "val", meta, T)
        windows = min(LABEL_WINDOWS, (split.length - 1) // T)
        if windows < 1:
            return None, f"{dataset}'s val split is shorter than one window"
        device = str(next(model.parameters()).device)  # Split.batch takes the device's name
        return split.batch(torch.arange(windows) * T, device)[0], f"{windows} windows of {dataset}'s val split"
    except (UserError, OSError, ValueError, KeyError) as e:
        return None, f"{dataset}'s val split cannot be read ({without_paths(first_line(e))})"


def heads_report(model, tok, ckpt_of):
    """{labels: [[kind or '']] a layer, a head; scores: {kind: [[score]]}; text: what the text scores read}, from
    gptkit.interp.experiments's head_scores and head_labels, once per model (ckpt_of() gives its checkpoint, for where
    its val split is). Without the val split the text scores read the repeated random sequences too."""
    if model in _labels:
        return _labels[model]
    repeated = induction_tokens(model, tok.vocab_size)
    try:
        ckpt = ckpt_of()
    except (UserError, OSError):
        ckpt = {}
    text, where = text_windows(model, ckpt, tok)
    if text is None:
        text, where = repeated, f"random repeated sequences ({where})"
    scores = head_scores(model, text, repeated)
    labels = head_labels(scores, chance_scores(text, repeated))
    _labels[model] = {"labels": labels, "text": where,
                      "scores": {k: [[round(v, 4) for v in row] for row in s.tolist()] for k, s in scores.items()}}
    return _labels[model]


# ----------------------------------------------------------------------------- one head's scores


class ScoresRequest(OffRequest, AtRequest):
    run: str
    ids: list[Whole] = Field(min_length=1, max_length=MAX_TOKENS)
    position: Whole = Field(ge=0, lt=MAX_TOKENS)
    layer: Whole = Field(ge=0, le=MAX_OFF)
    head: Whole = Field(ge=0, le=MAX_OFF)


def head_scores_at(model, idx, layer, head, position):
    """For the query at position of idx (1, T) and one head: q·k for every key it may see, raw and scaled by
    1/√d, the scores the model softmaxes (hook_attn_scores: scaled for scaled attention, raw for 'dot'), and its
    weights after the softmax (hook_pattern); also the softmax of the raw scores, what the weights would be
    without the scale. A key the mask hides has None."""
    c = model.config
    if c.n_layer == 0:
        raise UserError("this model has no attention (n_layer=0, a bigram model): it has no heads")
    if not (layer < c.n_layer and head < c.n_head):
        raise UserError(f"no head {head} in layer {layer}: the model has {c.n_layer} layers of {c.n_head} heads")
    if position >= idx.size(1):
        raise UserError(f"position {position} is past the last of {idx.size(1)} tokens")
    at = f"blocks.{layer}.attn."
    _, cache = run_with_cache(model, idx, [at + n for n in ("hook_q", "hook_k", "hook_attn_scores", "hook_pattern")])
    q, k = cache[at + "hook_q"][0, position, head].float(), cache[at + "hook_k"][0, :, head].float()
    d = k.size(-1)
    raw = k @ q if d else torch.zeros(k.size(0), device=k.device)
    seen = torch.isfinite(cache[at + "hook_attn_scores"][0, head, position].float())
    used = cache[at + "hook_attn_scores"][0, head, position].float()
    unscaled = torch.softmax(raw.masked_fill(~seen, float("-inf")), -1)

    def listed(x):
        return [round(v, 6) if ok else None for v, ok in zip(x.tolist(), seen.tolist())]

    return {"layer": layer, "head": head, "position": position, "d_head": d,
            "scale": 1 / math.sqrt(d) if d else None, "attention": c.attention,
            "raw": listed(raw), "scaled": listed(raw / math.sqrt(d) if d else raw), "used": listed(used),
            "weights": [round(w, 6) for w in cache[at + "hook_pattern"][0, head, position].float().tolist()],
            "weights_unscaled": listed(unscaled)}


# ----------------------------------------------------------------------------- the lab's curves


def lab_curves(runs):
    """[{name, rung, eval, final, error}] for each of runs, (name, its lab rung or None, its run_metrics or an error
    line), that is a lab rung, in the lab's order: each rung's val-loss curve, for one chart, and its final score
    (val loss in nats per token and bits per character, as the lab's table has them; None before it has one)."""
    out = []
    for name, rung, metrics in runs:
        if rung is None:
            continue
        error = metrics if isinstance(metrics, str) else None
        evals = [] if error else [{"iter": r["iter"], "val_loss": r["val_loss"]} for r in metrics["eval"]]
        out.append({"name": name, "rung": rung, "eval": evals, "final": None if error else metrics["final"],
                    "error": error})
    out.sort(key=lambda r: (r["rung"]["step"], r["name"]))
    return out
