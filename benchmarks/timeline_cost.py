"""`bench.py timeline`: what the timeline costs, and the induction lesson against its targets.

--parts=cost: the default config trained with and without its timeline (--timeline=False), in alternating runs
of the same steps (max_time=0, max_iters as the default's own time-budgeted run took), the training time of each
from its metrics; and how much the default run's folder grows with its timeline and snapshots.
--parts=induction: `python train.py config/induction.py` timed whole, then its model against the lesson's targets:
the best layer-1 induction score at the first record and at the end, every layer-0 head's, the loss on the first
and second copies of fresh repeated strings, what ablating the induction heads does to each, and the phase change
located."""

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import REPO, device_name, prepared_work_dir, train_run
from gptkit.base.errors import UserError
from gptkit.base.settings import comma_items, parse_config, require
from gptkit.interp.induction import induction_report
from gptkit.run.metrics import read_metrics

PARTS = ("cost", "induction")


@dataclass
class TimelineBenchConfig:
    input: str = ""  # text the cost part trains on ('' = data/shakespeare_char/input.txt)
    work_dir: str = "out-bench-timeline"  # prepared data and the runs go here
    parts: str = "cost,induction"  # which parts to run
    pairs: int = 3  # the cost part's runs with and without the timeline, alternating
    repeats_dir: str = ""  # the induction part's data_dir holding data/repeats ('' = this project's data/)

    def __post_init__(self):
        require(self, ["pairs"], lambda v: v >= 1, "at least 1")
        unknown = [p for p in comma_items(self.parts) if p not in PARTS]
        if unknown:
            raise ValueError(f"parts: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")


def training_seconds(out):
    """Seconds from the run's first step to its last logged one, as its metrics say (start-up and the final score
    left out: the timeline records within the loop)."""
    records = read_metrics(out)
    start = next(r for r in records if r["kind"] == "run")["elapsed_s"]
    last = max(r["elapsed_s"] for r in records if r["kind"] in ("train", "eval", "timeline"))
    return last - start


def folder_mb(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 1e6


def cost(cfg):
    work = prepared_work_dir(cfg)
    default = ["config/shakespeare_char.py"]
    summary = train_run("default", default, work, work / "default", [])
    train_run("default without a timeline", [*default, "--timeline=False", "--snapshots=0"], work,
              work / "bare", [])
    steps = summary["iters"]
    grown = folder_mb(work / "default") - folder_mb(work / "bare")
    print(f"\nthe default run: {steps:,} steps; its folder {folder_mb(work / 'default'):.1f} MB, "
          f"{grown:+.1f} MB against the same run without its timeline and snapshots (target: at most +20 MB)")
    seconds = {True: [], False: []}
    for pair in range(cfg.pairs):
        for timeline in (False, True):
            out = work / f"fixed-{timeline}-{pair}"
            train_run(f"pair {pair}, timeline={timeline}", [*default, "--max_time=0", f"--max_iters={steps}",
                                                           f"--timeline={timeline}", "--snapshots=0"], work, out, [])
            seconds[timeline].append(training_seconds(out))
    with_, without = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(f"\n{steps:,} steps of the default, {cfg.pairs} runs each, alternating: training {without:.1f} s without "
          f"the timeline, {with_:.1f} s with it (medians; runs {', '.join(f'{s:.1f}' for s in seconds[False])} and "
          f"{', '.join(f'{s:.1f}' for s in seconds[True])}): the timeline costs {with_ / without - 1:+.1%} "
          "(target: at most 3%)")


def induction(cfg):
    out = REPO / "out-bench-induction"
    command = [sys.executable, str(REPO / "train.py"), "config/induction.py", f"--out_dir={out}", "--start_over=True",
               *([f"--data_dir={cfg.repeats_dir}"] if cfg.repeats_dir else [])]
    print(f"$ {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    if subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL).returncode:
        raise UserError("the induction preset's run failed; run it alone to see why")
    whole = time.perf_counter() - start
    print(f"\nthe whole run: {whole:.0f} s (target: at most 300 s)")
    for line in induction_report(out):
        print(line)


def main(argv):
    cfg = parse_config(TimelineBenchConfig, argv, prog="bench.py timeline")
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}", flush=True)
    parts = comma_items(cfg.parts)
    if "cost" in parts:
        cost(cfg)
    if "induction" in parts:
        induction(cfg)
