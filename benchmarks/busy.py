"""`bench.py busy`: the default trained on an idle machine and beside processes that keep a core busy the whole
time (a spinning `python -c "while True: pass"`), seed by seed, each busy run just after the idle one of its seed:
the shape and precision each picked, its start-up (process start to the first step), its whole-split val loss.
With --lab, the attention lab idle and beside one busy process: whether its rungs keep the ladder's order."""

import json
import statistics
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from benchmarks.common import REPO, device_name, prepared_work_dir, train_run
from gptkit.base.errors import UserError
from gptkit.base.settings import check_seed, comma_items, parse_config, require
from gptkit.run.checkpoint import load_checkpoint
from gptkit.run.metrics import read_metrics

# the ladder's order: in each pair, the first rung's val loss below the second's
LADDER = (("modern", "blocks"), ("modern", "four_heads"), ("blocks", "scaled"), ("four_heads", "scaled"),
          ("scaled", "uniform"), ("uniform", "bigram"))


@dataclass
class BusyBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-busy"  # prepared data and the runs go here
    config: str = "config/shakespeare_char.py"  # the run trained idle and beside busy processes
    seeds: str = "1337,1338,1339,1340,1341"  # one idle run and one beside a busy process per seed
    two_busy: int = 3  # the first this many seeds also train beside two busy processes
    lab: bool = False  # instead: the lab idle once, then lab_runs times beside one busy process
    lab_runs: int = 3  # lab runs beside one busy process

    def __post_init__(self):
        for seed in self.seed_list():
            check_seed(seed)
        require(self, ["two_busy", "lab_runs"], lambda v: v >= 0, "at least 0")

    def seed_list(self):
        try:
            seeds = [int(s) for s in comma_items(self.seeds)]
        except ValueError:
            raise ValueError(f"seeds must be integers, comma-separated (got {self.seeds!r})") from None
        if not seeds:
            raise ValueError("seeds must name at least one")
        return seeds


@contextmanager
def busy(processes):
    """`processes` spinning Pythons, each keeping a core busy until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def trained(work, name, args):
    """A run of train.py to its end: its shape, precision, start-up seconds and whole-split val loss."""
    out = work / name
    summary = train_run(name, args, work, out, [])
    ckpt = load_checkpoint(out / "latest.pt")
    run = next(r for r in read_metrics(out) if r["kind"] == "run")
    shape = f"{ckpt['model_args']['n_layer']} x {ckpt['model_args']['n_embd']}"
    return {"shape": shape, "dtype": run["dtype"], "start_s": run["elapsed_s"], "val": summary["final_val"],
            "iters": summary["iters"]}


def main(argv):
    cfg = parse_config(BusyBenchConfig, argv, prog="bench.py busy")
    work = prepared_work_dir(cfg)
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}")
    if cfg.lab:
        return lab_main(cfg, work)
    results = {"idle": [], "one busy": [], "two busy": []}
    for i, seed in enumerate(cfg.seed_list()):
        for label, processes in [("idle", 0), ("one busy", 1), ("two busy", 2)]:
            if processes == 2 and i >= cfg.two_busy:
                continue
            with busy(processes):
                run = trained(work, f"{label.replace(' ', '_')}_{seed}", [cfg.config, "--device=cpu", f"--seed={seed}"])
            results[label].append(dict(run, seed=seed))
            print(f"-- {label}, seed {seed}: {run['shape']}, {run['dtype']}, first step at {run['start_s']:.1f} s, "
                  f"{run['iters']:,} iterations, val loss {run['val']:.4f}", flush=True)
    print_busy_table(results)


def print_busy_table(results):
    """Every run beside the idle run of its seed, then each condition's mean val loss, how many runs picked the
    idle run's shape and precision, and the slowest start-up."""
    idle = {r["seed"]: r for r in results["idle"]}
    print(f"\n{'seed':>5} {'condition':<9} {'shape':>8} {'precision':>9} {'first step':>10} {'val loss':>8}  "
          "same choices as idle")
    for label, runs in results.items():
        for r in runs:
            same = (r["shape"], r["dtype"]) == (idle[r["seed"]]["shape"], idle[r["seed"]]["dtype"])
            print(f"{r['seed']:>5} {label:<9} {r['shape']:>8} {r['dtype']:>9} {r['start_s']:>8.1f} s {r['val']:>8.4f}"
                  f"  {'yes' if same else 'no'}")
    print()
    for label, runs in results.items():
        if not runs:
            continue
        same = sum((r["shape"], r["dtype"]) == (idle[r["seed"]]["shape"], idle[r["seed"]]["dtype"]) for r in runs)
        print(f"{label:<9}: mean val loss {statistics.mean(r['val'] for r in runs):.4f} over {len(runs)} runs; "
              f"idle's shape and precision in {same} of {len(runs)}; first step at most "
              f"{max(r['start_s'] for r in runs):.1f} s")


def lab_main(cfg, work):
    """The lab idle, then beside one busy process lab_runs times: each run's val loss per rung, and whether they
    keep the ladder's order."""
    for i in range(cfg.lab_runs + 1):
        label = "idle" if i == 0 else f"one busy, run {i}"
        out = work / f"lab_{i}"
        command = [sys.executable, str(REPO / "lab.py"), f"--data_dir={work / 'data'}", f"--out_dir={out}"]
        with busy(0 if i == 0 else 1):
            if subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL).returncode:
                raise UserError(f"the lab failed ({label}); run {' '.join(command)} to see why")
        rungs = dict.fromkeys(rung for pair in LADDER for rung in pair)
        losses = {rung: json.loads((out / rung / "lab.json").read_text())["val_loss"] for rung in rungs}
        kept = all(losses[a] < losses[b] for a, b in LADDER)
        print(f"lab, {label}: " + ", ".join(f"{rung} {loss:.3f}" for rung, loss in losses.items()) +
              f"; the ladder's order {'kept' if kept else 'NOT kept'}", flush=True)
