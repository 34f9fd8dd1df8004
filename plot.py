"""
Pictures of a run.

    python plot.py loss --out_dir=out                                # out/loss.png from out/metrics.jsonl
    python plot.py attention --out_dir=out --start="First Citizen:"  # out/attention.png from out/best.pt
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gptkit.base.errors import UserError, run_main
from gptkit.base.settings import parse_config, pick_subcommand
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


def plot_loss(cfg):
    from gptkit.interp.pictures import draw_loss
    from gptkit.run.metrics import read_metrics

    records = read_metrics(cfg.out_dir)
    if not any(r.get("kind") in ("train", "eval") for r in records):
        raise UserError(f"{Path(cfg.out_dir) / 'metrics.jsonl'} holds no train or eval records yet")
    title = f"{Path(cfg.out_dir).resolve().name}: train and val loss"
    draw_loss(records, title, cfg.output_path(), cfg.dpi)


def plot_attention(cfg):
    from gptkit.interp.pictures import draw_model_attention
    from gptkit.machine.runtime import pick_device
    from gptkit.run.run_folder import load_model
    from gptkit.sampling.prompts import read_prompt

    prompt = read_prompt(cfg.start)
    model, tok = load_model(cfg.out_dir, pick_device(cfg.device), cfg.checkpoint)
    draw_model_attention(model, tok, prompt, cfg.output_path(), cfg.dpi)


COMMANDS = {"loss": (plot_loss, PlotConfig), "attention": (plot_attention, AttentionConfig)}


def main(argv=None):
    picked = pick_subcommand("plot.py", COMMANDS, sys.argv[1:] if argv is None else argv, "picture")
    if picked:
        name, rest = picked
        draw, config = COMMANDS[name]
        draw(parse_config(config, rest, prog=f"plot.py {name}"))


if __name__ == "__main__":
    run_main(main)
