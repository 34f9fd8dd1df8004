"""Pictures of runs, written as PNG files (or any format savefig writes): loss curves and attention maps
(headless: the Agg backend)."""

import math
import re
import shutil
import textwrap
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.font_manager import FontProperties, fontManager  # noqa: E402
from matplotlib.textpath import TextToPath  # noqa: E402

from gptkit.base import files  # noqa: E402
from gptkit.base.errors import UserError  # noqa: E402
from gptkit.base.settings import shown  # noqa: E402
from gptkit.interp.hooks import attention_of  # noqa: E402
from gptkit.run.metrics import loss_series, wall_clock  # noqa: E402

# fonts with the characters DejaVu Sans lacks (Chinese, Japanese, Korean, symbols), which a run's tokens may
# hold: matplotlib draws each character with the first font in the list that has it
FALLBACK_FONTS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans SC", "Noto Sans JP", "Source Han Sans",
                  "WenQuanYi Zen Hei", "Droid Sans Fallback", "Microsoft YaHei", "PingFang SC", "Hiragino Sans",
                  "Apple SD Gothic Neo", "Noto Sans Symbols 2", "Noto Emoji", "Segoe UI Emoji", "Symbola")
MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from font")


def use_fallback_fonts():
    """DejaVu Sans, as before, then each fallback font installed here (naming one that is not would make
    matplotlib complain at every text)."""
    installed = {f.name for f in fontManager.ttflist}
    matplotlib.rcParams["font.family"] = ["DejaVu Sans", *(f for f in FALLBACK_FONTS if f in installed)]


use_fallback_fonts()


def writable_formats():
    """The file extensions savefig writes here: matplotlib's, less PGF where the TeX it typesets with is missing."""
    formats = set(FigureCanvasBase.get_supported_filetypes())
    if not shutil.which(matplotlib.rcParams["pgf.texsystem"]):
        formats.discard("pgf")
    return sorted(formats)


def picture_name(picture, checkpoint="best"):
    """The file name of a run's picture of a checkpoint: the run's own (best.pt) draws picture.png, any other a file
    of its own beside it (heads-latest.png, heads-iter150.png), so that one never replaces another."""
    return f"{picture}.png" if checkpoint == "best" else f"{picture}-{checkpoint.replace(':', '')}.png"


def checkpoint_words(checkpoint, iteration=None):
    """Which weights a picture is of, for its title: 'the snapshot of step 150', 'best.pt of step 1,200' (the step
    where the checkpoint says), 'latest.pt'."""
    if checkpoint.startswith("iter:"):
        return f"the snapshot of step {int(checkpoint[5:]):,}"
    return f"{checkpoint}.pt" + (f" of step {iteration:,}" if iteration is not None else "")


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
    try:
        files.writable(path)
    except UserError as e:
        raise ValueError(str(e)) from None
    formats = writable_formats()
    if path.suffix[1:].lower() not in formats:
        raise ValueError(f"output must end in one of .{', .'.join(formats)} (got {shown(str(path))})")


def save(fig, path, dpi):
    """Write the picture whole (aside, then renamed over path), never through a link at its name; a file that was
    at path (an earlier picture, or anything else of yours) is said to be replaced. Aside in a file of this
    process's own: no lock keeps two commands drawing one picture apart (two analyze.py heads on a run), and in
    one file each would write over the other's bytes."""
    path = Path(path)
    replacing = path.is_file()
    try:
        with warnings.catch_warnings(record=True) as caught, files.written_whole(path, "wb", shared=True) as f:
            warnings.simplefilter("always")
            fig.savefig(f, dpi=dpi, format=path.suffix[1:].lower())
    finally:
        plt.close(fig)
    print(f"wrote {path}" + (", replacing the file that was there" if replacing else ""))
    missing_glyphs(caught)


def missing_glyphs(caught):
    """The warnings a picture's drawing raised, matplotlib's one per character no font here can draw (a run's
    tokens in Chinese, emoji) as one note; the others as they came."""
    missing = []
    for w in caught:
        found = MISSING_GLYPH.search(str(w.message))
        if found is None:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        elif chr(int(found.group(1))) not in missing:
            missing.append(chr(int(found.group(1))))
    if missing:
        shown = "".join(missing[:10]) + ("…" if len(missing) > 10 else "")
        print(f"note: {len(missing)} character{'s' * (len(missing) > 1)} of the picture ({shown}) have no glyph in "
              "the fonts installed here and show as boxes; a font that has them (e.g. Noto Sans CJK for Chinese "
              "and Japanese) draws them")


# ----------------------------------------------------------------------------- loss


def draw_loss(records, title, path, dpi=100):
    """Train and val loss against iterations and against wall time, side by side; a fine-tune's task score
    (stop_task's) against iterations, where it has one."""
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
    scored = [r for r in records if r.get("kind") == "task_eval"]
    if scored:  # a fine-tune ended by its score (stop_task): the sudden change in a task, beside the loss
        share = axes[0].twinx()
        share.plot([r["iter"] for r in scored], [r["pass_at_1"] for r in scored], color="tab:green", marker="s",
                   markersize=3, linewidth=1.5, label=f"{scored[-1].get('task')} held-out pass@1")
        share.set_ylim(0, 1)
        share.set_ylabel("share right")
        share.legend(loc="center")
    fig.suptitle(title)
    fig.set_layout_engine("tight")  # laid out as it is saved, where its warnings are gathered
    save(fig, path, dpi)


def draw_practice(records, title, path, dpi=100):
    """An rl.py run: each step's mean reward and the held-out pass@1 and greedy accuracy at each evaluation, and
    the answers' mean length, against steps."""
    steps = [r for r in records if r.get("kind") == "rl"]
    evals = [r for r in records if r.get("kind") == "rl_eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot([r["iter"] for r in steps], [r["reward"] for r in steps], color="tab:blue", alpha=0.35,
                 linewidth=1, label="reward (the step's samples)")
    for key, label, colour in (("pass_at_1", "held-out pass@1", "tab:orange"),
                               ("accuracy", "held-out greedy accuracy", "tab:green")):
        shown = [r for r in evals if key in r]
        axes[0].plot([r["iter"] for r in shown], [r[key] for r in shown], color=colour, marker="o", markersize=3,
                     linewidth=1.5, label=label)
    axes[0].set_ylim(0, 1)
    axes[0].set_ylabel("share right")
    axes[0].legend()
    axes[0].set_title("reward and held-out scores")
    answered = [r for r in steps if "answer_tokens" in r]
    axes[1].plot([r["iter"] for r in answered], [r["answer_tokens"] for r in answered], color="tab:purple")
    axes[1].set_ylabel("tokens")
    axes[1].set_title("the answers' mean length")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.set_layout_engine("tight")
    save(fig, path, dpi)


def draw_comparison(runs, title, path, dpi=100):
    """Several runs' val loss (solid) and evaluated train loss (dashed), one colour per run, against iterations
    and against the tokens each trained on: runs is [(name, metrics records, tokens a step)]. Many runs get
    their legend beside the plots, off the curves."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter

    many = len(runs) > 4
    colours = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    fig, axes = plt.subplots(1, 2, figsize=(13 if many else 11, 4.5), sharey=True)
    handles = []
    for i, (name, records, tokens_per_step) in enumerate(runs):
        series, colour = loss_series(records), colours(i % colours.N)
        train = "train (eval)" if "train (eval)" in series else "train (batch)"
        for label, style in (("val", dict(marker="o", markersize=3, linewidth=1.5)),
                             (train, dict(linestyle="--", linewidth=1, alpha=0.7))):
            if label in series:
                iters, _, losses = series[label]
                axes[0].plot(iters, losses, color=colour, **style)
                axes[1].plot([n * tokens_per_step for n in iters], losses, color=colour, **style)
        handles.append(Line2D([], [], color=colour, linewidth=2, label=name))
    handles += [Line2D([], [], color="grey", marker="o", markersize=3, label="val"),
                Line2D([], [], color="grey", linestyle="--", label="train")]
    for ax, xlabel in zip(axes, ("iteration", "tokens seen")):
        ax.set_xlabel(xlabel)
        ax.set_title(f"loss against {'iterations' if xlabel == 'iteration' else xlabel}")
        ax.grid(True, alpha=0.3)
    axes[1].xaxis.set_major_formatter(EngFormatter())  # 1.2M tokens, not an offset printed in the corner
    axes[0].set_ylabel("loss (nats per token)")
    legend = (axes[1] if many else axes[0]).legend(
        handles=handles, **(dict(loc="upper left", bbox_to_anchor=(1.01, 1.0)) if many else {}))
    for text in legend.get_texts():  # a folder named 'a$b$' is a name, not a formula
        text.set_parse_math(False)
    fig.suptitle(title, parse_math=False)
    fig.set_layout_engine("tight")  # laid out as it is saved, where its warnings are gathered
    save(fig, path, dpi)
    return fig


def draw_val_loss_vs_time(runs, title, path, dpi=110, aside=None, tokens_per_iter=None):
    """One val-loss curve per run, {name: eval records}, against each run's wall time, or against the tokens it
    trained on where tokens_per_iter gives {name: tokens a step}; the runs in `aside` (e.g. one that cheats, whose
    loss would squash the others' curves) in a panel of their own beside them. Many runs get their legend beside
    the plot, off the curves."""
    panels = [runs, *([aside] if aside else [])]
    many = len(runs) > 4
    width = (9 if many else 7) + (3 if aside else 0)
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 4.5 if many else 4), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1][:len(panels)]})
    xlabel = "training tokens" if tokens_per_iter else "wall time (s)"
    for ax, curves in zip(axes[0], panels):
        for name, evals in curves.items():
            x = [r["iter"] * tokens_per_iter[name] for r in evals] if tokens_per_iter else wall_clock(evals)
            ax.plot(x, [r["val_loss"] for r in evals], marker=".", markersize=3, label=name)
        ax.set(xlabel=xlabel, ylabel="val loss")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    axes[0][0].legend(**(dict(loc="upper left", bbox_to_anchor=(1.01, 1.0)) if many else {}))
    if aside:
        axes[0][1].set_title("it cheats: not a result", fontsize=9)
        axes[0][1].legend(fontsize=8, loc="upper right")
    fig.set_layout_engine("tight")  # laid out as it is saved, where its warnings are gathered
    save(fig, path, dpi)


# ----------------------------------------------------------------------------- attention


LABEL_PT = 9  # token labels: the smallest text in an attention picture
PITCH_IN = 0.165  # inches per labelled token: 9 pt labels with a gap between neighbours
MIN_CELL_IN = 1.6  # a heatmap of a few tokens still shows its cells
MOST_CELL_IN, MOST_GRID_IN = 12.0, 36.0  # beyond these, every k-th token is labelled instead of the figure growing
TITLE_PT, HEAD_PT = 10, 9
TITLE_LINE_IN = TITLE_PT * 1.4 / 72
SPACE_IN = 0.12  # between a heatmap's labels and the next heatmap, and around the figure
AXIS_TITLE_IN = 0.4  # beside the grid: 'layer i / query' to the left, 'head h' above and 'key' below
COLORBAR_IN = (0.12, 0.15, 0.45)  # gap to the grid, bar, its tick labels
MIN_WIDTH_IN = 4.5  # so that a one-head picture's title wraps into a few lines, not a column of words


def text_inches(text, points):
    with warnings.catch_warnings():  # a character no font has: noted once, when the picture is saved
        warnings.filterwarnings("ignore", message=MISSING_GLYPH.pattern)
        return TextToPath().get_text_width_height_descent(text, FontProperties(size=points), ismath=False)[0] / 72


def label_stride(T, n_layer, n_head):
    """(every how many tokens one is labelled, inches per heatmap): each labelled token gets PITCH_IN, so
    labels never shrink below LABEL_PT; the heatmaps grow with the prompt until the grid would pass
    MOST_GRID_IN (or one heatmap MOST_CELL_IN), and then fewer tokens get a label."""
    most = min(MOST_CELL_IN, max(MIN_CELL_IN, MOST_GRID_IN / max(n_layer, n_head)))
    stride = math.ceil(T * PITCH_IN / most)
    return stride, max(MIN_CELL_IN, math.ceil(T / stride) * PITCH_IN)


def wrap_title(title, width_in):
    """The title's lines, each broken at spaces where it would be wider than the figure."""
    lines = []
    for line in title.splitlines():
        wide = text_inches(line, TITLE_PT)
        lines += textwrap.wrap(line, max(20, int(len(line) * width_in / wide))) if wide > width_in else [line]
    return lines


def attention_grid(labels, n_layer, n_head, title):
    """The figure for draw_attention, sized in inches from the labels out: (figure, heatmap axes by layer and
    head, colour bar axes, label stride). Every heatmap keeps its own labels, and the colour bar sits beside
    the grid whatever its size."""
    stride, cell = label_stride(len(labels), n_layer, n_head)
    label_in = max(text_inches(t, LABEL_PT) for t in labels[::stride]) + SPACE_IN
    step = cell + label_in + SPACE_IN  # from one heatmap to the next, either way
    grid_w, grid_h = n_head * step - label_in - SPACE_IN, n_layer * step - label_in - SPACE_IN
    block_w = AXIS_TITLE_IN + label_in + grid_w + sum(COLORBAR_IN)
    width = max(MIN_WIDTH_IN, block_w + 2 * SPACE_IN)
    lines = wrap_title(title, width - 2 * SPACE_IN)
    top = SPACE_IN + len(lines) * TITLE_LINE_IN + AXIS_TITLE_IN
    height = top + grid_h + label_in + AXIS_TITLE_IN
    fig = plt.figure(figsize=(width, height))
    left = (width - block_w) / 2 + AXIS_TITLE_IN + label_in

    def box(x, y_top, w, h):  # inches from the left and from the top, to figure fractions
        return (x / width, 1 - (y_top + h) / height, w / width, h / height)

    axes = [[fig.add_axes(box(left + head * step, top + layer * step, cell, cell)) for head in range(n_head)]
            for layer in range(n_layer)]
    bar_h = min(grid_h, max(cell, 3.0))  # as tall as a heatmap, and long enough to read across a grid
    bar = fig.add_axes(box(left + grid_w + COLORBAR_IN[0], top + (grid_h - bar_h) / 2, COLORBAR_IN[1], bar_h))
    fig.suptitle("\n".join(lines), y=1 - SPACE_IN / height, va="top", fontsize=TITLE_PT, parse_math=False)
    return fig, axes, bar, stride


def draw_attention(maps, labels, title, path, dpi=100, causal=True):
    """A grid of heatmaps, one per layer (rows) and head (columns): queries down, keys across; a causal
    model's masked future left white. Returns the figure (written and closed)."""
    n_layer, n_head, T = len(maps), maps[0].shape[0], len(labels)
    fig, axes, bar, stride = attention_grid(labels, n_layer, n_head, title)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")  # masked (future) positions
    upper = np.triu(np.ones((T, T), dtype=bool), k=1) if causal else np.zeros((T, T), dtype=bool)
    ticks, shown_labels = range(0, T, stride), labels[::stride]
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer][head]
            image = ax.imshow(np.ma.masked_array(maps[layer][head], mask=upper), cmap=cmap, vmin=0.0, vmax=1.0,
                              interpolation="nearest")
            # a token such as '$x$' is text, not a formula to typeset
            ax.set_xticks(ticks, shown_labels, rotation=90, fontsize=LABEL_PT, parse_math=False)
            ax.set_yticks(ticks, shown_labels, fontsize=LABEL_PT, parse_math=False)
            ax.tick_params(length=0, pad=2)
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=HEAD_PT)
            if head == 0:
                ax.set_ylabel(f"layer {layer}\nquery", fontsize=HEAD_PT)
            if layer == n_layer - 1:
                ax.set_xlabel("key" if stride == 1 else f"key (a label every {stride} tokens)", fontsize=HEAD_PT)
    fig.colorbar(image, cax=bar).ax.tick_params(labelsize=LABEL_PT)
    save(fig, path, dpi)
    return fig


def draw_model_attention(model, tok, prompt, path, dpi=100, name=""):
    """draw_attention for a model and a prompt, titled with what the picture shows (and name, when given)."""
    maps, labels = attention_of(model, tok, prompt)
    c = model.config
    shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    # the weights say whether the future is masked, not the settings: a model.py whose mask an edit took out gives
    # the tokens after each one weight, which white cells would hide
    ahead = any(np.triu(m, k=1).any() for m in maps)
    masked = ("white: the masked future" if not ahead else "no mask: every token sees every other" if not c.causal
              else "no mask, though the settings say causal=True: model.py's attention sees every token")
    title = (f"{name + ': ' if name else ''}{c.attention} attention weights for {shown!r} ({len(labels)} tokens)\n"
             f"rows: queries, columns: keys; {masked}")
    return draw_attention(maps, labels, title, path, dpi, causal=not ahead)


# ----------------------------------------------------------------------------- experiments (analyze.py)


CELL_IN = 0.42  # a heatmap cell of a head or a layer, wide enough for a two-decimal number
MOST_ANNOTATED = 100  # heatmaps with more cells than this show their numbers by colour alone


def heatmap(ax, values, cmap, limits, xlabels, ylabels, title, form="{:.2f}", norm=None):
    """values (rows, columns) as coloured cells, each labelled with its value (in form) where they are few; the
    image. The colours span limits, or norm where given (a scale other than a linear one)."""
    values = np.asarray(values, dtype=float)
    norm = norm or matplotlib.colors.Normalize(*limits)
    image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    stride = max(1, math.ceil(len(xlabels) * PITCH_IN / 12))  # every k-th label where a long prompt would crowd them
    ax.set_xticks(range(0, len(xlabels), stride), xlabels[::stride], fontsize=LABEL_PT, parse_math=False,
                  rotation=90 if max(map(len, xlabels)) > 2 else 0)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=LABEL_PT, parse_math=False)
    ax.tick_params(length=0, pad=2)
    ax.set_title(title, fontsize=HEAD_PT)
    if values.size <= MOST_ANNOTATED:
        for (i, j), v in np.ndenumerate(values):
            shade = float(np.clip(norm(v), 0, 1))  # where the cell's colour sits on the bar, 0 to 1
            dark = shade < 0.5 if cmap == "viridis" else abs(shade - 0.5) > 0.25
            ax.text(j, i, form.format(v), ha="center", va="center", fontsize=7, color="white" if dark else "black")
    return image


# the ablation deltas' colours: one scale for every picture, whatever its values (nats of val loss), symmetric
# about 0 and logarithmic past LINEAR_TO, so that +0.03 and +1 look as far apart as they are, in any run or snapshot
DELTA_LIMIT, LINEAR_TO = 3.0, 0.01
DELTA_TICKS = [-1, -0.1, -0.01, 0, 0.01, 0.1, 1]


def draw_heads(deltas, scores, title, path, dpi=100):
    """Every head's ablation delta (n_layer, n_head) and each score ({kind: (n_layer, n_head)}, in [0, 1]), one
    heatmap each: layers down, heads across. The deltas' colours are centred on 0, red where the loss rose, on a
    fixed scale (DELTA_LIMIT, LINEAR_TO) that the colour bar states."""
    deltas = np.asarray(deltas, dtype=float)
    L, H = deltas.shape
    delta_norm = matplotlib.colors.SymLogNorm(LINEAR_TO, vmin=-DELTA_LIMIT, vmax=DELTA_LIMIT, base=10)
    panels = [("ablation: change in val loss", deltas, "RdBu_r", delta_norm, "{:+.3f}"),
              *((kind.replace("_", "-"), s, "viridis", None, "{:.2f}") for kind, s in scores.items())]
    columns = 3
    rows = math.ceil(len(panels) / columns)
    panel_w, panel_h = max(2.0, CELL_IN * H) + 1.3, max(1.4, CELL_IN * L) + 0.9
    fig, axes = plt.subplots(rows, columns, figsize=(columns * panel_w, rows * panel_h + 0.6), squeeze=False)
    for ax, (name, values, cmap, norm, form) in zip(axes.flat, panels):
        image = heatmap(ax, values, cmap, (0.0, 1.0), [str(h) for h in range(H)], [f"L{layer}" for layer in range(L)],
                        name, form, norm)
        ax.set_xlabel("head", fontsize=HEAD_PT)
        bar = fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03, **(dict(extend="both") if norm else {}))
        if norm:  # a log scale says so, and where its ticks are
            bar.set_ticks(DELTA_TICKS, labels=[f"{t:+g}" if t else "0" for t in DELTA_TICKS])
            bar.set_label(f"nats; log scale past ±{LINEAR_TO:g}, fixed", fontsize=LABEL_PT - 1)
        bar.ax.tick_params(labelsize=LABEL_PT - 1)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=TITLE_PT)
    fig.set_layout_engine("tight")  # laid out as it is saved, where its warnings are gathered
    save(fig, path, dpi)


def draw_patching(resid, heads, labels, limits, title, path, dpi=100):
    """Activation patching: the metric with the residual stream patched per (layer, position), resid (n_layer, T),
    and per head, heads (n_layer, n_head), on one colour scale (limits: its ends)."""
    resid, heads = np.asarray(resid, dtype=float), np.asarray(heads, dtype=float)
    L, T = resid.shape
    wide = max(3.0, min(18.0, PITCH_IN * T + 1.5))
    fig, axes = plt.subplots(1, 2, figsize=(wide + max(2.0, CELL_IN * heads.shape[1]) + 2.5,
                                            max(2.2, CELL_IN * L) + 1.8),
                             gridspec_kw={"width_ratios": [wide, max(2.0, CELL_IN * heads.shape[1])]})
    layers = [f"L{layer}" for layer in range(L)]
    heatmap(axes[0], resid, "viridis", limits, labels, layers, "residual stream (resid_pre) patched at one position")
    axes[0].set_xlabel("position", fontsize=HEAD_PT)
    image = heatmap(axes[1], heads, "viridis", limits, [str(h) for h in range(heads.shape[1])], layers,
                    "one head's output (hook_z) patched")
    axes[1].set_xlabel("head", fontsize=HEAD_PT)
    fig.colorbar(image, ax=axes[1], fraction=0.1, pad=0.04).ax.tick_params(labelsize=LABEL_PT - 1)
    fig.suptitle(title, fontsize=TITLE_PT)
    fig.set_layout_engine("tight")  # laid out as it is saved, where its warnings are gathered
    save(fig, path, dpi)


# ----------------------------------------------------------------------------- timeline

KIND_COLOURS = {"previous_token": "tab:blue", "first_token": "tab:grey", "duplicate_token": "tab:green",
                "induction": "tab:red", "local": "tab:purple"}


def draw_timeline(steps, losses, phase, title, path, dpi=100):
    """A run's timeline: one small panel per head, each kind's score over the steps; beside them the train and val
    loss and the in-context learning score; the phase change (phase: {induction_iter, icl_iter, layer, head}, or
    None) marked on every panel. steps: the timeline records (gptkit/interp/timeline.py); losses: loss_series."""
    scored = [s for s in steps if s.get("heads")]
    L, H = (len(scored[0]["heads"]["induction"]), len(scored[0]["heads"]["induction"][0])) if scored else (0, 0)
    columns = max(H, 2)
    fig, axes = plt.subplots(L + 1, columns, figsize=(2.6 * columns, 2.0 * (L + 1) + 0.6), squeeze=False,
                             sharex=True)
    x = [s["iter"] for s in scored]
    for layer in range(L):
        for head in range(H):
            ax = axes[layer, head]
            for kind, colour in KIND_COLOURS.items():
                ax.plot(x, [s["heads"][kind][layer][head] for s in scored], color=colour, linewidth=1.2,
                        label=kind.replace("_", "-"))
            ax.set_ylim(0, 1)
            ax.set_title(f"L{layer}H{head}", fontsize=HEAD_PT)
        for ax in axes[layer, H:]:
            ax.axis("off")
    if L:
        axes[0, 0].legend(fontsize=LABEL_PT - 2, loc="upper left")
    bottom = axes[L]
    for name, (iters, _, values) in losses.items():
        bottom[0].plot(iters, values, label=name, linewidth=1.2)
    bottom[0].set_title("loss", fontsize=HEAD_PT)
    bottom[0].legend(fontsize=LABEL_PT - 2)
    bottom[1].plot([s["iter"] for s in steps], [s["icl"] for s in steps], color="black", linewidth=1.2)
    bottom[1].set_title("in-context learning score", fontsize=HEAD_PT)
    bottom[1].set_ylabel("late − early loss", fontsize=LABEL_PT)
    for ax in bottom[2:]:
        ax.axis("off")
    for ax in (ax for ax in axes.flat if ax.axison):
        ax.set_xscale("symlog", linthresh=10)  # steps 0, 1, 2, 4, ... then every evaluation
        if phase and phase.get("induction_iter") is not None:
            ax.axvline(phase["induction_iter"], color="tab:red", linestyle="--", linewidth=0.8)
        if phase and phase.get("icl_iter") is not None:
            ax.axvline(phase["icl_iter"], color="black", linestyle=":", linewidth=0.8)
    for ax in axes[L][:2]:
        ax.set_xlabel("step", fontsize=LABEL_PT)
    width = int(2.6 * columns * 11)  # characters of the title's size that fit across the figure
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()), fontsize=TITLE_PT)
    fig.set_layout_engine("tight")  # laid out as it is saved, where its warnings are gathered
    save(fig, path, dpi)
