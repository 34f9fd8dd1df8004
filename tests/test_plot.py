"""plot.py and the pictures it draws (gptkit/interp/pictures.py): loss and attention PNGs whose every label is readable,
each subcommand taking only its own options, an output it cannot write refused before any work, and runs
compared (their curves, and what differs between them)."""

import json
import re
import warnings

import matplotlib.image
import matplotlib.text
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from conftest import REPO, assert_one_error_line, check_ok, run_here, run_script, train_args
from gptkit.base.errors import UserError
from gptkit.base.settings import settings
from gptkit.interp.hooks import token_label
from test_metrics import RL_LINES, write_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(trained_run, tmp_path_factory):
    """A copy of the session's trained run: plot.py writes its pictures into the run folder."""
    import shutil

    copy = tmp_path_factory.mktemp("plot") / "run"
    shutil.copytree(trained_run[0], copy)
    return copy


def assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # not a blank canvas
    return image


# ----------------------------------------------------------------------------- attention pictures

MIN_TEXT_PT = 7
# blanks that show as symbols, and '$' that must not be read as a formula
PROSE = "First Citizen: $x$ or $$?\nBefore we proceed any further, hear me speak."


class Chars:
    """A character tokenizer of every code point, for token_label."""
    chat = None  # no chat markers, as a tokenizer of a plain text's run

    @staticmethod
    def decode(ids):
        return "".join(map(chr, ids))

    @staticmethod
    def token_label(token):
        return chr(token)


def attention_picture(path, n_layer, n_head, T):
    """draw_attention's figure for random causal maps of the first T characters of PROSE, and their labels."""
    from gptkit.interp.pictures import draw_attention

    weights = np.tril(np.random.default_rng(0).random((n_layer, n_head, T, T)) ** 4)
    labels = [token_label(Chars, ord(c)) for c in (PROSE * 2)[:T]]
    title = f"scaled attention weights for {(PROSE * 2)[:T]!r} ({T} tokens)\nrows: queries, columns: keys"
    return draw_attention(list(weights / weights.sum(-1, keepdims=True)), labels, title, path), labels


def heatmaps(fig):
    return [ax for ax in fig.axes if ax.images]


@pytest.mark.parametrize("n_layer, n_head", [(1, 1), pytest.param(6, 6, marks=pytest.mark.slow)])
def test_attention_pictures_grow_with_the_prompt_and_keep_every_label_readable(tmp_path, n_layer, n_head):
    """More tokens make a larger figure, never smaller text; the labels name the tokens at their positions,
    and no label touches its neighbour or any heatmap."""
    sizes = {}
    for T in (8, 64):
        fig, labels = attention_picture(tmp_path / f"{T}.png", n_layer, n_head, T)
        assert_png(tmp_path / f"{T}.png")
        sizes[T] = fig.get_size_inches()
        texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
        assert min(t.get_fontsize() for t in texts) >= MIN_TEXT_PT
        renderer = FigureCanvasAgg(fig).get_renderer()  # closed, the figure keeps the layout saving gave it
        maps = heatmaps(fig)
        assert len(maps) == n_layer * n_head
        boxes = [ax.get_window_extent(renderer) for ax in maps]
        for ax in maps:
            for ticks, texts, side in ((ax.get_xticks(), ax.get_xticklabels(), "x"),
                                       (ax.get_yticks(), ax.get_yticklabels(), "y")):
                assert [t.get_text() for t in texts] == [labels[int(i)] for i in ticks]
                assert len(ticks) >= T / 2
                extents = sorted((t.get_window_extent(renderer) for t in texts), key=lambda b: getattr(b, f"{side}0"))
                assert all(getattr(a, f"{side}1") <= getattr(b, f"{side}0") for a, b in zip(extents, extents[1:]))
                assert not any(e.overlaps(box) for e in extents for box in boxes)
    assert (sizes[64] > sizes[8]).all(), sizes


def test_layers_and_heads_are_counted_from_0(tmp_path):
    """L0H0 to L1H2 for 2 layers of 3 heads, as the explorer and interpretability papers count them."""
    fig, _ = attention_picture(tmp_path / "two.png", 2, 3, 8)
    texts = " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))
    assert {"head 0", "head 2", "layer 0", "layer 1"} <= set(re.findall(r"(?:head|layer) \d+", texts))
    assert not re.search(r"head 3|layer 2", texts)


def test_a_one_head_picture_has_its_colour_bar_beside_the_heatmap(tmp_path):
    fig, _ = attention_picture(tmp_path / "one.png", 1, 1, 32)
    (heatmap,), bar = heatmaps(fig), fig.axes[-1]
    width = fig.get_size_inches()[0]
    assert 0 < (bar.get_position().x0 - heatmap.get_position().x1) * width < 0.3
    assert heatmap.get_position().width > 0.6  # the heatmap fills the figure, no half of it left empty


def test_tokens_and_titles_that_look_like_formulas_are_drawn_as_text(tmp_path):
    """GPT-2 has tokens such as '$$': matplotlib would typeset them as (broken) formulas."""
    from gptkit.interp.pictures import draw_attention

    fig = draw_attention([np.full((1, 3, 3), 1 / 3)], ["$$", "$x$", "a"], "weights for '$$ costs $x$'",
                         tmp_path / "dollars.png", causal=False)
    assert_png(tmp_path / "dollars.png")
    assert [t.get_text() for t in heatmaps(fig)[0].get_yticklabels()] == ["$$", "$x$", "a"]


def test_an_attention_picture_shows_the_future_a_mask_taken_out_by_hand_lets_the_model_see(tmp_path, monkeypatch):
    """The notes' encoder, "just delete the single line that does masking", its settings still causal: the picture
    left the weights after each token white, titled "white: the masked future". Now the weights decide: every
    cell drawn, and the title says the model sees every token; a decoder's future stays white."""
    import torch.nn.functional as F

    import model as model_py
    from conftest import tiny_model
    from gptkit.data.tokenizer import CharTokenizer
    from gptkit.interp.pictures import draw_model_attention

    tok = CharTokenizer(sorted(set("abcdefghij ")))
    masked = heatmaps(draw_model_attention(tiny_model(vocab_size=11), tok, "abc def", tmp_path / "decoder.png"))
    assert masked[0].images[0].get_array().mask.sum() == 21  # the 7 x 6 / 2 cells above the diagonal
    monkeypatch.setattr(model_py.SelfAttention, "pattern", lambda self, q, k: self.hook_pattern(
        F.softmax(self.hook_attn_scores(self.score(self, q, k)), dim=-1)))
    fig = draw_model_attention(tiny_model(vocab_size=11), tok, "abc def", tmp_path / "unmasked.png")
    assert not heatmaps(fig)[0].images[0].get_array().mask.any()
    assert fig._suptitle.get_text().endswith("no mask, though the settings say causal=True: model.py's attention "
                                             "sees every token")


def test_characters_no_font_here_draws_are_one_note_not_a_warning_each(tmp_path, capsys):
    """A BPE run's tokens may be Chinese or emoji. Where no font installed has a character, matplotlib warns once per
    character (and again measuring the labels): one printed note instead, naming them; nothing where fonts have
    them all."""
    from gptkit.interp.pictures import draw_attention

    path = tmp_path / "scripts.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw_attention([np.full((1, 3, 3), 1 / 3)], ["狐", "⟨e7⟩⟨8b⟩", "🦊"], "weights for '狐🦊'", path, causal=False)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"wrote {path}" and len(printed) <= 2
    assert len(printed) == 1 or (printed[1].startswith("note: ") and "show as boxes" in printed[1])
    assert_png(path)


def test_a_bpe_runs_attention_picture_labels_each_token_by_its_bytes(bpe_data, tmp_path, capsys):
    """plot.py attention on a run cut into a trained BPE: a token that holds part of a character is labelled with
    its bytes (⟨e7⟩), each label the token's own."""
    import plot
    from gptkit.interp.pictures import draw_model_attention
    from gptkit.run.run_folder import load_model
    from test_analyze import saved_run

    tok, prompt = bpe_data[2], "🎶 Лиса"
    run = saved_run(tmp_path / "bpe", tok=tok)
    plot.main(["attention", f"--out_dir={run}", f"--start={prompt}"])
    assert_png(run / "attention.png")
    fig = draw_model_attention(*load_model(run, "cpu"), prompt, tmp_path / "again.png")
    labels = [t.get_text() for t in heatmaps(fig)[0].get_yticklabels()]
    assert labels == [token_label(tok, t) for t in tok.encode(prompt)] and any("⟨" in label for label in labels)


def test_a_chat_runs_attention_picture_takes_and_labels_the_markers_by_their_names(tmp_path):
    import plot
    from gptkit.data.conversations import MARKERS
    from gptkit.data.tokenizer import CharTokenizer
    from gptkit.interp.pictures import draw_model_attention
    from gptkit.run.run_folder import load_model
    from test_analyze import saved_run
    from test_experiments import CHARS

    run = saved_run(tmp_path / "chat", tok=CharTokenizer(CHARS + "".join(MARKERS.values())))
    prompt = "<|user|>AB<|assistant|>BA<|end|>"
    plot.main(["attention", f"--out_dir={run}", f"--start={prompt}"])
    assert_png(run / "attention.png")
    fig = draw_model_attention(*load_model(run, "cpu"), prompt, tmp_path / "again.png")
    labels = [t.get_text() for t in heatmaps(fig)[0].get_yticklabels()]
    assert labels == ["<|user|>", "A", "B", "<|assistant|>", "B", "A", "<|end|>"]


# ----------------------------------------------------------------------------- plot.py

def test_loss_png(run_dir):
    check_ok(run_script("plot.py", "loss", f"--out_dir={run_dir}"))
    assert_png(run_dir / "loss.png")


def test_a_file_at_the_output_is_said_to_be_replaced(run_dir, tmp_path, capsys):
    import plot

    notes = tmp_path / "notes.png"
    notes.write_text("my notes, not a picture")
    plot.main(["loss", f"--out_dir={run_dir}", f"--output={notes}"])
    assert capsys.readouterr().out.strip() == f"wrote {notes}, replacing the file that was there"
    assert_png(notes)


def test_loss_png_of_a_run_ended_by_its_score_draws_the_score_beside_the_loss(run_dir, tmp_path, monkeypatch):
    import plot
    from gptkit.interp import pictures

    drawn = []
    monkeypatch.setattr(pictures, "save", lambda fig, path, dpi: drawn.append(fig))
    run = tmp_path / "run"
    run.mkdir()
    scores = [{"kind": "task_eval", "iter": i, "task": "addition", "pass_at_1": p} for i, p in ((5, 0.1), (10, 0.45))]
    (run / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text() +
                                       "".join(json.dumps(r) + "\n" for r in scores))
    plot.main(["loss", f"--out_dir={run}"])
    lines = [line for ax in drawn[0].axes for line in ax.get_lines() if line.get_label() == "addition held-out pass@1"]
    assert len(lines) == 1 and list(lines[0].get_ydata()) == [0.1, 0.45]


def test_loss_png_of_an_rl_run_draws_its_reward_and_held_out_scores(tmp_path):
    import plot

    run = write_metrics(tmp_path / "rl", RL_LINES)
    plot.main(["loss", f"--out_dir={run}"])
    assert_png(run / "loss.png")


def test_attention_png(run_dir, tmp_path, capsys):
    import plot

    out = tmp_path / "pictures" / "attn.png"  # a folder that does not exist yet
    plot.main(["attention", f"--out_dir={run_dir}", "--start=First Citizen:\\n", f"--output={out}"])
    assert str(out) in capsys.readouterr().out
    image = assert_png(out)
    assert image.shape[0] > 400  # a grid of 2 layers x 2 heads


def test_a_snapshots_attention_picture_has_a_file_and_a_title_of_its_own(tmp_path, monkeypatch):
    """--checkpoint=iter:150 draws attention-iter150.png, titled with the snapshot's step: the run's own
    attention.png is never drawn over with another checkpoint's weights."""
    import plot
    from gptkit.interp import pictures
    from gptkit.run.run_folder import RunDir
    from test_analyze import saved_run
    from test_checkpoints import rewrite

    run = saved_run(tmp_path / "run")
    RunDir(run).snapshots.mkdir()
    rewrite(run / "best.pt", ("iter_num",), 150)  # a snapshot holds its step
    (run / "best.pt").rename(RunDir(run).snapshot(150))
    drawn = []
    monkeypatch.setattr(pictures, "save", lambda fig, path, dpi: drawn.append((fig._suptitle.get_text(), path)))
    plot.main(["attention", f"--out_dir={run}", "--checkpoint=iter:150", "--start=AB"])
    (title, path), = drawn
    assert path == run / "attention-iter150.png" and title.startswith("run, the snapshot of step 150: ")


def test_loss_png_of_a_resumed_run(run_dir, tmp_path):
    """A resumed run appends records whose clock restarts at zero; the picture still gets drawn."""
    import plot

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "metrics.jsonl").write_text("\n".join(lines + lines) + "\n")
    plot.main(["loss", f"--out_dir={resumed}", "--dpi=50"])
    assert_png(resumed / "loss.png")


@pytest.mark.slow
def test_missing_inputs_are_one_line_errors(tmp_path):
    proc = run_script("plot.py", "loss", f"--out_dir={tmp_path}")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, "error: no metrics.jsonl in*")

    import plot

    with pytest.raises(UserError, match="no checkpoint in"):
        plot.main(["attention", f"--out_dir={tmp_path}"])
    with pytest.raises(UserError, match="unknown picture 'bogus'"):
        plot.main(["bogus"])
    with pytest.raises(UserError, match="unknown config key"):
        plot.main(["loss", "--outdir=x"])
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 0, "val_loss": 2.0}) + "\n{truncated\n")
    with pytest.raises(UserError, match="not JSON"):
        plot.main(["loss", f"--out_dir={tmp_path}"])
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(UserError, match="no train or eval records"):
        plot.main(["loss", f"--out_dir={tmp_path}"])


# ----------------------------------------------------------------------------- plot.py's options

@pytest.mark.slow
def test_each_plot_subcommand_lists_and_takes_only_its_own_options():
    import plot

    listed = {}
    for name, (_, config) in plot.COMMANDS.items():
        proc = check_ok(run_script("plot.py", name, "--help"))
        listed[name] = set(re.findall(r"^  --(\w+)=", proc.stdout, flags=re.M))
        assert listed[name] == set(settings(config)), (name, proc.stdout)
    assert listed["loss"] == {"out_dir", "output", "dpi"}
    assert listed["attention"] == listed["loss"] | {"checkpoint", "start", "device"}
    for key in listed["attention"] - listed["loss"]:  # refused, not silently ignored
        with pytest.raises(UserError, match=f"unknown config key '{key}'"):
            plot.main(["loss", f"--{key}=best"])


@pytest.mark.parametrize("picture, output", [
    pytest.param("loss", "picture.foo", marks=pytest.mark.slow),  # as a user runs it; the others in this process
    *(pair for pair in [(p, o) for p in ("loss", "attention") for o in ("picture.foo", "picture", "picture.png.bak")]
      if pair != ("loss", "picture.foo"))])
def test_an_output_matplotlib_cannot_write_is_refused_before_any_work(tmp_path, picture, output):
    """The run folder is empty: had the command read metrics or loaded a model first, it would fail on that."""
    run = run_script if (picture, output) == ("loss", "picture.foo") else run_here
    proc = run("plot.py", picture, f"--out_dir={tmp_path}", f"--output={tmp_path / output}")
    assert proc.returncode == 1
    line = assert_one_error_line(proc.stderr, "error: output must end in one of *")
    assert {".png", ".pdf", ".svg"} <= set(re.findall(r"\.\w+", line))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("picture", [pytest.param("loss", marks=pytest.mark.slow), "attention"])
def test_an_output_that_is_a_folder_or_under_a_file_is_refused_before_any_work(tmp_path, picture):
    """loss as a user runs it, attention in this process."""
    run = run_script if picture == "loss" else run_here
    folder = tmp_path / "pictures"
    folder.mkdir()
    (tmp_path / "notes.txt").write_text("mine\n")
    for output, expected in [(folder, f"error: output {folder} is a folder, not a picture file*"),
                             (tmp_path / "notes.txt" / "x.png", f"error: output {tmp_path / 'notes.txt' / 'x.png'} "
                              f"cannot be written: {tmp_path / 'notes.txt'} is a file, not a folder")]:
        proc = run("plot.py", picture, f"--out_dir={tmp_path}", f"--output={output}")
        assert proc.returncode == 1
        assert_one_error_line(proc.stderr, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pictures"]  # no pictures.png beside it
    assert list(folder.iterdir()) == [] and (tmp_path / "notes.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_a_folder_at_the_default_picture_path_is_refused(tmp_path):
    (write_metrics(tmp_path) / "loss.png").mkdir()
    proc = run_script("plot.py", "loss", f"--out_dir={tmp_path}")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: output {tmp_path / 'loss.png'} is a folder*")


@pytest.mark.parametrize("output, signature", [pytest.param("loss.svg", b"<?xml", marks=pytest.mark.slow),
                                               ("loss.PDF", b"%PDF")])
def test_the_output_extension_picks_the_format(tmp_path, output, signature):
    """svg as a user runs it, PDF in this process."""
    run = run_script if output == "loss.svg" else run_here
    proc = check_ok(run("plot.py", "loss", f"--out_dir={write_metrics(tmp_path)}", f"--output={tmp_path / output}"))
    assert proc.stdout.strip() == f"wrote {tmp_path / output}"
    assert (tmp_path / output).read_bytes().startswith(signature)


# ----------------------------------------------------------------------------- plot.py compare

COMPARED = ["--max_iters=10", "--eval_interval=5", "--eval_iters=1", "--log_interval=5", "--warmup_iters=2",
            "--learning_rate=3e-3", "--attention_path=fused"]  # named: a measured path is not this test's


@pytest.fixture(scope="module")
def compared(data_dir, workdir):
    """Tiny runs as a learner makes them, in this process: the base, one with another learning rate, and one
    with another learning rate that also trained fewer steps."""
    import train

    for name, extra in {"base": [], "lr": ["--learning_rate=1e-3"],
                        "lr_shorter": ["--learning_rate=1e-3", "--max_iters=8"]}.items():
        train.main(train_args(data_dir, workdir / name, *COMPARED, *extra))
    return workdir


def notes(stdout):
    return [line for line in stdout.splitlines() if line.startswith("note:")]


@pytest.mark.slow
def test_compare_names_the_one_setting_that_differs_and_draws_both_runs(compared):
    """As a user runs it: the folders as arguments, the picture in the first one's folder."""
    base = compared / "base"
    proc = check_ok(run_script("plot.py", "compare", base, compared / "lr"))
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("base: 10 steps, 640 tokens seen, final val loss ")  # 10 x 4 sequences x 16
    assert lines[2:5] == ["lr against base:", "  settings: learning_rate 0.003 → 0.001",
                          "  model.py: the same code"]
    assert notes(proc.stdout) == []
    assert lines[-1] == f"wrote {base / 'compare.png'}"
    assert_png(base / "compare.png")


@pytest.mark.slow
def test_compare_notes_the_steps_that_differ_besides_the_setting(compared, tmp_path):
    proc = check_ok(run_here("plot.py", "compare", compared / "base", compared / "lr_shorter",
                             f"--output={tmp_path / 'c.png'}"))
    assert "  settings: learning_rate 0.003 → 0.001, max_iters 10 → 8" in proc.stdout.splitlines()
    assert notes(proc.stdout) == ["note: besides learning_rate, lr_shorter differs from base in steps (10 → 8): "
                                  "the comparison is not only your edit"]
    assert_png(tmp_path / "c.png")


@pytest.mark.slow
def test_compare_names_the_pieces_of_model_py_an_edit_changed(compared, data_dir, tmp_path):
    """A learner's edit to model.py, trained from a copy of the project, against the base from before it."""
    import shutil

    tree = tmp_path / "project"
    shutil.copytree(REPO / "gptkit", tree / "gptkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "train.py", tree)
    source = (REPO / "model.py").read_text(encoding="utf-8")
    edited = source.replace("return F.relu(x).square()", "return F.relu(x) * F.relu(x)")
    assert edited != source
    (tree / "model.py").write_text(edited, encoding="utf-8")
    check_ok(run_script(tree / "train.py", *train_args(data_dir, tmp_path / "edited", *COMPARED)))
    proc = check_ok(run_here("plot.py", "compare", compared / "base", tmp_path / "edited",
                             f"--output={tmp_path / 'c.png'}"))
    lines = proc.stdout.splitlines()
    assert lines[2:5] == ["edited against base:", "  settings: the same", "  model.py: relu_squared changed"]
    assert notes(proc.stdout) == []


@pytest.mark.slow
def test_compare_refuses_bad_input_in_one_line(compared, tmp_path):
    """The first case as a user runs it, the others in this process; nothing is drawn."""
    import shutil

    base, damaged = compared / "base", tmp_path / "damaged"
    empty, missing = tmp_path / "empty", tmp_path / "missing"
    empty.mkdir()
    shutil.copytree(compared / "lr", damaged)
    rl = write_metrics(shutil.copytree(compared / "lr", tmp_path / "rl"), RL_LINES)  # a checkpoint, and RL's records
    data = bytearray((damaged / "latest.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (damaged / "latest.pt").write_bytes(bytes(data))
    cases = [([base], "error: compare needs two or more run folders (got 1)*"),
             ([base, empty], f"error: no run in {empty} (no latest.pt or best.pt); train one first*"),
             ([base, missing], f"error: no run in {missing}: no such folder"),
             ([base, damaged], f"error: {damaged / 'latest.pt'} is damaged: its contents do not match the "
                               "checksum written with them"),
             ([base, f"{base}/"], f"error: {base} is named twice; name each run once"),
             ([base, rl], f"error: {rl} is an rl.py run, which has no loss curve to compare; plot.py loss "
                          f"--out_dir={rl} draws its reward")]
    for i, (folders, expected) in enumerate(cases):
        run = run_script if i == 0 else run_here
        proc = run("plot.py", "compare", *folders, f"--output={tmp_path / 'c.png'}")
        assert proc.returncode == 1
        assert_one_error_line(proc.stderr, expected)
    assert not (tmp_path / "c.png").exists()


def test_compare_draws_each_run_in_one_colour_against_steps_and_tokens(tmp_path):
    """The tokens panel puts each evaluation at its step times the run's tokens a step."""
    from gptkit.interp.pictures import draw_comparison

    def evals(losses):
        return [{"kind": "eval", "iter": 5 * i, "train_loss": loss - 0.1, "val_loss": loss, "elapsed_s": i}
                for i, loss in enumerate(losses)]

    fig = draw_comparison([("base", evals([4.0, 3.0, 2.5]), 64), ("wider", evals([4.0, 2.8]), 128)],
                          "two runs", tmp_path / "c.png")
    assert_png(tmp_path / "c.png")
    by_steps, by_tokens = fig.axes
    assert [list(line.get_xdata()) for line in by_steps.lines] == [[0, 5, 10]] * 2 + [[0, 5]] * 2
    assert [list(line.get_xdata()) for line in by_tokens.lines] == [[0, 320, 640]] * 2 + [[0, 640]] * 2
    colours = [line.get_color() for line in by_tokens.lines]
    assert colours[0] == colours[1] != colours[2] == colours[3]
    assert [t.get_text() for t in by_steps.get_legend().get_texts()] == ["base", "wider", "val", "train"]
