"""`bench.py presets`: each preset trained once per seed by train.py, one run after another; each preset's mean
whole-split val loss, its spread over the seeds, its wall times against its time budget, and its target."""

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import device_name, fmt_s, prepared_work_dir, train_run
from gptkit.base.settings import check_seed, comma_items, parse_config
from gptkit.machine.runtime import check_device_name
from gptkit.training.train_config import TrainConfig


@dataclass
class PresetsBenchConfig:
    input: str = ""  # text to train on ('' = data/shakespeare_char/input.txt, which data/prepare.py downloads)
    work_dir: str = "out-bench-presets"  # prepared data and every run go here
    configs: str = ("config/shakespeare_char.py,config/shakespeare_char_5min.py,"
                    "config/shakespeare_char_10min.py")  # presets to train, comma-separated
    targets: str = "1.46,1.43,1.41"  # each preset's target: mean val loss on the whole split ('' = none)
    seeds: str = "1337,1338,1339"  # each preset trains once per seed, comma-separated
    device: str = "cpu"  # device for every run
    args: str = ""  # more train.py options for every run, space-separated

    def __post_init__(self):
        if not self.config_list() or not self.seed_list():
            raise ValueError("configs and seeds must each name at least one")
        for seed in self.seed_list():
            check_seed(seed)
        targets = self.target_list()
        if targets and (len(targets) != len(self.config_list()) or not all(t > 0 for t in targets)):
            raise ValueError(f"targets must be one positive val loss per config, or '' (got {self.targets!r})")
        check_device_name(self.device)

    def config_list(self):
        return comma_items(self.configs)

    def seed_list(self):
        try:
            return [int(s) for s in comma_items(self.seeds)]
        except ValueError:
            raise ValueError(f"seeds must be integers, comma-separated (got {self.seeds!r})") from None

    def target_list(self):
        try:
            return [float(t) for t in comma_items(self.targets)]
        except ValueError:
            raise ValueError(f"targets must be val losses, comma-separated (got {self.targets!r})") from None


def main(argv):
    """Each preset trained once per seed, one run after another, wall time taken from process start to exit;
    each preset's mean whole-split val loss, its spread, and its target."""
    cfg = parse_config(PresetsBenchConfig, argv, prog="bench.py presets")
    work = prepared_work_dir(cfg)
    print(f"machine: {device_name(cfg.device)}, torch {torch.__version__}")
    results = {}
    for config in cfg.config_list():
        results[config] = []
        for seed in cfg.seed_list():
            args = [config, *cfg.args.split(), f"--seed={seed}", f"--device={cfg.device}"]
            out_dir = work / f"{Path(config).stem}-{seed}"
            results[config].append(train_run(f"{config}, seed {seed}", args, work, out_dir, []))
    budgets = {config: parse_config(TrainConfig, [config, *cfg.args.split()]).max_time for config in results}
    print_presets_table(results, dict(zip(cfg.config_list(), cfg.target_list())), budgets, cfg.seed_list())


def print_presets_table(results, targets, budgets, seeds):
    """One row per run, then each preset's mean and spread over its seeds against its target and time budget."""
    print(f"\n{'preset':<36}{'seed':>6}{'final val':>11}{'wall time':>11}{'iterations':>12}{'precision':>11}")
    for config, runs in results.items():
        for seed, s in zip(seeds, runs):
            print(f"{config:<36}{seed:>6}{s['final_val']:>11.4f}{fmt_s(s['wall_s']):>11}{s['iters']:>12}"
                  f"{s['dtype']:>11}")
    print()
    for config, runs in results.items():
        losses, walls = [s["final_val"] for s in runs], [s["wall_s"] for s in runs]
        mean = statistics.mean(losses)
        spread = f"{min(losses):.4f}-{max(losses):.4f}" + (f", std {statistics.stdev(losses):.4f}" if len(runs) > 1
                                                           else "")
        line = f"{config}: mean {mean:.4f} over {len(runs)} seed{'s' if len(runs) > 1 else ''} ({spread})"
        if budgets[config] > 0:
            line += (f"; wall time {min(walls):.1f}-{max(walls):.1f} s, " +
                     ("within" if max(walls) <= budgets[config] else "OVER") + f" max_time {budgets[config]:g} s")
        if config in targets:
            line += f"; target <= {targets[config]}: " + ("met" if mean <= targets[config] else "missed")
        print(line)
