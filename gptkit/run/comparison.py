"""Runs side by side, as a learner compares them after changing one thing (a setting, or model.py) and
training again: each run's curves and what it trained with, read from its folder, and what differs between
two runs, in three parts: the settings, the model.py code, and the run's circumstances (steps, precision,
threads, attention path, data order, batch), which move a curve as much as an edit can."""

from dataclasses import dataclass, fields
from pathlib import Path

from gptkit.base.errors import UserError
from gptkit.machine.stand_ins import module_values
from gptkit.run.checkpoint import TRAINING_KEYS, Fields, load_checkpoint
from gptkit.run.formats import started_with
from gptkit.run.metrics import read_metrics, rl_run
from gptkit.run.run_folder import RunDir
from model import GPTConfig

# the checkpoint fields a comparison reads: latest.pt holds them all, best.pt all but the choices and batch
COMPARED = Fields({key: TRAINING_KEYS.kinds[key]
                   for key in ("model_args", "config", "iter_num", "model_code", "measured", "global_batch")},
                  optional=("model_code", "measured", "global_batch"))
# settings that say where a run writes, how it starts or what it prints: runs differing there learned alike
NOT_COMPARED = {"out_dir", "init_from", "start_over", "eval_only", "wandb_log", "wandb_project",
                "wandb_run_name", "verbose", "retime"}


@dataclass
class ComparedRun:
    """What a comparison reads of one run folder."""

    name: str  # as the picture and the lines call it
    records: list  # metrics.jsonl
    settings: dict  # every setting it trained with, flat: its config's, and its model's as built
    code: dict  # model_code: a fingerprint of each piece of model.py it trained with; None: not recorded
    measured: dict  # the choices the run made (gptkit/machine/choices.py), {} where the checkpoint has none
    steps: int
    global_batch: int  # sequences a step, over every process
    options: frozenset = frozenset()  # its model's settings (model_args): a learner's option among them

    @property
    def tokens_per_step(self):
        return self.global_batch * self.settings["block_size"]


def load_run(folder, name):
    """The run in folder: its latest state (best.pt where that is all it keeps) and its metrics."""
    run = RunDir(folder)
    path = next((p for p in (run.latest, run.legacy, run.best) if p.is_file()), None)
    if path is None:
        raise UserError(f"no run in {folder} (no latest.pt or best.pt); {run.train_first()}")
    ckpt = load_checkpoint(path, required=COMPARED)
    records = read_metrics(folder)
    iterations = [r["iter"] for r in records if r.get("kind") in ("train", "eval")]
    if not iterations and rl_run(records):
        raise UserError(f"{folder} is an rl.py run, which has no loss curve to compare; plot.py loss "
                        f"--out_dir={folder} draws its reward")
    if not iterations:
        raise UserError(f"{run.metrics} holds no train or eval records yet")
    # best.pt's iteration is its best, not how far the run went
    steps = max(iterations) if path == run.best else ckpt["iter_num"]
    # a model setting newer than the checkpoint: it was built at its default, as model_config builds it
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    settings = {k: v for k, v in ckpt["config"].items() if k != "model"} | defaults | ckpt["model_args"]
    return ComparedRun(name, records, settings, ckpt.get("model_code"), ckpt.get("measured", {}), steps,
                       ckpt.get("global_batch") or started_with(ckpt), frozenset(ckpt["model_args"]))


def run_names(folders):
    """Each folder's name, or the path as given where two folders share a name."""
    names = [Path(f).resolve().name for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders)]


def load_runs(folders):
    return [load_run(folder, name) for folder, name in zip(folders, run_names(folders))]


# ----------------------------------------------------------------------------- what differs

def known(value):
    """A setting that names a choice, or None where it left it to the run ('auto')."""
    return None if value in (None, "auto") else value


def attention_path(run):
    """The attention path the run chose; None where its attention has none to choose (additive or uniform scores
    run their own written-out code, and a bigram has no attention), whatever it recorded."""
    if run.settings.get("attention", "scaled") not in ("scaled", "dot") or run.settings.get("n_layer") == 0:
        return None
    return run.measured.get("attention_path") or known(run.settings.get("attention_path"))


def data_order(run):
    order = run.settings.get("batch_order", "random")
    return f"seed {run.settings.get('seed')}" + ("" if order == "random" else f", {order}")


# (name, the settings that decide it, its value for a run, in words: None where the run does not record it)
CIRCUMSTANCES = (
    ("steps", ("max_iters", "max_time"), lambda r: f"{r.steps:,}"),
    ("precision", ("dtype",), lambda r: r.measured.get("dtype") or known(r.settings.get("dtype"))),
    ("threads", ("threads",), lambda r: r.measured.get("threads") or r.settings.get("threads") or None),
    ("attention path", ("attention_path",), attention_path),
    ("data order", ("seed", "batch_order"), data_order),
    ("batch", ("batch_size", "gradient_accumulation_steps", "processes"),
     lambda r: f"{r.global_batch:,} sequences a step"),
)
DECIDED = {key for _, keys, _ in CIRCUMSTANCES for key in keys}


@dataclass
class Differences:
    """How a run differs from the one it is compared with (the base): items (what, the base's, the run's)."""

    settings: list
    code: dict  # {"changed", "added", "removed": [piece names]}; None where a run did not record its code
    circumstances: list

    def code_changed(self):
        return bool(self.code) and any(self.code.values())

    def things(self):
        """Each separate thing that differs: model.py, a setting no circumstance decides, a circumstance."""
        edits = ["model.py"] * self.code_changed() + [k for k, _, _ in self.settings if k not in DECIDED]
        return edits, [name for name, _, _ in self.circumstances]


class Unset:
    """A model setting one run has and the other's model.py had not (a learner's option, added or taken out)."""

    def __repr__(self):
        return "(none)"


UNSET = Unset()


def differences(base, run):
    # a training setting only one run has is another version's, whose value in the other run is not known; a
    # model setting is a learner's option (model.py's defaults fill those the model.py of now knows)
    keys = sorted((base.settings.keys() & run.settings.keys()) - NOT_COMPARED)
    settings = [(k, base.settings[k], run.settings[k]) for k in keys if base.settings[k] != run.settings[k]]
    settings += [(k, base.settings.get(k, UNSET), run.settings.get(k, UNSET))
                 for k in sorted((base.settings.keys() ^ run.settings.keys()) & (base.options | run.options))]
    code = None
    if base.code is not None and run.code is not None:
        ours, theirs = run.code, base.code
        values = module_values().keys()
        if not (ours.keys() & values and theirs.keys() & values):  # a run of an earlier version records functions alone
            ours, theirs = ({k: v for k, v in c.items() if k not in values} for c in (ours, theirs))
        code = {"changed": sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k]),
                "added": sorted(ours.keys() - theirs.keys()), "removed": sorted(theirs.keys() - ours.keys())}
    circumstances = []
    for name, _, value in CIRCUMSTANCES:
        theirs, ours = value(base), value(run)
        if None not in (theirs, ours) and theirs != ours:
            circumstances.append((name, theirs, ours))
    return Differences(settings, code, circumstances)


def shown(value):
    """A setting's value in a line: a string bare, unless empty or with blanks at its ends."""
    return value if isinstance(value, str) and value and value.strip() == value else repr(value)


def listed(words):
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def code_line(base, run, diff):
    if diff.code is None:
        lacking = listed(r.name for r in (base, run) if r.code is None)
        return f"model.py: not compared ({lacking}'s checkpoint, from an earlier version, does not record it)"
    parts = [f"{listed(names)} {what}" for what, names in diff.code.items() if names]
    return f"model.py: {'; '.join(parts)}" if parts else "model.py: the same code"


def describe(base, run, diff):
    """The lines saying how run differs from base: its settings, its model.py and its circumstances."""
    settings = ", ".join(f"{k} {shown(a)} → {shown(b)}" for k, a, b in diff.settings)
    lines = [f"{run.name} against {base.name}:", f"  settings: {settings or 'the same'}",
             f"  {code_line(base, run, diff)}"]
    if diff.circumstances:
        lines.append("  the runs: " + ", ".join(f"{name} {a} → {b}" for name, a, b in diff.circumstances))
    return lines


def besides_note(base, run, diff):
    """One line where more than one thing differs and a circumstance is among them, so that the curves do not
    show the learner's edit alone; None where the comparison is of one change."""
    edits, circumstances = diff.things()
    if not circumstances or len(edits) + len(circumstances) < 2:
        return None
    what = listed(f"{name} ({theirs} → {ours})" for name, theirs, ours in diff.circumstances)
    note = (f"note: besides {listed(edits)}, {run.name} differs from {base.name} in {what}: the comparison is not "
            "only your edit" if edits else
            f"note: {run.name} differs from {base.name} in {what}: the comparison is not of one change")
    if ("steps" in circumstances and all(r.measured.get("planned") for r in (base, run))
            and base.settings.get("max_time") == run.settings.get("max_time")):
        # max_time planned each run's steps at its own model's idle speed: an edit that steps faster trains more
        note += (f"; each trained the steps max_time plans at its own model's speed here (equal time): "
                 f"--max_iters={base.steps} gives {run.name} {base.name}'s steps")
    # a choice the run made for its own model (an edit the fused path cannot run takes the written one): pinned
    pinned = [f"--{key}={ours}" for name, theirs, ours in diff.circumstances for kind, key in PINNED if name == kind]
    if pinned:
        note += f"; {base.name} trained again with {' '.join(pinned)} holds {'them' * (len(pinned) > 1) or 'it'} equal"
    return note


PINNED = (("precision", "dtype"), ("attention path", "attention_path"), ("threads", "threads"))
