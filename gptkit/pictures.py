"""Pictures of runs, written as PNG files (or any format savefig writes): loss curves and attention maps
(headless: the Agg backend)."""

import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402

from gptkit.config import shown  # noqa: E402
from gptkit.errors import UserError  # noqa: E402
from gptkit.inspection import attention_of  # noqa: E402
from gptkit.metrics import loss_series, wall_clock  # noqa: E402


def writable_formats():
    """The file extensions savefig writes here: matplotlib's, less PGF where the TeX it typesets with is missing."""
    formats = set(FigureCanvasBase.get_supported_filetypes())
    if not shutil.which(matplotlib.rcParams["pgf.texsystem"]):
        formats.discard("pgf")
    return sorted(formats)


def check_picture_path(path):
    """Raise ValueError (one line) for a picture path savefig would refuse or write elsewhere: an extension
    it has no writer for (none at all: it would add '.png' to the name), a folder, or a path under a file."""
    path = Path(path)
    try:
        is_folder, blocker = path.is_dir(), next((p for p in path.parents if p.exists()), None)
    except OSError as e:  # e.g. a name too long for the file system
        raise ValueError(f"output {shown(str(path))} cannot be written ({e.strerror or e})") from None
    if is_folder:
        raise ValueError(f"output {path} is a folder, not a picture file; name a file in it, e.g. "
                         f"{path / 'picture.png'}")
    if blocker is not None and not blocker.is_dir():
        raise ValueError(f"output {path} cannot be written: {blocker} is a file, not a folder")
    formats = writable_formats()
    if path.suffix[1:].lower() not in formats:
        raise ValueError(f"output must end in one of .{', .'.join(formats)} (got {shown(str(path))})")


def save(fig, path, dpi):
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise UserError(f"could not write {path} ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- loss


def draw_loss(records, title, path, dpi=100):
    """Train and val loss against iterations and against wall time, side by side."""
    series = loss_series(records)
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
    fig.suptitle(title)
    fig.tight_layout()
    save(fig, path, dpi)


def draw_val_loss_vs_time(runs, title, path, dpi=110, dashed=()):
    """One val-loss curve per run, {name: eval records}, against each run's wall time; the runs named in
    dashed drawn dashed (e.g. one that cheats). Many runs get their legend beside the plot, off the curves."""
    many = len(runs) > 4
    fig, ax = plt.subplots(figsize=(9, 4.5) if many else (7, 4))
    for name, evals in runs.items():
        ax.plot(wall_clock(evals), [r["val_loss"] for r in evals], marker=".", markersize=3, label=name,
                linestyle="--" if name in dashed else "-")
    ax.set(xlabel="wall time (s)", ylabel="val loss", title=title)
    ax.grid(alpha=0.3)
    ax.legend(**(dict(loc="upper left", bbox_to_anchor=(1.01, 1.0)) if many else {}))
    fig.tight_layout()
    save(fig, path, dpi)


# ----------------------------------------------------------------------------- attention


def draw_attention(maps, labels, title, path, dpi=100, causal=True):
    """A grid of heatmaps, one per layer (rows) and head (columns): queries down, keys across; a causal
    model's masked future left white."""
    n_layer, n_head, T = len(maps), maps[0].shape[0], len(labels)
    cell = min(3.2, max(1.8, 0.13 * T))  # inches per heatmap
    # room for the title above a one-head grid: about 0.085 inches a character at its font size
    width = max(6.0, cell * n_head + 1.2, 0.085 * max(map(len, title.splitlines())))
    fig, axes = plt.subplots(n_layer, n_head, figsize=(width, cell * n_layer + 1.2), squeeze=False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # masked (future) positions
    fontsize = max(3.0, min(7.0, 0.8 * 72 * cell / T))  # points: 80% of a row's height, so labels never touch
    upper = np.triu(np.ones((T, T), dtype=bool), k=1) if causal else np.zeros((T, T), dtype=bool)
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer][head]
            image = ax.imshow(np.ma.masked_array(maps[layer][head], mask=upper), cmap=cmap, vmin=0.0, vmax=1.0,
                              interpolation="nearest")
            if T <= 48:
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
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.95))
    fig.colorbar(image, cax=fig.add_axes((0.915, 0.25, 0.012, 0.5)))
    save(fig, path, dpi)


def draw_model_attention(model, tok, prompt, path, dpi=100, name=""):
    """draw_attention for a model and a prompt, titled with what the picture shows (and name, when given)."""
    maps, labels = attention_of(model, tok, prompt)
    c = model.config
    shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    masked = "white: the masked future" if c.causal else "no mask: every token sees every other"
    title = (f"{name + ': ' if name else ''}{c.attention} attention weights for {shown!r} ({len(labels)} tokens)\n"
             f"rows: queries, columns: keys; {masked}")
    draw_attention(maps, labels, title, path, dpi, causal=c.causal)
