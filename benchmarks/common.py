"""What several benchmarks share: the machine's name, comma-separated options, the text the training benchmarks
prepare, train.py runs and what each one reached, and one training step taken as train.py takes it."""

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from gptkit.base.errors import UserError
from gptkit.base.settings import comma_items
from gptkit.machine.choices import choose, on_speed_path
from gptkit.machine.runtime import Runtime, compile_blocks
from gptkit.machine.timing import matmul_peak, synchronize
from gptkit.run.metrics import read_metrics
from gptkit.training.updates import schedulable, step_optimizers
from model import GPT

REPO = Path(__file__).resolve().parents[1]  # where the commands the benchmarks run (train.py, explore.py) live


def device_name(device):
    """What the numbers were measured on, e.g. 'Intel(R) Xeon(R) Processor, 2 cores'."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    if device != "cpu":
        return device
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def rate(value, form):
    return "n/a" if value is None else form.format(value)


def fmt_s(seconds):
    return f"{seconds:.1f} s" if seconds is not None else "never"


def bench_input(cfg):
    """The text a benchmark starts from: cfg.input, or the tinyshakespeare that data/prepare.py downloads."""
    if cfg.input:
        return cfg.input
    path = REPO / "data/shakespeare_char/input.txt"
    if not path.exists():
        raise UserError("no tinyshakespeare here: run `python data/prepare.py` first or pass --input=PATH")
    return str(path)


WORK_MARK = ".bench-work"  # in a folder a benchmark has made its own: it replaces what it made there


def own_work_dir(cfg):
    """cfg.work_dir, made the benchmark's own: it replaces the runs and datasets it makes there, so a folder that
    holds files without a benchmark's mark (yours: your runs, your data/) is refused in one line. A benchmark's
    default folder (out-bench-...) from before the mark is taken as one."""
    work = Path(cfg.work_dir)
    if work.is_dir() and not (work / WORK_MARK).exists() and not work.resolve().name.startswith("out-bench"):
        found = sorted(p.name for p in work.iterdir())
        if found:
            shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
            raise UserError(f"--work_dir={cfg.work_dir} holds files no benchmark made ({shown}); a benchmark replaces "
                            "the runs and datasets it makes in its folder: give it a new or empty one")
    work.mkdir(parents=True, exist_ok=True)
    (work / WORK_MARK).touch()
    return work


def prepared_work_dir(cfg):
    """A training benchmark's work folder, its text (cfg.input, or tinyshakespeare) prepared in work/data."""
    from gptkit.data.preparing import PrepareConfig, prepare

    work = own_work_dir(cfg)
    # the benchmark's own folder: a dataset an earlier run left there of another --input is replaced
    prepare(PrepareConfig(input=bench_input(cfg), name="shakespeare_char", data_dir=str(work / "data"),
                          start_over=True))
    return work


def run_summary(out_dir, targets, wall_s):
    """What a finished run reached and how fast: times to each target (seconds since its process started),
    the whole-split val loss at the end, its iterations, and, from its first and last train records, tokens/s
    and achieved FLOP/s against this machine's matmul peak (None with fewer than two train records)."""
    records = read_metrics(out_dir)
    run = next(r for r in records if r["kind"] == "run")
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    final = next(r for r in reversed(records) if r["kind"] == "final")
    tok_s = gflops = peak_pct = None
    if len(trains) >= 2 and trains[-1]["elapsed_s"] > trains[0]["elapsed_s"]:
        first, last = trains[0], trains[-1]
        tok_s = (last["tokens"] - first["tokens"]) / (last["elapsed_s"] - first["elapsed_s"])
        flops = tok_s * run["flops_per_token"]
        gflops, peak_pct = flops / 1e9, 100 * flops / matmul_peak(run["dtype"], run["device"])
    return {"wall_s": wall_s, "final_val": final["val_loss"], "iters": final["iter"], "dtype": run["dtype"],
            "tok_s": tok_s, "gflops": gflops, "peak_pct": peak_pct,
            "hit": {t: next((r["elapsed_s"] for r in evals if r["val_loss"] <= t), None) for t in targets},
            "evals": evals}


def clear_run_folder(out_dir):
    """Empty a benchmark's run folder for a new run, under its lock: a run still training there is refused in one
    line, never deleted from under it."""
    from gptkit.run.run_folder import RunDir

    with RunDir(out_dir).locked():
        shutil.rmtree(out_dir)


def train_run(name, args, work, out_dir, targets, dataset="shakespeare_char"):
    """train.py with args on the dataset prepared in work, into out_dir (emptied first), to its end; its run_summary."""
    clear_run_folder(out_dir)
    cmd = [sys.executable, str(REPO / "train.py"), *args, f"--data_dir={work / 'data'}", f"--dataset={dataset}",
           f"--out_dir={out_dir}"]
    print(f"\n== {name}: {' '.join(map(str, cmd[1:]))}", flush=True)
    start = time.time()
    if subprocess.run(cmd, cwd=REPO).returncode:
        raise UserError(f"the {name} run failed")
    return run_summary(out_dir, targets, time.time() - start)


def training_step(tcfg, device, vocab_size=65):
    """One optimizer step of tcfg's model on random tokens, as a function, taken as train.py takes it: a Runtime
    for the device (which also keeps freed memory and allows TF32, as train.py's does), the precision and
    attention path settled and its kernels installed as gptkit.training.state does for a fresh run, its optimizers and
    gradient scaler as TrainState builds them, the blocks compiled where tcfg says so, and gptkit.training.state's clip,
    step and clear.
    Returns the step, the model, the precision and the attention path taken. The one place the benchmarks use
    the training's pieces."""
    rt = Runtime(device, tcfg.dtype)
    planned = replace(tcfg.model, vocab_size=vocab_size)
    # a fresh run has nothing saved, and this model stays as configured: no other shape is fitted
    _, _, choices = choose(replace(tcfg, min_tokens_per_param=0.0), rt, planned)
    torch.manual_seed(0)  # every candidate starts from the same weights
    model = on_speed_path(GPT(planned).to(rt.device), choices)
    path = choices.attention_path
    optimizers = schedulable(model.configure_optimizers(tcfg, rt.dtype))
    scaler = torch.amp.GradScaler(rt.device.split(":")[0], enabled=rt.dtype == "float16")
    if tcfg.compile:
        compile_blocks(model)
    x = torch.randint(vocab_size, (tcfg.batch_size, tcfg.model.block_size), device=rt.device)

    def step():
        with rt.autocast:
            loss = model(x, x)[1]
        scaler.scale(loss).backward()
        step_optimizers(model, optimizers, scaler, tcfg.grad_clip)

    return step, model, rt.dtype, path


def seconds_per_step(step, steps, device):
    """The mean seconds of `steps` calls of step(), the device's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def run_parts(parts, cfg, work):
    """Each of the benchmark's parts that cfg.parts names, in turn, as parts[name](cfg, work, wisdom): their runs
    read and write a wisdom cache of their own (a fresh machine's), never the user's."""
    with tempfile.TemporaryDirectory(prefix="bench-wisdom-") as folder:
        wisdom = Path(folder) / "wisdom"
        for part in comma_items(cfg.parts):
            parts[part](cfg, work, wisdom)


def train_as_a_user(repo, config, work, name, extra, wisdom):
    """train.py of checkout `repo` with its config file and `extra` on work's prepared tinyshakespeare, into
    work/name (emptied first), its wisdom in `wisdom`: (wall seconds from the command's start to its exit, its
    stdout, its out folder); one line where it failed."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(repo / "train.py"), str(repo / config), f"--data_dir={work / 'data'}",
           "--dataset=shakespeare_char", f"--out_dir={out}", "--device=cpu", *extra]
    start = time.time()
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "GPTKIT_WISDOM_DIR": str(wisdom)})
    wall = time.time() - start
    if proc.returncode:
        raise UserError(f"the {name} run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return wall, proc.stdout, out
