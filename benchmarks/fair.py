"""`bench.py fair`: whether two runs differ only by what the learner changed, never by the machine's load.

- steps: the default into a fresh wisdom cache, idle, then beside one and two busy processes: the steps, shape,
  precision and path each took, its final val loss and weights against the idle run's, and the wall time it said at
  the start against the one it took;
- first: a first run on a new machine (a fresh cache) measured beside two busy processes, a second beside them, then
  an idle start: whether the busy measurement was kept, marked busy, and read by the second, and the shape each
  trained;
- records: max_time 20 and 30 s beside three busy processes, with the timeline and snapshots and without: the share
  of the run its records took, and its steps against the run without them;
- edits: three edits to model.py (no 1/sqrt(d), GELU for ReLU^2, sinusoidal positions for rotary), each trained
  idle and beside one busy process, in a copy of this checkout: their order by final val loss in each condition
  (the unedited default's pair is steps' idle and one-busy runs).

Busy processes are `python -c "while True: pass"`, as a browser or a call keeps a laptop's core."""

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.busy import busy
from benchmarks.common import REPO, device_name, prepared_work_dir, run_parts, train_as_a_user
from gptkit.base.errors import UserError
from gptkit.base.settings import comma_items, parse_config
from gptkit.run.checkpoint import load_checkpoint
from gptkit.run.metrics import read_metrics

PARTS = ("steps", "first", "records", "edits")
# each edit as a learner makes it: a piece of model.py's text replaced by another
EDITS = {
    "no sqrt(d)": ("return dot_scores(attn, q, k) * (1.0 / math.sqrt(k.size(-1)))", "return dot_scores(attn, q, k)"),
    "GELU": ("return F.relu(x).square()", "return F.gelu(x)"),
    "sinusoidal": ("rotary = rotary_tables(self.config.n_embd // self.config.n_head, positions,\n"
                   "                                   self.config.rope_base)",
                   "half = torch.arange(0, self.config.n_embd, 2, device=idx.device) / self.config.n_embd\n"
                   "            angles = positions.float()[:, None] / 10000.0 ** half\n"
                   "            x = x + torch.cat((angles.sin(), angles.cos()), dim=-1)"),
}


@dataclass
class FairBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-fair"  # prepared data and the runs go here
    config: str = "config/shakespeare_char.py"  # the command compared
    parts: str = "steps,first,records,edits"  # which measurements, comma-separated
    budgets: str = "20,30"  # max_time seconds of the records' runs

    def __post_init__(self):
        if set(comma_items(self.parts)) - set(PARTS) or not comma_items(self.parts):
            raise ValueError(f"parts must be some of {', '.join(PARTS)} (got {self.parts!r})")


def run(cfg, repo, work, name, extra, wisdom, processes=0):
    """train.py of `repo` with cfg.config and `extra` beside `processes` busy ones: a dict of what it took and
    said."""
    with busy(processes):
        wall, stdout, out = train_as_a_user(repo, cfg.config, work, name, extra, wisdom)
    ckpt = load_checkpoint(out / "latest.pt")
    measured, args = ckpt.get("measured", {}), ckpt["model_args"]
    records = read_metrics(out)
    final = next(r for r in reversed(records) if r["kind"] == "final")
    return {"wall": wall, "said": said_seconds(stdout), "steps": ckpt["iter_num"], "val": final["val_loss"],
            "took": (f"{args['n_layer']}x{args['n_embd']}", measured.get("dtype"), measured.get("attention_path")),
            "records": records, "stdout": stdout, "weights": ckpt["model"]}


def weights_against(r, first):
    """Whether a run ended with the first's weights: bit for bit, or the largest difference of any weight."""
    if r is first:
        return ""
    gap = max((a.float() - b.float()).abs().max().item() for a, b in zip(r["weights"].values(),
                                                                          first["weights"].values()))
    return "; the idle run's weights bit for bit" if gap == 0 else f"; weights up to {gap:.2g} from the idle run's"


def said_seconds(stdout):
    """The wall time a run said at its start: the busy line's, where it said one, else the plan's idle seconds."""
    busy_line = re.search(r"in about (?:(\d+)m(\d+)s|(\d+) s) rather than", stdout)
    if busy_line:
        m, s, plain = busy_line.groups()
        return float(plain) if plain else 60 * float(m) + float(s)
    plan = re.search(r"about (\d+) s idle\)", stdout)
    return float(plan.group(1)) if plan else None


def steps(cfg, work, wisdom):
    print(f"\n== the same command idle and busy, a fresh wisdom cache: {cfg.config}", flush=True)
    shutil.rmtree(wisdom, ignore_errors=True)
    first = None
    for label, processes in (("idle", 0), ("one busy", 1), ("two busy", 2)):
        r = run(cfg, REPO, work, f"steps_{processes}", [], wisdom, processes)
        first = first or r
        said = f"{r['said']:.0f} s" if r["said"] else "nothing"
        print(f"{label:<9} {r['steps']:,} steps, {' '.join(r['took'])}: val {r['val']:.4f} "
              f"({r['val'] - first['val']:+.4f}); said {said}, took {r['wall']:.0f} s "
              f"({100 * (r['wall'] / r['said'] - 1) if r['said'] else float('nan'):+.1f}%); "
              f"{'the same' if (r['steps'], r['took']) == (first['steps'], first['took']) else 'NOT the same'}"
              f"{weights_against(r, first)}", flush=True)


def first(cfg, work, wisdom):
    print("\n== a first run measured beside two busy processes, a second beside them, then an idle start", flush=True)
    shutil.rmtree(wisdom, ignore_errors=True)
    busy_run = run(cfg, REPO, work, "first_busy", ["--max_iters=1"], wisdom, 2)
    marked = (wisdom / "wisdom.json").exists() and '"busy"' in (wisdom / "wisdom.json").read_text()
    note = next((line for line in busy_run["stdout"].splitlines() if "other programs held" in line), "no note")
    again_run = run(cfg, REPO, work, "second_busy", ["--max_iters=1"], wisdom, 2)
    idle_run = run(cfg, REPO, work, "first_idle", ["--max_iters=1"], wisdom)
    print(f"beside two busy: {' '.join(busy_run['took'])}; kept, marked busy: {marked}\n  {note}\n"
          f"again beside two busy: {' '.join(again_run['took'])}; measured again: {measured(again_run)}\n"
          f"then idle: {' '.join(idle_run['took'])}; measured again: {measured(idle_run)}", flush=True)


def measured(result):
    return "measuring this machine once" in result["stdout"]


def records(cfg, work, wisdom):
    print("\n== what the records cost beside three busy processes", flush=True)
    for seconds in comma_items(cfg.budgets):
        # the idle measurement a learner's first run with this budget leaves (the shape follows the budget)
        run(cfg, REPO, work, f"records_measuring_{seconds}", [f"--max_time={seconds}", "--max_iters=1"], wisdom)
        plain = run(cfg, REPO, work, f"records_off_{seconds}", [f"--max_time={seconds}", "--timeline=False",
                                                                "--snapshots=0"], wisdom, 3)
        kept = run(cfg, REPO, work, f"records_on_{seconds}", [f"--max_time={seconds}"], wisdom, 3)
        final = next(r for r in reversed(kept["records"]) if r["kind"] == "final")
        spent, n = final.get("records_s", 0.0), sum(r["kind"] == "timeline" for r in kept["records"])
        print(f"max_time {seconds} s: {n} records took {spent:.2f} s of {kept['wall']:.0f} s "
              f"({100 * spent / kept['wall']:.1f}%); {kept['steps']:,} steps against {plain['steps']:,} without "
              f"them ({100 * kept['steps'] / plain['steps']:.0f}%)", flush=True)


def edited_checkout(name, folder):
    """A copy of this checkout whose model.py carries the edit `name` (or none)."""
    copy = folder / re.sub(r"\W+", "_", name)
    def left_out(folder, names):  # git's files, runs, caches, and the root's prepared datasets (data/prepare.py kept)
        root = Path(folder) == REPO
        return [n for n in names if n in (".git", "__pycache__") or root and n.startswith("out") or
                Path(folder) == REPO / "data" and n != "prepare.py"]

    shutil.copytree(REPO, copy, ignore=left_out)
    if name in EDITS:
        old, new = EDITS[name]
        text = (copy / "model.py").read_text()
        if old not in text:
            raise UserError(f"model.py no longer holds the text the {name!r} edit replaces")
        (copy / "model.py").write_text(text.replace(old, new))
    return copy


def edits(cfg, work, wisdom):
    print("\n== three edits to model.py, idle and beside one busy process", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-edits-") as folder:
        losses = {}
        for name in EDITS:  # the unedited default's pair is the steps part's idle and one-busy runs
            repo = edited_checkout(name, Path(folder))
            for label, processes in (("idle", 0), ("one busy", 1)):
                r = run(cfg, repo, work, f"edit_{repo.name}_{processes}", [], wisdom, processes)
                losses[name, label] = r["val"]
                print(f"{name:<11} {label:<9} {r['steps']:,} steps, {' '.join(r['took'])}: val {r['val']:.4f}, "
                      f"{r['wall']:.0f} s", flush=True)
    for label in ("idle", "one busy"):
        order = sorted(EDITS, key=lambda n: losses[n, label])
        print(f"order {label:<9}: {' < '.join(order)}")
    print("pairs: " + ", ".join(f"{n} {losses[n, 'one busy'] - losses[n, 'idle']:+.4f}" for n in EDITS))


def main(argv):
    cfg = parse_config(FairBenchConfig, argv, prog="bench.py fair")
    work = prepared_work_dir(cfg)
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}")
    run_parts({"steps": steps, "first": first, "records": records, "edits": edits}, cfg, work.resolve())
