"""analyze.py: the heads table (and its JSON and picture) on a trained run, agreeing with the Python API; patching
and attribution from the command line; the run folder as the first argument or --out_dir; every mistake one line."""

import dataclasses
import json
import shlex
import subprocess
import sys

import pytest
import torch

from conftest import REPO, assert_one_error_line, check_ok, run_here, run_script, tiny_model
from gptkit.base.errors import UserError
from gptkit.data.conversations import MARKERS
from gptkit.data.tokenizer import CharTokenizer
from gptkit.interp.hooks import token_label
from gptkit.run.checkpoint import save_checkpoint
from test_experiments import CHARS
from test_plot import assert_png

KEYS = {"layer", "head", "name", "ablation_delta", "previous_token", "first_token", "duplicate_token", "induction",
        "local", "label"}


def saved_run(folder, chars=CHARS, trained_on=None, tok=None, **overrides):
    """A run folder holding a best.pt of a tiny model (random weights, TINY's shape with overrides) and a
    character vocabulary (or the tokenizer tok): what analyze.py reads of a run, written in a moment."""
    tok = tok or CharTokenizer(chars)
    model = tiny_model(attention_weights=0.5, **dict(dict(vocab_size=tok.vocab_size), **overrides))
    save_checkpoint({"model": model.state_dict(), "model_args": dataclasses.asdict(model.config),
                     "tokenizer": tok.to_meta(), "config": trained_on or {}}, folder / "best.pt")
    return folder


@pytest.fixture
def tiny(tmp_path):
    return saved_run(tmp_path / "tiny")


# ----------------------------------------------------------------------------- heads, on a trained run


def test_the_heads_table_lists_every_head_and_draws_its_picture(trained_run, tmp_path):
    out = trained_run[0]
    picture = tmp_path / "heads.png"
    proc = check_ok(run_here("analyze.py", "heads", out, f"--output={picture}", "--tokens=256"))
    wrote, *lines = proc.stdout.splitlines()  # the picture first, then the answer
    assert lines[0].startswith("val loss ") and "on 256 tokens of tiny's val split (8 windows of 32)" in lines[0]
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header == ["layer", "head", "ablation Δ val loss", "previous-token", "first-token", "duplicate-token",
                      "induction", "local", "label"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:8]]
    assert [row[:2] for row in rows] == [["0", "L0H0"], ["0", "L0H1"], ["1", "L1H0"], ["1", "L1H1"]]
    assert all(0 <= float(cell) <= 1 for row in rows for cell in row[3:-1])
    assert lines[9].startswith("label: the kind whose score goes furthest from chance toward 1")
    assert wrote == f"wrote {picture}"
    assert_png(picture)
    assert proc.stderr.startswith("ablating each of 4 heads in turn on 256 tokens of tiny's val split")


def test_the_page_names_every_key_of_a_heads_json_entry():
    """docs/analysis.md's list of an entry's keys is the whole of what --json gives (KEYS, checked below)."""
    page = (REPO / "docs" / "analysis.md").read_text(encoding="utf-8")
    listed = page.split("Each `--json` entry has ", 1)[1].split(";", 1)[0]
    assert {key for key in KEYS if f"`{key}`" not in listed} == set()


def test_each_head_has_the_explorers_label(trained_run, tmp_path):
    """The label column is the explorer's: head_labels over the same scores."""
    from gptkit.explorer.experiment_answers import heads_report
    from gptkit.interp.experiments import open_run

    answer = json.loads(check_ok(run_here("analyze.py", "heads", trained_run[0], "--json", "--tokens=512",
                                          f"--output={tmp_path / 'h.png'}")).stdout)
    run = open_run(trained_run[0])
    labels = heads_report(run.model, run.tok, lambda: {"config": run.trained_on})["labels"]
    assert [e["label"] for e in answer["heads"]] == [label for row in labels for label in row]


def test_heads_json_agrees_with_the_api_on_the_same_tokens(trained_run, tmp_path):
    """In float32 the command's deltas are the API's ablation_deltas on the val split's first windows."""
    from gptkit.data.dataset import Split, load_meta
    from gptkit.interp.experiments import ablation_deltas, open_run

    out = trained_run[0]
    proc = check_ok(run_script("analyze.py", "heads", f"--out_dir={out}", "--json", "--ablation=mean",
                               "--dtype=float32", "--tokens=320", f"--output={tmp_path / 'heads.png'}"))
    answer = json.loads(proc.stdout)  # stdout holds the JSON alone; the picture's line went to stderr
    assert "wrote " in proc.stderr and answer["ablation"] == "mean" and answer["dtype"] == "float32"
    assert answer["tokens"] == 320 and len(answer["heads"]) == 4  # 10 windows of 32
    assert all(KEYS <= set(entry) for entry in answer["heads"])
    run = open_run(out)
    folder, meta = load_meta(run.trained_on["data_dir"], run.trained_on["dataset"])
    idx, targets = Split(folder, "val", meta, 32).batch(torch.arange(10) * 32, "cpu")
    loss, deltas = ablation_deltas(run.model, idx, targets, "mean")
    assert answer["val_loss"] == pytest.approx(loss, abs=1e-5)
    assert [e["ablation_delta"] for e in answer["heads"]] == pytest.approx(deltas.flatten().tolist(), abs=1e-5)


def test_a_chat_runs_heads_are_scored_on_what_its_training_scored(chat_run, tmp_path):
    """A chat dataset's prompt targets are -1 in its val split: the loss skips them, as train.py's does."""
    from gptkit.data.dataset import Split, load_meta
    from gptkit.interp.experiments import open_run

    answer = json.loads(check_ok(run_here("analyze.py", "heads", f"--out_dir={chat_run}", "--json",
                                          f"--output={tmp_path / 'h.png'}")).stdout)
    run = open_run(chat_run)
    folder, meta = load_meta(run.trained_on["data_dir"], run.trained_on["dataset"])
    split = Split(folder, "val", meta, run.config.block_size)
    windows = min(65_536, split.length - 1) // run.config.block_size  # --tokens' default, or every whole window
    _, targets = split.batch(torch.arange(windows) * run.config.block_size, "cpu")
    assert answer["tokens"] == int((targets != -1).sum()) < targets.numel()


def test_the_whole_val_split_when_it_holds_fewer_tokens_than_asked(trained_run, data_dir, tmp_path):
    proc = check_ok(run_here("analyze.py", "heads", trained_run[0], "--json", f"--output={tmp_path / 'h.png'}"))
    val = json.loads((data_dir / "tiny" / "meta.json").read_text(encoding="utf-8"))["val_tokens"]
    assert json.loads(proc.stdout)["tokens"] == (val - 1) // 32 * 32 < 65_536  # every whole window of 32


def test_one_head_is_every_head_allowed_with_a_note(data_dir, tmp_path):
    meta = json.loads((data_dir / "tiny" / "meta.json").read_text(encoding="utf-8"))
    out = saved_run(tmp_path / "one", meta["vocab"], {"dataset": "tiny", "data_dir": str(data_dir)}, n_layer=1,
                    n_head=1)
    proc = check_ok(run_here("analyze.py", "heads", out, "--tokens=64"))
    assert "| 0     | L0H0 |" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == ("note: the model has one head, so ablating it switches every "
                                                    "head off (allowed: its row is what all of attention adds)")


def test_an_attention_without_hook_pattern_is_its_one_line_before_any_ablating(data_dir, tmp_path, monkeypatch):
    """The notes' running average written into model.py has no softmax to watch: the line came after every head
    had been ablated (45 s of a small run's)."""
    import analyze
    import model as model_py

    def averaging(self, q, k, v):
        T = q.size(2)
        wei = torch.tril(torch.ones(T, T, device=q.device))
        return (wei / wei.sum(1, keepdim=True)) @ v

    meta = json.loads((data_dir / "tiny" / "meta.json").read_text(encoding="utf-8"))
    out = saved_run(tmp_path / "avg", meta["vocab"], {"dataset": "tiny", "data_dir": str(data_dir)})
    monkeypatch.setattr(model_py.SelfAttention, "written", averaging)
    monkeypatch.setattr("gptkit.interp.experiments.ablation_deltas", lambda *a: pytest.fail("ablated first"))
    with pytest.raises(UserError, match="never passes through the hook point blocks.0.attn.hook_pattern"):
        analyze.main(["heads", str(out), "--tokens=64"])


# ----------------------------------------------------------------------------- files: whole, where they may go


@pytest.mark.parametrize("command", [["patch", "--clean=ROMEO:", "--corrupt=JULIE:"], ["heads", "--tokens=64"]])
def test_a_picture_is_never_written_through_a_link(data_dir, tmp_path, command):
    """A link where the picture goes is refused in one line before any work or output; the file it points at
    is untouched."""
    meta = json.loads((data_dir / "tiny" / "meta.json").read_text(encoding="utf-8"))
    out = saved_run(tmp_path / "run", meta["vocab"], {"dataset": "tiny", "data_dir": str(data_dir)})
    precious = tmp_path / "precious.png"
    precious.write_bytes(b"mine")
    (out / f"{command[0]}.png").symlink_to(precious)
    proc = run_here("analyze.py", command[0], out, *command[1:])
    assert_one_error_line(proc.stderr, f"error: {out / command[0]}.png is a link, and the tool writes this "
                                       "file itself, never through a link; remove it")
    assert proc.stdout == "" and precious.read_bytes() == b"mine"


def test_a_folder_that_cannot_take_the_picture_is_refused_before_the_table(tiny, immutable):
    immutable(tiny)
    proc = run_here("analyze.py", "patch", tiny, "--clean=ROMEO:", "--corrupt=JULIE:")
    assert_one_error_line(proc.stderr, f"error: cannot write {tiny / 'patch.png'} (permission denied)*")
    assert proc.stdout == ""


def test_the_picture_is_written_when_the_reader_stops_early(tiny):
    """`analyze.py patch --json | true`: the reader is gone before the answer is printed, yet the picture is kept
    (it is drawn first) and the command ends cleanly."""
    proc = subprocess.run(f"{shlex.quote(sys.executable)} analyze.py patch {shlex.quote(str(tiny))} --clean=ROMEO: "
                          "--corrupt=JULIE: --json | true", shell=True, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert_png(tiny / "patch.png")


def test_characters_without_a_glyph_are_one_note(tmp_path, monkeypatch):
    """Prompts in Chinese, where no font has their glyphs: one note, not a matplotlib warning a character (the
    layout, which meets them first, is done as the picture is saved, where the warnings are gathered)."""
    import matplotlib

    import gptkit.interp.pictures  # noqa: F401  (it sets the fonts when imported; only DejaVu Sans from here on)
    monkeypatch.setitem(matplotlib.rcParams, "font.family", ["DejaVu Sans"])
    out = saved_run(tmp_path / "han", CHARS + "罗密欧朱丽叶")
    proc = check_ok(run_here("analyze.py", "patch", out, "--clean=罗密欧", "--corrupt=朱丽叶"))
    assert "Glyph" not in proc.stderr + proc.stdout and "Warning" not in proc.stderr
    note = next(line for line in proc.stdout.splitlines() if line.startswith("note: "))
    assert note.startswith("note: 6 characters of the picture (") and sorted(note[35:41]) == sorted("罗密欧朱丽叶")


# ----------------------------------------------------------------------------- patch and attribute


def test_patch_prints_both_heatmaps_and_draws_them(tiny):
    proc = check_ok(run_here("analyze.py", "patch", tiny, "--clean=ROMEO:", "--corrupt=JULIE:", "--target=\\n",
                             "--foil=A", "--json"))
    answer = json.loads(proc.stdout)
    assert answer["metric"] == "logit(↵) - logit(A)" and answer["tokens"] == list("JULIE:")
    assert len(answer["resid"]) == 2 and len(answer["resid"][0]) == 6 and len(answer["heads"][1]) == 4
    assert answer["resid"][0][0] != answer["corrupt"] == answer["resid"][0][-1]  # both prompts end in ":"
    assert_png(tiny / "patch.png")
    table = check_ok(run_here("analyze.py", "patch", f"--out_dir={tiny}", "--clean=ROMEO:", "--corrupt=JULIE:"))
    assert table.stdout.splitlines()[1].startswith("metric: log-prob of ") and "| 5        | :     |" in table.stdout


def test_attribute_lists_each_part_and_their_sum(tiny):
    answer = json.loads(check_ok(run_here("analyze.py", "attribute", tiny, "--text=ROMEO:", "--json")).stdout)
    assert (answer["position"], answer["token"], answer["target"]) == (4, "O", ":")  # the last with a next token
    assert sum(answer["parts"].values()) + answer["norm_bias"] == pytest.approx(answer["raw_logit"], abs=1e-4)
    assert answer["adds_up"] is True
    table = check_ok(run_here("analyze.py", "attribute", tiny, "--text=ROMEO:", "--position=0")).stdout
    assert table.startswith("the logit of O, the token that came next, at position 0 (R): ")
    assert "; they sum to the logit (docs/analysis.md)" in table
    assert "| L1H3 " in table and "| final norm's bias " in table and "| sum " in table


def test_patch_and_attribute_on_a_bpe_run_label_each_token_by_its_bytes(bpe_data, tmp_path):
    """A run cut into a trained BPE: the positions are its tokens, each labelled as the explorer labels it, one that
    holds part of a character by its bytes (⟨f0⟩⟨9f⟩)."""
    tok = bpe_data[2]
    run = saved_run(tmp_path / "bpe", tok=tok)
    clean, corrupt = "a coin 🎶", "a crow 🎶"
    assert len(tok.encode(clean)) == len(tok.encode(corrupt))  # patching pairs positions
    answer = json.loads(check_ok(run_here("analyze.py", "patch", run, f"--clean={clean}", f"--corrupt={corrupt}",
                                          "--json")).stdout)
    assert answer["tokens"] == [token_label(tok, t) for t in tok.encode(corrupt)] and "⟨8e⟩" in answer["tokens"]
    assert len(answer["resid"][0]) == len(tok.encode(clean))
    answer = json.loads(check_ok(run_here("analyze.py", "attribute", run, f"--text={clean}", "--json")).stdout)
    ids = tok.encode(clean)
    assert (answer["token"], answer["target"]) == (token_label(tok, ids[-2]), token_label(tok, ids[-1]))
    assert sum(answer["parts"].values()) + answer["norm_bias"] == pytest.approx(answer["raw_logit"], abs=1e-4)


def test_a_chat_runs_markers_are_typed_and_labelled_by_their_names(tmp_path):
    """A chat run's markers are private characters no keyboard has: --clean, --corrupt, --target and --text take
    their names, and the answers label them by name."""
    run = saved_run(tmp_path / "chat", tok=CharTokenizer(CHARS + "".join(MARKERS.values())))
    answer = json.loads(check_ok(run_here("analyze.py", "patch", run, "--clean=<|user|>AB<|assistant|>",
                                          "--corrupt=<|user|>BA<|assistant|>", "--target=<|end|>", "--foil=A",
                                          "--json")).stdout)
    assert answer["tokens"] == ["<|user|>", "B", "A", "<|assistant|>"]
    answer = json.loads(check_ok(run_here("analyze.py", "attribute", run, "--text=<|user|>A<|end|>", "--json")).stdout)
    assert (answer["token"], answer["target"]) == ("A", "<|end|>")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, expected", [
    (["heads"], "error: this model has no attention (n_layer=0, a bigram model): *"),
    (["patch", "--clean=ROMEO", "--corrupt=JULIET"], "error: this model has no attention*"),
])
def test_a_run_without_attention_is_one_line(tmp_path, args, expected):
    bigram = saved_run(tmp_path / "bigram", n_layer=0)
    assert_one_error_line(run_here("analyze.py", args[0], bigram, *args[1:]).stderr, expected)
    answer = json.loads(check_ok(run_here("analyze.py", "attribute", bigram, "--text=AB", "--json")).stdout)
    assert set(answer["parts"]) == {"embed", "pos_embed"}  # attribution needs no attention


@pytest.mark.parametrize("args, expected", [
    (["patch", "--clean=ROMEO", "--corrupt=JULIET"], "error: the clean prompt is 5 tokens and the corrupt one 6: *"),
    (["patch", "--clean=ROMÉO", "--corrupt=JULIE"],
     "error: --clean: the text has characters outside the training vocabulary: 'É'"),
    (["patch", "--clean=", "--corrupt=JULIE"], "error: --clean is empty: *"),
    (["patch", "--clean=ROMEO", "--corrupt=JULIE", "--target=é"],
     "error: --target: the text has characters outside the training vocabulary: 'é'"),
    (["patch", "--clean=ROMEO", "--corrupt=JULIE", "--foil=AB"], "error: --foil must be one token; 'AB' is 2 tokens"),
    (["attribute", "--text="], "error: --text is empty: *"),
    (["attribute", "--text=ROMEO", "--position=4"], "error: position must be 0 to 3, a position with a next token*"),
    (["attribute", "--text=R"], "error: the text is one token: attribution needs a next token to attribute"),
    (["attribute", "--text=" + "A" * 17],
     "error: --text: the text is 17 tokens, longer than the model's block_size 16"),
    (["heads"], "error: {run} does not say which dataset it trained on; pass --dataset"),
    (["heads", "--dataset=nope"], "error: dataset folder {repo}/data/nope not found; create it with "
                                  "`python data/prepare.py --input=YOUR.txt --name=nope`"),
    (["heads", "--ablation=half"], "error: command line: ablation must be one of zero, mean (got 'half'*"),
    (["heads", "--tokens=0"], "error: tokens must be at least 1 (got 0)"),
    (["attribute", "--text=A", "--position=-2"], "error: position must be -1 (the last position with a next token) *"),
])
def test_mistakes_are_one_line(tiny, args, expected):
    assert_one_error_line(run_here("analyze.py", args[0], tiny, *args[1:]).stderr,
                          expected.format(run=tiny, repo=REPO))


def test_a_folder_without_a_run_and_an_unknown_analysis_are_one_line(tmp_path):
    assert_one_error_line(run_here("analyze.py", "heads", tmp_path).stderr, f"error: no checkpoint in {tmp_path}*")
    assert_one_error_line(run_here("analyze.py", "shapes", tmp_path).stderr,
                          "error: unknown analysis 'shapes'; choose one of: heads, patch, attribute, timeline, features")
    assert "usage: python analyze.py {heads, patch, attribute, timeline, features}" in check_ok(run_here("analyze.py")).stdout


# ----------------------------------------------------------------------------- JSON and pictures


def test_a_json_answer_is_strict_json_a_number_that_cannot_be_given_null_with_its_reason(tiny, capsys):
    """Issue 65: --json holds no NaN or Infinity (json.dumps(..., allow_nan=False) passes): a figure that came out
    so is null, with KEY_note beside it; a mapping or a list holding some gets one note, its keys kept as names."""
    import analyze
    from gptkit.run.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny / "best.pt")
    ckpt["model"]["lm_head.weight"][:] = 3e38  # finite, but every logit overflows: NaN
    save_checkpoint(ckpt, tiny / "best.pt")
    analyze.main(["attribute", str(tiny), "--text=ABAB", "--json"])
    answer = json.loads(capsys.readouterr().out, parse_constant=lambda word: pytest.fail(word))
    assert answer["logit"] is None and answer["logit_note"] == "came out as nan, which JSON cannot hold: null"
    assert set(answer["parts"].values()) == {None} and not any(k.endswith("_note") for k in answer["parts"])
    assert answer["parts_note"].startswith(f"{len(answer['parts'])} of its numbers came out as NaN or infinite")
    rows = analyze.finite_json({"heads": [{"name": "L0H0", "ablation_delta": float("-inf")}], "resid": [[1.0]]})
    assert rows == {"heads": [{"name": "L0H0", "ablation_delta": None,
                               "ablation_delta_note": "came out as -inf, which JSON cannot hold: null"}],
                    "resid": [[1.0]]}


def test_a_picture_of_another_checkpoint_has_a_file_and_a_title_of_its_own(tiny):
    """Issue 65: analyze.py heads --checkpoint=iter:150 wrote the run's heads.png over. Each checkpoint's picture
    is a file of its own beside the run's (heads-iter150.png, patch-latest.png), titled with whose weights it
    shows; the timeline, drawn from the run's records, stays timeline.png."""
    import analyze
    from gptkit.run.run_folder import RunDir
    from test_checkpoints import rewrite

    for config, picture in ((analyze.HeadsConfig, "heads"), (analyze.PatchConfig, "patch")):
        for checkpoint, name in (("best", f"{picture}.png"), ("latest", f"{picture}-latest.png"),
                                 ("iter:150", f"{picture}-iter150.png")):
            assert config(out_dir=str(tiny), checkpoint=checkpoint).output_path() == tiny / name
    assert analyze.TimelineConfig(out_dir=str(tiny), checkpoint="iter:150").output_path() == tiny / "timeline.png"
    assert analyze.HeadsConfig(out_dir=str(tiny), checkpoint="iter:150", output="x.png").output_path().name == "x.png"
    RunDir(tiny).snapshots.mkdir()
    rewrite(tiny / "best.pt", ("iter_num",), 150)  # a snapshot holds its step
    (tiny / "best.pt").rename(RunDir(tiny).snapshot(150))
    (tiny / "patch.png").write_bytes(b"the run's own picture")
    proc = check_ok(run_here("analyze.py", "patch", tiny, "--checkpoint=iter:150", "--clean=AB", "--corrupt=AC"))
    assert proc.stdout.startswith(f"wrote {tiny / 'patch-iter150.png'}\n")
    assert (tiny / "patch.png").read_bytes() == b"the run's own picture"


def test_the_ablation_colours_are_one_fixed_scale_whatever_the_values(monkeypatch, tmp_path):
    """Issue 65: the deltas' colour scale spanned each picture's own largest delta, so a snapshot's +0.033 was as
    red as the finished run's +1.057. One scale for every picture, stated in its colour bar: a delta has one colour
    whatever the others, and +0.033 is far from +1.057's."""
    from gptkit.interp import pictures

    drawn = []
    monkeypatch.setattr(pictures, "save", lambda fig, path, dpi: drawn.append(fig))
    scores = {"induction": [[0.1, 0.2]]}
    for largest in (0.033, 1.057):
        pictures.draw_heads([[largest, 0.033]], scores, "t", tmp_path / "h.png")
    colours = [[tuple(image.cmap(image.norm(v))) for v in (0.033, 1.057)]
               for image in (fig.axes[0].images[0] for fig in drawn)]
    assert colours[0] == colours[1]
    assert sum(abs(a - b) for a, b in zip(*colours[0])) > 0.5
    labels = [ax.get_ylabel() for ax in drawn[0].axes if ax.get_ylabel()]
    assert labels == ["nats; log scale past ±0.01, fixed"]
