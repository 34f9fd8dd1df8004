"""`bench.py chat`: the chat lesson's pipeline run as a learner runs it, each stage timed and scored against the
targets.

--parts=pipeline: the main job's default run (the base), the tasks prepared with tinyshakespeare mixed in, SFT
(config/chat_sft.py), LoRA at rank 8 (config/chat_lora.py) for as long as SFT took, by the clock, the early SFT
(config/chat_sft_early.py) and RL from it (config/chat_rl.py); each stage scored by chat.py --eval on the held-out
problems and the plain text, RL's start and end with pass@1, 8 and 64; chat.py's first token; how far full SFT moved
the base's matrices (what LoRA would have to reach); the report card.
--parts=reversed: plain against reversed-digit sums (Lee et al. 2023) in the same steps: a dataset of each, fine-tuned
from the same base with config/chat_sft.py, each scored on 1,000 held-out sums."""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.common import REPO, bench_input, device_name, own_work_dir
from gptkit.base.errors import UserError
from gptkit.base.settings import comma_items, parse_config, require
from gptkit.run.checkpoint import load_checkpoint

PARTS = ("pipeline", "reversed")
LORA_STEPS_AT_MOST = 100_000  # LoRA's steps end at SFT's seconds, long before these


@dataclass
class ChatBenchConfig:
    input: str = ""  # the base's text and the text mixed in ('' = data/shakespeare_char/input.txt)
    work_dir: str = "out-bench-chat"  # the datasets and every stage's run go here
    parts: str = "pipeline,reversed"  # which parts to run
    rl_task: str = "addition"  # the task RL practises
    rl_eval: int = 200  # held-out problems scored with 64 samples before and after RL

    def __post_init__(self):
        require(self, ["rl_eval"], lambda v: v >= 1, "at least 1")
        unknown = [p for p in comma_items(self.parts) if p not in PARTS]
        if unknown:
            raise ValueError(f"parts: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")


def timed(*args):
    """Run a command of this project to its end: its seconds, wall clock, from start to exit."""
    start = time.time()
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise UserError(f"{' '.join(map(str, args))} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return time.time() - start


def scores(out_dir, *extra):
    """chat.py --eval --json on a run: its tasks' scores and its plain-text val loss."""
    proc = subprocess.run([sys.executable, "chat.py", f"--out_dir={out_dir}", "--eval", "--json", *extra], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        raise UserError(f"chat.py --eval on {out_dir} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def first_token_seconds(out_dir, starts=5):
    """Seconds from starting `python chat.py --out_dir=... --prompt=123+456` to its first character of answer, for
    each of `starts` starts: most of it is importing torch, whose time moves by half a second from start to start."""
    seconds = []
    for _ in range(starts):
        start = time.time()
        proc = subprocess.Popen([sys.executable, "-u", "chat.py", f"--out_dir={out_dir}", "--prompt=123+456"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        proc.stdout.read(1)
        seconds.append(time.time() - start)
        proc.communicate()
    return seconds


def base_and_data(cfg, work):
    """The base run (the main job's default) and the tasks dataset, made once per work folder: seconds each."""
    spent = {}
    if not (work / "out" / "best.pt").exists():
        timed("data/prepare.py", f"--input={bench_input(cfg)}", f"--data_dir={work / 'data'}", "--start_over=True")
        spent["base"] = timed("train.py", "config/shakespeare_char.py", f"--out_dir={work / 'out'}",
                              f"--data_dir={work / 'data'}")
    spent["prepare"] = timed("data/prepare.py", "--synthetic=tasks", f"--mix={bench_input(cfg)}",
                             f"--data_dir={work / 'data'}")
    return spent


def stage(config, work, out, *extra):
    """Train a stage with its config from the base in work, into work/out (a fresh folder): its seconds."""
    return timed("train.py", config, f"--init_from={work / 'out'}", f"--out_dir={work / out}",
                 f"--data_dir={work / 'data'}", "--start_over=True", *extra)


def early_sft(work):
    """config/chat_sft_early.py, which ends where the sums' held-out pass@1 reaches 40%: its seconds, the scoring at
    its evaluations included."""
    seconds = stage("config/chat_sft_early.py", work, "out-chat-early")
    latest = load_checkpoint(work / "out-chat-early" / "latest.pt")
    stopped = latest.get("stopped_by_score") or {}
    print(f"early SFT: {latest['iter_num']} steps, held-out pass@1 {100 * stopped.get('pass_at_1', 0):.1f}% at its "
          f"end{'' if stopped else ' (never reached its aim)'}", flush=True)
    return seconds


def pipeline(cfg):
    work = own_work_dir(cfg)
    spent = base_and_data(cfg, work)
    spent["sft"] = stage("config/chat_sft.py", work, "out-chat")
    # the target compares LoRA with full SFT at equal time: LoRA trains for SFT's seconds, its schedule following them
    spent["lora"] = stage("config/chat_lora.py", work, "out-lora", f"--max_time={spent['sft']:.1f}",
                          "--wall_clock=True", f"--max_iters={LORA_STEPS_AT_MOST}")
    spent["sft_early"] = early_sft(work)
    spent["rl"] = timed("rl.py", "config/chat_rl.py", f"--init_from={work / 'out-chat-early'}",
                        f"--out_dir={work / 'out-rl'}", f"--tasks={cfg.rl_task}", "--start_over=True")
    found = {name: scores(work / name) for name in ("out-chat", "out-lora")}
    sharp = ["--samples=64", f"--limit={cfg.rl_eval}", f"--tasks={cfg.rl_task}", "--temperature=1.0"]
    before, after = scores(work / "out-chat-early", "--checkpoint=latest", *sharp), scores(work / "out-rl", *sharp)
    steps = {name: load_checkpoint(work / name / "latest.pt")["iter_num"] for name in found}
    report(cfg, spent, found, steps, before, after, first_token_seconds(work / "out-chat"))
    print(update_sizes(load_checkpoint(work / "out" / "best.pt")["model"],
                       load_checkpoint(work / "out-chat" / "best.pt")["model"]))
    stages = ",".join(str(work / name) for name in ("out", "out-chat", "out-lora", "out-chat-early", "out-rl"))
    card = subprocess.run([sys.executable, "chat.py", f"--report={stages}", "--samples=8", "--limit=200"],
                          cwd=REPO, capture_output=True, text=True)
    print(card.stdout or card.stderr)


def report(cfg, spent, found, steps, before, after, first_token):
    print(f"bench.py chat on {device_name('cpu')}; seconds of each stage, wall clock: " +
          ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()))
    sft_loss = found["out-chat"]["text_val_loss"]
    for name, result in found.items():
        tasks = ", ".join(f"{t} {100 * r['accuracy']:.1f}% of {r['n']}" for t, r in result["tasks"].items())
        print(f"{name}: {tasks}; plain text val loss {result['text_val_loss']:.4f}")
    for when, result in (("RL start", before), ("RL end", after)):
        r = result["tasks"][cfg.rl_task]
        print(f"{when} ({cfg.rl_task}, {r['n']} held-out, 64 samples at T=1): " +
              ", ".join(f"pass@{k} {100 * v:.1f}%" for k, v in r["pass_at"].items()))
    gain = after["tasks"][cfg.rl_task]["pass_at"]["1"] - before["tasks"][cfg.rl_task]["pass_at"]["1"]
    print(f"targets: SFT addition {100 * found['out-chat']['tasks']['addition']['accuracy']:.1f}% (>= 97), reverse "
          f"{100 * found['out-chat']['tasks']['reverse']['accuracy']:.1f}% (>= 95), sort "
          f"{100 * found['out-chat']['tasks']['sort']['accuracy']:.1f}% (>= 90); SFT {spent['sft']:.0f} s (<= 180); "
          f"RL pass@1 +{100 * gain:.1f} points (>= 20) in {spent['rl']:.0f} s (<= 300); LoRA "
          f"{lora_gap(found):+.1f} points against SFT at equal time, {steps['out-lora']:,} steps in "
          f"{spent['lora']:.0f} s against {steps['out-chat']:,} in {spent['sft']:.0f} s (within 3); "
          f"pipeline {sum(spent.values()):.0f} s (<= 900); "
          f"first token {statistics.median(first_token):.2f} s, the median of "
          f"{', '.join(f'{t:.2f}' for t in first_token)} (<= 2); text val loss SFT {sft_loss:.4f} (the base's: the report card)")


def lora_gap(found):
    sft, lora = (sum(r["accuracy"] for r in found[n]["tasks"].values()) / len(found[n]["tasks"])
                 for n in ("out-chat", "out-lora"))
    return 100 * (lora - sft)


def update_sizes(base, tuned, rank=8):
    """One line on how far a full fine-tune moved the base's block matrices, what a LoRA of `rank` would have to
    reach: each update's norm over its base matrix's, and the share of its energy (squared singular values) its
    top `rank` directions hold, the most a rank-`rank` update could carry of it."""
    sizes, shares = [], []
    for name, weight in base.items():
        if name.startswith("transformer.h.") and weight.ndim == 2:
            update = tuned[name].float() - weight.float()
            energy = torch.linalg.svdvals(update) ** 2
            sizes.append(float(update.norm() / weight.float().norm()))
            shares.append(100 * float(energy[:rank].sum() / energy.sum()))
    return (f"full SFT's updates to the blocks' {len(sizes)} matrices: {min(sizes):.1f}-{max(sizes):.1f} times the "
            f"base matrix in norm; their top {rank} directions hold {min(shares):.0f}-{max(shares):.0f}% of each "
            "one's energy")


def reversed_sums(cfg):
    """Plain against reversed sums in the same steps: the same SFT config on a dataset of each."""
    work = own_work_dir(cfg)
    base_and_data(cfg, work)
    for task in ("addition", "addition_reversed"):
        name = f"sums-{task}"
        timed("data/prepare.py", "--synthetic=tasks", f"--tasks={task}", f"--name={name}",
              f"--mix={bench_input(cfg)}", f"--data_dir={work / 'data'}")
        seconds = stage("config/chat_sft.py", work, f"out-{name}", f"--dataset={name}")
        r = scores(work / f"out-{name}")["tasks"][task]
        print(f"{task}: {100 * r['accuracy']:.1f}% of {r['n']} held-out sums after {seconds:.0f} s of SFT")


def main(argv):
    cfg = parse_config(ChatBenchConfig, argv, prog="bench.py chat")
    parts = comma_items(cfg.parts)
    if "pipeline" in parts:
        pipeline(cfg)
    if "reversed" in parts:
        reversed_sums(cfg)
