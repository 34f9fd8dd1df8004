"""`bench.py features`: `analyze.py features` on the main job's model, timed as a user runs it, against the issue's
targets. The default config is trained first (its 4 x 128 shape kept with --min_tokens_per_param=0), unless
--out_dir names a run already trained, whose best checkpoint is copied into work_dir (the command trains its SAE
beside the checkpoint it reads, and the run's own SAEs stay as they are); then the whole command, activations
included, runs in a process of its own, whose wall time and peak memory (its largest resident set) are measured."""

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.common import REPO, device_name, own_work_dir, prepared_work_dir, train_run
from gptkit.base.errors import UserError
from gptkit.base.settings import parse_config

TARGETS = {"explained_variance": (">=", 0.92), "ce_loss_recovered": (">=", 0.97), "delta_loss": ("<=", 0.08),
           "dead_fraction": ("<", 0.05)}
SECONDS, PEAK_GB = 300, 1.0
# a process whose one child is the command: its children's peak resident set is the command's alone (this
# process's own children include the training run before it)
MEASURED = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "print(f'peak_kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr); "
            "sys.exit(code)")


@dataclass
class FeaturesBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-features"  # prepared data and the run (or --out_dir's checkpoint) go here
    out_dir: str = ""  # a run already trained to read ('' = train the default into work_dir/run first)
    layer: int = 2  # analyze.py features' settings: blocks.2.hook_resid_post
    features: int = 1024  # the SAE's features (analyze.py features --features)
    k: int = 16  # features kept active for each token (analyze.py features --k)
    extra: str = ""  # more analyze.py features options, space-separated (e.g. '--tokens=3000000')


def main(argv):
    cfg = parse_config(FeaturesBenchConfig, argv, prog="bench.py features")
    if cfg.out_dir:
        out = given_run(cfg)
    else:
        work = prepared_work_dir(cfg)
        out = work / "run"
        summary = train_run("default", ["config/shakespeare_char.py", "--min_tokens_per_param=0"], work, out, [])
        print(f"trained config/shakespeare_char.py --min_tokens_per_param=0: val loss {summary['final_val']:.4f} after "
              f"{summary['iters']:,} steps", flush=True)
    command = [sys.executable, str(REPO / "analyze.py"), "features", str(out), f"--layer={cfg.layer}",
               f"--features={cfg.features}", f"--k={cfg.k}", "--json", "--start_over=True", *cfg.extra.split()]
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}\n$ {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", MEASURED, *command], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise UserError(f"analyze.py features failed: {proc.stderr.strip().splitlines()[-1:]}")
    peak_gb = int(proc.stderr.strip().splitlines()[-1].removeprefix("peak_kib=")) / 2**20
    report(json.loads(proc.stdout), seconds, peak_gb)


def given_run(cfg):
    """A copy of --out_dir's best checkpoint in work_dir/given: the SAE the command trains (--start_over, so that
    it is timed) goes beside it, never over one the user's run holds."""
    from gptkit.run.run_folder import RunDir

    source = RunDir(cfg.out_dir).model_file("best")
    out = own_work_dir(cfg) / "given"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    shutil.copy2(source, out / "best.pt")
    print(f"copied {source} to {out} (the SAE timed here is trained there)", flush=True)
    return out


def report(answer, seconds, peak_gb):
    m = answer["metrics"]
    rows = [("whole command", f"{seconds:.0f} s", f"<= {SECONDS} s", seconds <= SECONDS),
            ("peak memory", f"{peak_gb:.2f} GB", f"<= {PEAK_GB} GB", peak_gb <= PEAK_GB),
            ("L0", f"{m['l0']:.1f}", "", True)]
    for name, (op, target) in TARGETS.items():
        value = m[name]
        met = value >= target if op == ">=" else value <= target if op == "<=" else value < target
        rows.append((name.replace("_", " "), f"{value:.4f}", f"{op} {target}", met))
    print(f"\n{'':<22} {'measured':>10} {'target':>10}")
    for name, value, target, met in rows:
        print(f"{name:<22} {value:>10} {target:>10}  {'met' if met else 'NOT met'}")
    print("\nthe 20 most frequent features (the first three contexts each, the token it fires on in [ ]):")
    for f in answer["features"][:20]:
        contexts = "  ".join(f"{b}[{t}]{a}".replace("\n", "↵") for b, t, a, _ in f["contexts"][:3])
        print(f"{f['index']:>5} {f['frequency']:>7.2%}  {contexts}")
