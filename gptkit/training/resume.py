"""Continuing a run: the saved state it continues from (checked, falling back to the state before it when the
latest is damaged) and the settings it continues with (the checkpoint's, except those given again)."""

from dataclasses import asdict, fields, replace

import torch

from gptkit.base.errors import UserError
from gptkit.base.settings import coerce, flatten, resumed, settings
from gptkit.machine.stand_ins import changed_since
from gptkit.run.checkpoint import (SHAPE_KEYS, TRAINING_KEYS, AnotherToolsState, load_checkpoint, model_config,
                                   model_header, model_shape, shape_words)
from gptkit.training.train_config import BATCH_KEYS, TrainConfig
from model import GPTConfig

# what the saved weights and optimizer state are shaped by
FIXED_ON_RESUME = SHAPE_KEYS + ("optimizer",)


def continued_config(cfg, given, asked, run, note, configured=None):
    """(the config this run trains with, (checkpoint, its path) or (None, None)): a resumed run continues with
    its checkpoint's settings but those given again (asked: the keys the command line gives); 'auto' with nothing
    to resume starts as the config files say (`configured`: their init_from, a base run to fine-tune, say), else
    from scratch."""
    ckpt, path = resume_state(run, cfg.init_from, note)
    if ckpt is None:
        return (replace(cfg, init_from=fresh_start(run, configured, note)) if cfg.init_from == "auto" else cfg), \
            (None, None)
    changed = changed_since(ckpt.get("model_code"))
    if changed:  # as a tool that loads the checkpoint says it
        note(f"note: model.py has changed since {path} was saved ({', '.join(changed[:4])}"
             f"{', ...' if len(changed) > 4 else ''}): the run continues with the code as it is now, not the code "
             "it trained with so far")
    return resumed_config(ckpt, given, asked, path, note), (ckpt, path)


def fresh_start(run, configured, note):
    """Where --init_from=auto starts a run that has no state to continue: where its config files start it (a fine-tune
    from its base run, said in a note, rather than a model of the default shape from scratch), else scratch."""
    if configured in (None, "auto", "resume", "scratch"):
        return "scratch"
    note(f"note: {run.path} holds no state to continue; the run starts as its config file says, init_from={configured}")
    return configured


def claim_for_a_new_run(cfg, run, note, configured=None, move=True):
    """A run that starts afresh (from scratch, pretrained weights, or 'auto' finding no state to continue) into a
    folder holding another run's files: refused, or with start_over those files moved aside (RunDir's
    clear_for_a_new_run; with move=False, the refusals alone). A fine-tune into the very folder it starts from is
    refused before anything moves. configured: the init_from of the config files, where 'auto' starts afresh."""
    if cfg.init_from == "resume" or cfg.init_from == "auto" and run.resume_candidates():
        return
    start = configured if cfg.init_from == "auto" else cfg.init_from
    if isinstance(start, str) and start not in ("scratch", "resume", "auto") and run.is_at(start):
        raise UserError(f"out_dir and init_from are the same folder, {run.path}: a fine-tune starts from the run "
                        "there and trains a new one in a folder of its own; give it another --out_dir")
    # 'auto' too, where nothing is left to continue from: it would start afresh over them
    how = "; continue it with --init_from=auto," if cfg.init_from != "auto" else \
        " but no saved state to continue it from (latest.pt);"
    run.clear_for_a_new_run(cfg.start_over, how, note, auto=cfg.init_from == "auto", move=move)


def resume_state(run, init_from, note):
    """(checkpoint, its path) to continue from, or (None, None) to start afresh: 'resume' needs a saved state,
    'auto' takes one where there is any. A damaged or missing latest.pt falls back to the one before it,
    with a note saying so; when every saved state is damaged, one error names them all. Another tool's state
    (rl.py's), or another run's, is refused, never passed over: this run's saves would replace it."""
    if init_from not in ("resume", "auto"):
        return None, None
    candidates = run.resume_candidates()
    if not candidates:
        if init_from == "auto":
            return None, None
        raise UserError(f"nothing to resume in {run.path} (no latest.pt, latest.prev.pt or ckpt.pt); "
                        "start the run with --init_from=scratch or --init_from=auto")
    problems = [] if run.latest.exists() or not run.previous.exists() else \
        [f"{run.latest} is missing (its save was interrupted)"]
    for path in candidates:
        try:
            ckpt = load_checkpoint(path, required=TRAINING_KEYS)
            refuse_unusable_numbers(ckpt, path)
            saved_settings(ckpt, path)
        except AnotherToolsState:  # resuming the state before it would save over it: the other run's state lost
            raise
        except UserError as e:
            problems.append(str(e))
            continue
        refuse_another_runs(ckpt, path, run)
        if problems:
            note(f"note: {'; '.join(problems)}; resuming from {path} (iteration {ckpt['iter_num']})")
        return ckpt, path
    raise UserError("; ".join(problems))


def refuse_another_runs(ckpt, path, run):
    """A state whose model is of another shape than best.pt's is another run's (its latest.pt copied in): resumed,
    it would drop this run's later snapshots and records and replace its best.pt with the other model."""
    try:
        best = model_header(run.best)["model_args"] if run.best.exists() else None
    except UserError:  # a damaged best.pt tells nothing of the run: the resume goes on, and its next best replaces it
        return
    if best is None:
        return
    if model_shape(ckpt["model_args"]) != model_shape(best):
        raise UserError(f"{path} holds a {shape_words(ckpt['model_args'], best)} model, {run.best} a "
                        f"{shape_words(best, ckpt['model_args'])} one: they are not one run's; move one away, or "
                        "start over with --init_from=scratch --start_over=True")


def refuse_unusable_numbers(ckpt, path):
    """A state whose numbers cannot be trained on is damaged, whatever its checksum says (files from before
    checksums, or a run that saved a broken state): say so, rather than let the first step blow up."""
    for where, tensors in [("weights", ckpt["model"].items()), ("optimizer state", optimizer_tensors(ckpt))]:
        for name, t in tensors:
            if not t.is_floating_point():
                continue
            wrong = "non-finite" if not torch.isfinite(t).all() else "negative" if name == "exp_avg_sq" and \
                (t < 0).any() else None
            if wrong:
                raise UserError(f"{path} is damaged: {wrong} values in {name} of its {where}, "
                                "which no training run writes")


def optimizer_tensors(ckpt):
    return [(name, t) for opt in ckpt["optimizer"] for per_param in opt.get("state", {}).values()
            for name, t in per_param.items() if isinstance(t, torch.Tensor)]


def resumed_config(ckpt, given, asked, path, note):
    """The config a resumed run continues with: the checkpoint's settings, overridden by those given again
    (config files or --key=value; the batch settings on the command line only: own_batch). The model's shape and
    the optimizer are the checkpoint's; giving another value is refused, naming the key (giving the shape a time
    budget made smaller is not another value)."""
    saved = saved_settings(ckpt, path)
    fitted_from = ckpt.get("measured", {}).get("fitted_from", {})  # what was configured before its budget fitted it
    given = {key: value for key, value in given.items() if key not in fitted_from or value != fitted_from[key]}
    given = own_batch(given, asked, saved, note)
    for key in FIXED_ON_RESUME:
        if key in given and given[key] != saved.get(key):
            raise UserError(f"{key}={given[key]!r} differs from {path}'s {saved.get(key)!r}; a resumed run keeps "
                            "its model's shape and optimizer (start a new out_dir to change them)")
    return resumed(TrainConfig, saved, given, path)


# the command's way into the run, not settings the run trains with
NOT_SETTINGS = ("out_dir", "init_from", "start_over", "eval_only")


def given_anew(ckpt, path, cfg):
    """The settings a continued run takes anew, said as `key old → new`, in the order TrainConfig lists them."""
    saved, now = saved_settings(ckpt, path), flatten(TrainConfig, asdict(cfg))
    return [f"{key} {saved[key]!r} → {value!r}" for key, value in now.items()
            if key in saved and key not in NOT_SETTINGS and saved[key] != value]


def own_batch(given, asked, saved, note):
    """given, less the batch settings (BATCH_KEYS) that only config files give: a resumed run keeps its own, and
    its global batch with them, unless the command line gives them anew. A config file given again repeats the
    run, but it names the values from before a command line changed them: `config/shakespeare_char.py
    --batch_size=4 --processes=2`, continued by the same file and `--init_from=auto` on one process, took the
    file's 32 sequences a step where the run had taken 8. A value kept over the file's is said in a note."""
    # (a checkpoint of an early version that saved no such key takes the file's)
    from_file = [key for key in BATCH_KEYS if key in given and key not in asked and key in saved]
    for key in from_file:
        if given[key] != saved[key]:
            note(f"note: the config file's {key}={given[key]} is not the {saved[key]} this run was saved with: it "
                 f"keeps {saved[key]}, and its global batch (--{key}={given[key]} would change them)")
    return {key: value for key, value in given.items() if key not in from_file}


def saved_settings(ckpt, path):
    """The settings saved in a checkpoint, flat, each of its type and among its choices as a config file's
    value must be: one of another type is damage (no run saves it), named with its key."""
    # model settings model.py no longer takes (a choice taken out): said as such, not as damage
    model_config(ckpt, path, weighed=False)
    saved = flatten(TrainConfig, ckpt["config"])
    saved.pop("processes", None)  # how many processes that command started, not a setting of the run
    # the model as built (a GPT-2 start takes its shape from the weights); a model setting newer than the
    # checkpoint was built at its default, which model_config gives it too
    saved.update({f.name: f.default for f in fields(GPTConfig)} | ckpt["model_args"])
    known = settings(TrainConfig)  # all but vocab_size, which the checkpoint's schema checks
    return {key: coerce(known[key], value, f"{path} is damaged: its saved config", from_text=False)
            if key in known else value for key, value in saved.items()}
