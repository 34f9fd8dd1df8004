"""`bench.py startup`: what a run's start-up costs and whether it decides the same, from the user's side.

- startup: process start to the run's first record (just before its first evaluation and step) of the default
  config, the first run on a machine (its wisdom measured, into a fresh cache) and the runs after it;
- same: the same command run again and again, idle and beside one and two busy processes: the shape, precision,
  attention path and kernels each run took, against the first's.

Whole runs idle and busy, their steps and the time they said against the time they took: `bench.py fair`.

--repo=PATH runs another checkout's train.py (e.g. one from before a change) the same way, in the same sitting."""

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.busy import busy
from benchmarks.common import REPO, device_name, prepared_work_dir, run_parts, train_as_a_user
from gptkit.base.settings import comma_items, parse_config, require
from gptkit.run.checkpoint import load_checkpoint
from gptkit.run.metrics import read_metrics

PARTS = ("startup", "same")


@dataclass
class StartupBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-startup"  # prepared data and the runs go here
    config: str = "config/shakespeare_char.py"  # the command measured (the run checkout's own file)
    repo: str = ""  # the checkout whose train.py runs ('' = this one)
    parts: str = "startup,same"  # which measurements, comma-separated
    runs: int = 10  # runs of the same command in each condition (same)
    reads: int = 3  # runs after the first, reading the machine's wisdom (startup)

    def __post_init__(self):
        require(self, ["runs", "reads"], lambda v: v >= 1, "at least 1")
        if set(comma_items(self.parts)) - set(PARTS) or not comma_items(self.parts):
            raise ValueError(f"parts must be some of {', '.join(PARTS)} (got {self.parts!r})")


def run_train(cfg, work, name, extra, wisdom):
    """train.py of cfg.repo with cfg.config and `extra`, into work/name, its wisdom in `wisdom`: (wall seconds
    from the command's start to its exit, its records, its out folder)."""
    repo = Path(cfg.repo).resolve() if cfg.repo else REPO
    wall, _, out = train_as_a_user(repo, cfg.config, work, name, extra, wisdom)
    return wall, read_metrics(out), out


def chosen(out):
    """(shape, precision, attention path, kernels) a run took, from its checkpoint."""
    ckpt = load_checkpoint(out / "latest.pt")
    measured, args = ckpt.get("measured", {}), ckpt["model_args"]
    return (f"{args['n_layer']}x{args['n_embd']}", measured.get("dtype"), measured.get("attention_path"),
            ",".join(measured.get("kernels", [])))


def startup(cfg, work, wisdom):
    """The first run's start-up (measuring into an empty cache), then each later one's."""
    print(f"\n== start-up to the first step: {cfg.config} --max_iters=1 (its max_time kept for the choices)")
    shutil.rmtree(wisdom, ignore_errors=True)
    for i in range(1 + cfg.reads):
        _, records, _ = run_train(cfg, work, f"startup_{i}", ["--max_iters=1"], wisdom)
        run = next(r for r in records if r["kind"] == "run")
        print(f"{'first run (measures)' if i == 0 else f'run {i + 1} (reads)':<22} {run['elapsed_s']:>6.2f} s",
              flush=True)


def same(cfg, work, wisdom):
    """cfg.runs runs of one command in each condition: how many took the first run's choices."""
    print(f"\n== the same command, {cfg.runs} runs each: {cfg.config} --max_iters=1")
    first = None
    for label, processes in (("idle", 0), ("one busy", 1), ("two busy", 2)):
        taken = []
        with busy(processes):
            for i in range(cfg.runs):
                taken.append(chosen(run_train(cfg, work, f"same_{processes}_{i}", ["--max_iters=1"], wisdom)[2]))
        first = first or taken[0]
        kinds = sorted(set(taken))
        print(f"{label:<9} {sum(t == first for t in taken)} of {cfg.runs} took {' '.join(first)}"
              + ("" if kinds == [first] else f"; others: {[k for k in kinds if k != first]}"), flush=True)


def main(argv):
    cfg = parse_config(StartupBenchConfig, argv, prog="bench.py startup")
    work = prepared_work_dir(cfg)
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}; train.py of {cfg.repo or REPO}")
    run_parts({"startup": startup, "same": same}, cfg, work)
