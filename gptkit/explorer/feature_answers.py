"""The explorer's features (gptkit/explorer/app.py serves them): the SAEs `analyze.py features` trained on a run
(gptkit/interp/features.py), each read once through the API (run.features) and kept with its model; the features
active at one token, each with its row of the SAE's table; and one feature's activation at every token of a text.
A feature switched off travels in each request's "off" as 'blocks.1.hook_resid_post F12'
(gptkit/explorer/experiment_answers.py).

The activation an SAE encodes is the one arriving at its hook, with the parts switched off before it: read before
a feature switched off at that hook is taken out, so such a feature shows the value it is switched off at."""

from dataclasses import dataclass

from pydantic import Field

from gptkit.base.errors import UserError, first_line
from gptkit.data.dataset import file_identity
from gptkit.explorer.answers import MAX_PROMPT_CHARS, checked_ids, encode, token_json
from gptkit.explorer.experiment_answers import MAX_NAME, MAX_TOKENS, OffRequest, Whole
from gptkit.explorer.runs import ApiError, inside, number, without_paths
from gptkit.interp.experiments import Run, shown_value
from gptkit.interp.features import CFG_FILE, OURS_FILE, TABLE_FILE, WEIGHTS_FILE, site_activations
from gptkit.interp.hooks import hook_points

FREQUENT = 16  # the most frequent features an SAE's answer lists, to click before any token is
METRICS = ("l0", "explained_variance", "ce_loss_recovered", "delta_loss", "dead_fraction", "tokens")
SAE_FILES = (OURS_FILE, WEIGHTS_FILE, CFG_FILE, TABLE_FILE)


class TokenFeaturesRequest(OffRequest):
    run: str
    hook: str = Field(max_length=MAX_NAME)
    ids: list[Whole] = Field(min_length=1, max_length=MAX_TOKENS)
    position: Whole = Field(ge=0, lt=MAX_TOKENS)


class FeatureRequest(OffRequest):
    run: str
    hook: str = Field(max_length=MAX_NAME)
    feature: Whole = Field(ge=0, lt=2 ** 31)
    text: str = Field("", max_length=MAX_PROMPT_CHARS)


@dataclass
class Kept:
    """One SAE of a loaded run as the shelf keeps it: the API's Features, each feature's row of the table by index
    (most frequent first), and the identity of the files it was read from: other files are read again."""

    features: object
    rows: dict
    identity: tuple


def sae_hooks(folder, model):
    """The hook points of model at which the run in folder has an SAE (sae/<hook>/gptkit.json), in the model's
    order; none where sae/ cannot be read. Listed without reading them: a damaged one says so when asked for."""
    try:
        present = {p.name for p in (folder / "sae").iterdir() if (p / OURS_FILE).is_file()}
    except OSError:
        return []
    return [hook for hook in hook_points(model) if hook in present]


def checked_hook(model, hook):
    if hook not in hook_points(model):
        raise ApiError(400, f"{shown_value(hook)} is not a hook point of this model: an SAE sits at one such as "
                            "'blocks.0.hook_resid_post'")


def files_identity(folder):
    """What tells an SAE's files from their replacement (another training): each one's identity, None where
    missing."""
    found = []
    for name in SAE_FILES:
        try:
            found.append(file_identity((folder / name).stat()))
        except OSError:
            found.append(None)
    return tuple(found)


def read_sae(loaded, hook, identity):
    """The SAE at hook of loaded's run, read and checked by the API (run.features: every file's fields, shapes and
    checksums, the weights it read): a 404 where the run has none there; a 409 where its files are damaged,
    another run's, or a link leading out of the run's folder."""
    summary = loaded.summary
    folder = summary.folder / "sae" / hook
    if not (folder / OURS_FILE).is_file():
        raise ApiError(404, f"run {shown_value(summary.name)} has no SAE at {hook} (python analyze.py features "
                            "trains one)")
    try:
        for name in SAE_FILES:
            inside(folder / name, summary.folder)
        f = Run(loaded.model, loaded.tok, summary.folder).features(hook)
    except (UserError, OSError) as e:
        raise ApiError(409, f"the SAE at {hook} of run {shown_value(summary.name)} cannot be read: "
                            f"{without_paths(first_line(e), summary.folder)}") from None
    f.sae.to(next(loaded.model.parameters()).device)
    return Kept(f, {row["index"]: row for row in f.table}, identity)


def sae_report(kept):
    """An SAE as the panel introduces it: its shape, its metrics, and its most frequent features' rows."""
    f = kept.features
    return {"hook": f.hook, "d_in": f.sae.d_in, "d_sae": f.d_sae, "k": f.sae.k,
            "metrics": {name: number(f.metrics[name]) for name in METRICS},
            "frequent": list(kept.rows.values())[:FREQUENT]}


def token_features(shelf, loaded, kept, req, off):
    """The features active at token req.position of req.ids: every one the SAE gives a value above 0, largest
    first, each with its row of the table, and whether it is switched off."""
    if req.position >= len(req.ids):
        raise ApiError(400, f"position {req.position} is past the last of {len(req.ids)} tokens")
    idx, f = checked_ids(loaded, req.ids), kept.features
    with shelf.lock:
        x = site_activations(loaded.model, idx, f.hook, off.on(loaded.model))
    values, order = f.encode(x[0, req.position]).cpu().sort(descending=True)
    switched = {i for hook, _, indices in off.features if hook == f.hook for i in indices}
    active = [{"index": i, "value": number(round(v, 6)), "off": i in switched, "row": kept.rows.get(i)}
              for v, i in zip(values.tolist(), order.tolist()) if v > 0]
    return {"hook": f.hook, "position": req.position, "token": token_json(loaded.tok, req.ids[req.position]),
            "k": f.sae.k, "features": active, "off": off.to_json()}


def feature_report(shelf, loaded, kept, req, off):
    """One feature: its row of the table, and with a text, its activation at every token. A text longer than the
    context is read in consecutive windows, as read a text reads it."""
    f = kept.features
    index = f.indices(req.feature)[0]
    tokens = []
    if req.text:
        ids, block, values = encode(loaded, req.text), loaded.model.config.block_size, []
        for start in range(0, len(ids), block):
            idx = checked_ids(loaded, ids[start:start + block])
            with shelf.lock:
                x = site_activations(loaded.model, idx, f.hook, off.on(loaded.model))
            values += f.encode(x[0])[:, index].tolist()
        tokens = [dict(token_json(loaded.tok, t), value=number(round(v, 6))) for t, v in zip(ids, values)]
    return {"hook": f.hook, "feature": index, "row": kept.rows.get(index), "tokens": tokens,
            "tokenizer_kind": loaded.tok.kind, "off": off.to_json()}
