"""
Pictures of a run.

    python plot.py loss --out_dir=out                                # out/loss.png from out/metrics.jsonl
    python plot.py loss --out_dir=out-rl                             # an rl.py run's reward and held-out scores
    python plot.py attention --out_dir=out --start="First Citizen:"  # out/attention.png from out/best.pt
    python plot.py compare out out-gelu                              # out/compare.png; prints what differs
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gptkit.base.errors import UserError, run_main
from gptkit.base.settings import comma_items, parse_config, pick_subcommand
from gptkit.machine.runtime import check_device_name


@dataclass
class PlotConfig:
    """`plot.py loss`'s settings, which every picture takes."""

    picture: ClassVar[str] = "loss"
    out_dir: str = "out"  # run folder: metrics.jsonl and the checkpoint are read from it, pictures written to it
    output: str = ""  # picture path, its extension the format ('' = out_dir/PICTURE.png, e.g. out_dir/loss.png)
    dpi: int = 100  # picture resolution

    def __post_init__(self):
        from gptkit.interp.pictures import check_picture_path

        if not 20 <= self.dpi <= 600:
            raise ValueError(f"dpi must be between 20 and 600 (got {self.dpi})")
        check_picture_path(self.output_path())  # here, not after a model has been loaded and run

    def output_path(self):
        return Path(self.output) if self.output else Path(self.out_dir) / f"{self.picture}.png"


@dataclass
class AttentionConfig(PlotConfig):
    """`plot.py attention`'s settings: every picture's, and the checkpoint and prompt it draws."""

    picture: ClassVar[str] = "attention"
    checkpoint: str = "best"  # 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' (a snapshot: train.py --snapshots)
    start: str = "First Citizen:"  # the prompt whose attention is drawn, or FILE:path
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'

    def __post_init__(self):
        from gptkit.run.run_folder import check_checkpoint

        super().__post_init__()
        check_checkpoint(self.checkpoint)
        check_device_name(self.device)

    def output_path(self):
        """out_dir/attention.png of the run's own weights; another checkpoint's is a file of its own
        (attention-iter150.png), never a replacement."""
        from gptkit.interp.pictures import picture_name

        return Path(self.output) if self.output else Path(self.out_dir) / picture_name(self.picture, self.checkpoint)


@dataclass
class CompareConfig:
    """`plot.py compare`'s settings: the runs, and where the picture goes."""

    picture: ClassVar[str] = "compare"
    runs: str = ""  # run folders, comma-separated (or arguments: compare out out-gelu), the first the base
    output: str = ""  # picture path, its extension the format ('' = the first run's folder/compare.png)
    dpi: int = 100  # picture resolution

    def __post_init__(self):
        from gptkit.interp.pictures import check_picture_path

        folders = self.folders()
        if len(folders) < 2:
            raise ValueError(f"compare needs two or more run folders (got {len(folders)}), the first the one "
                             "the others are compared with: python plot.py compare out out-gelu")
        for folder in folders:
            if not Path(folder).is_dir():
                what = "a file, not a folder" if Path(folder).exists() else "no such folder"
                raise ValueError(f"no run in {folder}: {what}")
        resolved = [Path(f).resolve() for f in folders]
        twice = next((f for f, r in zip(folders, resolved) if resolved.count(r) > 1), None)
        if twice is not None:
            raise ValueError(f"{twice} is named twice; name each run once")
        if not 20 <= self.dpi <= 600:
            raise ValueError(f"dpi must be between 20 and 600 (got {self.dpi})")
        check_picture_path(self.output_path())  # here, not after every run has been read

    def folders(self):
        return comma_items(self.runs)

    def output_path(self):
        return Path(self.output) if self.output else Path(self.folders()[0]) / f"{self.picture}.png"


def plot_loss(cfg):
    from gptkit.interp.pictures import draw_loss, draw_practice
    from gptkit.run.metrics import read_metrics, rl_run

    records = read_metrics(cfg.out_dir)
    if rl_run(records):  # rl.py's run: no loss to draw, its reward and scores instead
        title = f"{Path(cfg.out_dir).resolve().name}: reinforcement learning on its own answers"
        return draw_practice(records, title, cfg.output_path(), cfg.dpi)
    if not any(r.get("kind") in ("train", "eval") for r in records):
        raise UserError(f"{Path(cfg.out_dir) / 'metrics.jsonl'} holds no train or eval records yet")
    title = f"{Path(cfg.out_dir).resolve().name}: train and val loss"
    draw_loss(records, title, cfg.output_path(), cfg.dpi)


def plot_attention(cfg):
    from gptkit.interp.pictures import checkpoint_words, draw_model_attention
    from gptkit.machine.runtime import pick_device
    from gptkit.run.run_folder import load_model
    from gptkit.sampling.prompts import read_prompt

    prompt = read_prompt(cfg.start)
    model, tok = load_model(cfg.out_dir, pick_device(cfg.device), cfg.checkpoint, watched=True)
    run = Path(cfg.out_dir).resolve().name  # another checkpoint's picture says whose weights it shows
    name = "" if cfg.checkpoint == "best" else f"{run}, {checkpoint_words(cfg.checkpoint)}"
    draw_model_attention(model, tok, prompt, cfg.output_path(), cfg.dpi, name=name)


def plot_compare(cfg):
    from gptkit.interp.pictures import draw_comparison
    from gptkit.run.comparison import besides_note, describe, differences, load_runs

    runs = load_runs(cfg.folders())
    base = runs[0]
    for run in runs:
        final = next((r["val_loss"] for r in reversed(run.records) if r.get("kind") == "final"), None)
        score = f", final val loss {final:.4f}" if final is not None else ""
        print(f"{run.name}: {run.steps:,} steps, {run.steps * run.tokens_per_step:,} tokens seen{score}")
    for run in runs[1:]:
        diff = differences(base, run)
        print("\n".join(describe(base, run, diff)))
        note = besides_note(base, run, diff)
        if note:
            print(note)
    draw_comparison([(r.name, r.records, r.tokens_per_step) for r in runs],
                    f"{', '.join(r.name for r in runs)}: train and val loss", cfg.output_path(), cfg.dpi)


COMMANDS = {"loss": (plot_loss, PlotConfig), "attention": (plot_attention, AttentionConfig),
            "compare": (plot_compare, CompareConfig)}


def runs_first(argv):
    """`plot.py compare OUT OTHER ... --key=value`: the arguments before the first option name the runs."""
    count = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    return ([f"--runs={','.join(argv[:count])}"] if count else []) + argv[count:]


def main(argv=None):
    picked = pick_subcommand("plot.py", COMMANDS, sys.argv[1:] if argv is None else argv, "picture")
    if picked:
        name, rest = picked
        draw, config = COMMANDS[name]
        draw(parse_config(config, runs_first(rest) if name == "compare" else rest, prog=f"plot.py {name}"))


if __name__ == "__main__":
    run_main(main)
