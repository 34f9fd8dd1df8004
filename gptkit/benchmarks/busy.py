"""`bench.py busy`: training tokens/s on an idle machine and beside a busy process, the run's own thread choice
against a fixed thread count."""

import subprocess
import sys
from dataclasses import dataclass

import torch

from gptkit.benchmarks.common import device_name, prepared_work_dir, rate, train_run
from gptkit.config import parse_config, require


@dataclass
class BusyBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-busy"  # prepared data and the runs go here
    config: str = "config/shakespeare_char.py"  # the run timed idle and beside a busy process
    seconds: float = 40.0  # each run's max_time
    fixed_threads: int = 0  # also time this many threads, fixed, idle and busy (0 = torch's default)

    def __post_init__(self):
        require(self, ["seconds"], lambda v: v > 0, "more than 0")
        require(self, ["fixed_threads"], lambda v: v >= 0, "at least 0")


def main(argv):
    """Training tokens/s on an idle machine, beside one busy process (a core held by a spinning Python) and beside
    one that starts halfway through: the run's own thread choice (threads=0, measured as it goes) against a fixed
    thread count, idle (what measuring costs) and busy (what it saves)."""
    cfg = parse_config(BusyBenchConfig, argv, prog="bench.py busy")
    work = prepared_work_dir(cfg)
    fixed = cfg.fixed_threads or torch.get_num_threads()
    print(f"machine: {device_name('cpu')}, torch {torch.__version__}")
    rates = {}
    for name, busy_after, threads in [("idle", None, 0), (f"idle, {fixed} threads fixed", None, fixed),
                                      ("busy", 0, 0), (f"busy, {fixed} threads fixed", 0, fixed),
                                      ("busy from halfway", cfg.seconds / 2, 0)]:
        args = [cfg.config, "--device=cpu", f"--max_time={cfg.seconds}", f"--threads={threads}", "--log_interval=5"]
        spinner = None if busy_after is None else subprocess.Popen(
            [sys.executable, "-c", f"import time\ntime.sleep({busy_after})\nwhile True: pass"])
        try:
            rates[name] = train_run(name, args, work, work / name.replace(" ", "_").replace(",", ""), [])["tok_s"]
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
    print_busy_table(rates)


def print_busy_table(rates):
    """Each run's tokens/s and its share of the idle run's; n/a where a run logged too little to have a rate."""
    print()
    for name, tok_s in rates.items():
        share = tok_s / rates["idle"] if tok_s and rates["idle"] else None
        print(f"{name:<28} {rate(tok_s, '{:,.0f}'):>10} tokens/s  {rate(share, '{:.0%}'):>5} of idle")
