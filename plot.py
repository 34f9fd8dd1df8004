"""
Pictures of a run.

    python plot.py loss --out_dir=out                                # out/loss.png from out/metrics.jsonl
    python plot.py attention --out_dir=out --start="First Citizen:"  # out/attention.png from out/ckpt.pt
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from config import parse_config, pick_subcommand  # noqa: E402
from errors import UserError, run_main  # noqa: E402


@dataclass
class PlotConfig:
    out_dir: str = "out"  # run folder: metrics.jsonl and ckpt.pt are read from it, pictures written to it
    output: str = ""  # picture path ('' = out_dir/loss.png or out_dir/attention.png)
    start: str = "First Citizen:"  # attention: the prompt whose attention is drawn, or FILE:path
    device: str = "cpu"  # attention: 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'
    dpi: int = 100  # picture resolution

    def validate(self):
        if not 20 <= self.dpi <= 600:
            raise UserError(f"dpi must be between 20 and 600 (got {self.dpi})")


def output_path(cfg, name):
    path = Path(cfg.output) if cfg.output else Path(cfg.out_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save(fig, path, dpi):
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise UserError(f"could not write {path} ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- loss


def load_records(out_dir):
    from metrics import read_metrics

    path = Path(out_dir) / "metrics.jsonl"
    try:
        records = read_metrics(out_dir)
    except FileNotFoundError:
        raise UserError(f"no metrics.jsonl in {out_dir}; train a model there first with `python train.py ...`") \
            from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} has a line that is not JSON ({e.msg} at line {e.lineno}); "
                        "was it written by train.py?") from None
    if not any(r.get("kind") in ("train", "eval") for r in records):
        raise UserError(f"{path} holds no train or eval records yet")
    return records


def wall_clock(records):
    """Each record's elapsed_s on one clock: a resumed run's process clock restarts at 0, so it continues
    from where the previous process left off."""
    out, offset, last = [], 0.0, 0.0
    for r in records:
        t = float(r.get("elapsed_s", 0.0))
        if t + offset < last:  # the clock went back: a new process appended to the file
            offset = last
        last = t + offset
        out.append(last)
    return out


def loss_series(records):
    """{label: (iters, seconds, losses)} for the logged train loss and the evaluated train/val losses."""
    seconds = wall_clock(records)
    series = {"train (batch)": ([], [], []), "train (eval)": ([], [], []), "val": ([], [], [])}
    for r, t in zip(records, seconds):
        if r.get("kind") == "train" and "loss" in r:
            points = [("train (batch)", r["loss"])]
        elif r.get("kind") == "eval":
            points = [("train (eval)", r.get("train_loss")), ("val", r.get("val_loss"))]
        else:
            continue
        for label, value in points:
            if value is not None:
                series[label][0].append(r["iter"])
                series[label][1].append(t)
                series[label][2].append(value)
    return {k: v for k, v in series.items() if v[0]}


def plot_loss(cfg):
    series = loss_series(load_records(cfg.out_dir))
    styles = {"train (batch)": dict(color="tab:blue", alpha=0.35, linewidth=1),
              "train (eval)": dict(color="tab:blue", marker="o", markersize=3, linewidth=1.5),
              "val": dict(color="tab:orange", marker="o", markersize=3, linewidth=1.5)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, column, xlabel in ((axes[0], 0, "iteration"), (axes[1], 1, "wall time (s)")):
        for label, values in series.items():
            ax.plot(values[column], values[2], label=label, **styles[label])
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("loss (nats per token)")
    axes[0].legend()
    axes[0].set_title("loss against iterations")
    axes[1].set_title("loss against wall time")
    fig.suptitle(f"{Path(cfg.out_dir).resolve().name}: train and val loss")
    fig.tight_layout()
    save(fig, output_path(cfg, "loss"), cfg.dpi)


# ----------------------------------------------------------------------------- attention


def token_label(tok, token):
    text = tok.decode([token])
    shown = text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u2423")  # ␣ marks a space
    return shown if len(shown) <= 12 else shown[:11] + "\u2026"


def plot_attention(cfg):
    import torch

    from checkpoint import load_model
    from hardware import pick_device
    from sample import read_prompt, unescape

    # as in sample.py: FILE:path reads a file, and an escape like \n typed on the command line is a newline
    prompt = read_prompt(cfg.start if cfg.start.startswith("FILE:") else unescape(cfg.start))
    model, tok = load_model(cfg.out_dir, pick_device(cfg.device))
    ids = tok.encode(prompt)
    if not ids:
        raise UserError("the prompt is empty: pass some text with --start")
    if len(ids) > model.config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the model's block_size "
                        f"{model.config.block_size}")
    device = next(model.parameters()).device
    maps = model.attention_maps(torch.tensor([ids], dtype=torch.long, device=device))
    maps = [m[0].float().cpu().numpy() for m in maps]  # per layer (H, T, T)
    n_layer, n_head, T = len(maps), maps[0].shape[0], len(ids)
    labels = [token_label(tok, t) for t in ids]

    cell = min(3.2, max(1.8, 0.13 * T))  # inches per heatmap
    fig, axes = plt.subplots(n_layer, n_head, figsize=(cell * n_head + 1.2, cell * n_layer + 0.8), squeeze=False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # masked (future) positions
    show_ticks = T <= 48
    fontsize = max(3.0, min(7.0, 120 / T))
    upper = np.triu(np.ones((T, T), dtype=bool), k=1)
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer][head]
            image = ax.imshow(np.ma.masked_array(maps[layer][head], mask=upper), cmap=cmap, vmin=0.0, vmax=1.0,
                              interpolation="nearest")
            if show_ticks:
                ax.set_xticks(range(T), labels, rotation=90, fontsize=fontsize)
                ax.set_yticks(range(T), labels, fontsize=fontsize)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
            ax.tick_params(length=0, pad=1)
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer}\nquery", fontsize=9)
            if layer == n_layer - 1:
                ax.set_xlabel("key", fontsize=8)
    shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    fig.suptitle(f"causal attention weights (rows: queries, columns: keys; white: masked future)\n"
                 f"{shown!r}, {T} tokens", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.98))
    bar = fig.add_axes((0.915, 0.25, 0.012, 0.5))
    fig.colorbar(image, cax=bar)
    save(fig, output_path(cfg, "attention"), cfg.dpi)


# ----------------------------------------------------------------------------- entry point

COMMANDS = {"loss": plot_loss, "attention": plot_attention}


def main(argv=None):
    picked = pick_subcommand("plot.py", COMMANDS, sys.argv[1:] if argv is None else argv, "picture")
    if picked:
        name, rest = picked
        COMMANDS[name](parse_config(PlotConfig, rest, prog=f"plot.py {name}"))


if __name__ == "__main__":
    run_main(main)
