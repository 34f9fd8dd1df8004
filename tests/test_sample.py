"""sample.py: stop strings, texts generated row by row and streamed in whole characters, every sampling value its
parser accepts, and the command end to end (reproducible from the checkpoint alone, with or without the KV cache,
FILE: prompts, interactive mode), refusing a damaged checkpoint in one line."""

import dataclasses
import io
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import sample
from conftest import REPO, assert_one_error_line, check_ok, partial_tokens, run_here, run_script, tiny_model
from gptkit.base.errors import UserError
from gptkit.data.conversations import MARKERS
from gptkit.data.tokenizer import CharTokenizer
from gptkit.run.checkpoint import load_checkpoint
from gptkit.run.run_folder import load_model
from sample import SampleConfig, StopFilter, generate_texts
from test_analyze import saved_run
from test_checkpoints import damage
from test_tokenizer import EMOJI_TEXT, byte_level_tokenizer


@pytest.fixture(scope="module")
def run_dir(trained_run):
    return trained_run[0]


@pytest.fixture(scope="module")
def trained(run_dir):
    from gptkit.run.run_folder import load_model

    return load_model(run_dir, "cpu")


# ----------------------------------------------------------------------------- stop strings

@pytest.mark.parametrize("pieces, stop, expected", [
    (["ab", "\n", "\ncd"], "\n\n", "ab"),  # the stop string split across two pieces
    (["a\n", "b\n", "\n", "x"], "\n\n", "a\nb"),
    (["he", "llo wor", "ld"], "lo w", "hel"),
    (["\n", "\n"], "\n\n", ""),  # stop right at the start
    (["ab\n", "c"], "\n\n", "ab\nc"),  # a held-back partial match that never completes is released
    (["abc", "def"], "", "abcdef"),  # no stop string
    (["xEN", "D", "yEND"], "END", "x"),
])
def test_stop_filter(pieces, stop, expected):
    f = StopFilter(stop)
    out = "".join(f.feed(p) for p in pieces) + f.flush()
    assert out == expected


def test_stop_filter_holds_back_only_a_possible_beginning():
    f = StopFilter("\n\n")
    assert f.feed("ab\n") == "ab"  # '\n' might start the stop string
    assert f.feed("c") == "\nc"
    assert not f.done
    assert f.feed("\n\nmore") == "" and f.done
    assert f.feed("anything") == "" and f.flush() == ""


class ScriptedModel(torch.nn.Module):
    """Stands in for GPT in generate_texts: yields fixed tokens per row and counts the columns drawn
    (the scripted_decoding fixture routes generate_texts' decoding to it)."""

    def __init__(self, rows):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.rows, self.drawn = rows, 0

    def generate_stream(self, idx, max_new_tokens, **kwargs):
        assert idx.size(0) == len(self.rows)
        for i in range(min(max_new_tokens, max(len(r) for r in self.rows))):
            self.drawn += 1
            yield torch.tensor([[r[i] if i < len(r) else r[-1]] for r in self.rows])


@pytest.fixture
def scripted_decoding(monkeypatch):
    monkeypatch.setattr(sample, "generate_stream", lambda model, idx, n, **kw: model.generate_stream(idx, n, **kw))


def test_generate_texts_stops_rows_independently_and_streams_the_first(scripted_decoding):
    tok = CharTokenizer(sorted(set("abcdef\n:P")))
    rows = [tok.encode("ab\ncd\n\nef\n\nab"), tok.encode("a\n\nbcdef\nabcdef")]
    model = ScriptedModel(rows)
    stream = io.StringIO()
    cfg = SampleConfig(num_samples=2, max_new_tokens=100)
    texts = generate_texts(model, tok, "P:", cfg, "\n\n", stream)
    assert texts == ["P:ab\ncd", "P:a"]
    assert stream.getvalue() == "P:ab\ncd"
    assert model.drawn == 7  # generation ends once every row has met the stop string


def test_generate_texts_without_stop_returns_everything(scripted_decoding):
    tok = CharTokenizer(sorted(set("abc\n")))
    model = ScriptedModel([tok.encode("abc\n\nabc")])
    stream = io.StringIO()
    texts = generate_texts(model, tok, "a", SampleConfig(num_samples=1, max_new_tokens=6), "", stream)
    assert texts == ["aabc\n\na"] and stream.getvalue() == "aabc\n\na"


def test_stop_string_end_to_end_on_a_trained_model(trained):
    model, tok = trained
    cfg = SampleConfig(num_samples=3, max_new_tokens=80, seed=5, temperature=1.0)
    prompt = "ROMEO:\n"
    plain = generate_texts(model, tok, prompt, cfg, stream=io.StringIO())
    generated = plain[0][len(prompt):]
    stop = generated[30:32]  # two characters: with a char tokenizer the stop string spans two tokens
    assert len(stop) == 2
    stream = io.StringIO()
    stopped = generate_texts(model, tok, prompt, cfg, stop, stream)
    for full, cut in zip(plain, stopped):
        gen = full[len(prompt):]
        at = gen.find(stop)
        assert cut == prompt + (gen[:at] if at >= 0 else gen)
    assert stream.getvalue() == stopped[0]
    assert stop not in stopped[0][len(prompt):]


def test_bpe_streaming_through_generate_texts_never_prints_half_a_character(scripted_decoding):
    tok = byte_level_tokenizer()
    tok.encode = lambda text: list(text.encode("utf-8"))
    text = "caf" + EMOJI_TEXT + "\n\nend"
    model = ScriptedModel([list(text.encode("utf-8"))])

    class Recorder(io.StringIO):
        writes = []

        def write(self, s):
            self.writes.append(s)
            return super().write(s)

    stream = Recorder()
    cfg = SampleConfig(num_samples=1, max_new_tokens=100)
    texts = generate_texts(model, tok, "x", cfg, "\n\n", stream)
    assert texts == ["xcaf" + EMOJI_TEXT]
    assert all("\ufffd" not in w for w in stream.writes)
    assert "😀" in stream.writes  # streamed as soon as its last byte arrived


@pytest.mark.parametrize("setting,values", [
    ("temperature", [0.0, 5e-324, 1e-300, 1e-30, 1e300, 1.7e308]),
    ("top_k", [0, 1, 2 ** 62]),
    ("top_p", [5e-324, 1e-300, 1.0]),
    ("seed", [0, 2 ** 31 - 1]),
    ("max_new_tokens", [0, 1]),
    ("num_samples", [1, 3]),
])
def test_every_sampling_value_the_parser_accepts_samples(setting, values):
    """Each option at both ends of what SampleConfig accepts gives text (a vanishing temperature is greedy),
    never a traceback from torch's sampler."""
    model, tok = tiny_model(sharpen=40.0, vocab_size=29), CharTokenizer([chr(ord("a") + i) for i in range(29)])
    greedy = generate_texts(model, tok, "abc", SampleConfig(num_samples=1, max_new_tokens=12, temperature=0.0),
                            stream=io.StringIO())
    for value in values:
        cfg = SampleConfig(**{"num_samples": 1, "max_new_tokens": 12, setting: value})
        texts = generate_texts(model, tok, "abc", cfg, stream=io.StringIO())
        assert len(texts) == cfg.num_samples and all(len(t) == 3 + cfg.max_new_tokens for t in texts)
        if setting == "temperature" and value < 1e-20:
            assert texts == greedy, value


# ----------------------------------------------------------------------------- sample.py end to end

def sample_args(run_dir, *extra):
    return [f"--out_dir={run_dir}", "--device=cpu", "--dtype=float32", "--num_samples=2", "--max_new_tokens=70",
            "--start=ROMEO:", *extra]


def run_sample_main(capsys, *args):
    """sample.py's main() in this process (no interpreter start-up); returns what it printed."""
    capsys.readouterr()
    sample.main(list(args))
    return capsys.readouterr().out


def test_sample_is_reproducible_and_needs_only_the_checkpoint(trained_run, tmp_path):
    """Run from another folder: the tokenizer must come from best.pt, not from the dataset."""
    out, _ = trained_run
    args = [f"--out_dir={out}", "--num_samples=2", "--max_new_tokens=20", "--seed=7", "--device=cpu", "--dtype=float32"]
    first, second = (check_ok(run_script("sample.py", *args, cwd=tmp_path)) for _ in range(2))
    assert first.stdout == second.stdout
    assert first.stdout.count("---------------") == 2  # the separator after each of the other samples
    vocab = set(load_checkpoint(out / "best.pt")["tokenizer"]["vocab"])
    assert set(first.stdout) - {"-"} <= vocab | {"\n"}
    assert len(first.stdout) > 40


def test_cache_and_no_cache_print_identical_text(run_dir, capsys):
    """70 new tokens with block_size 32: the window slides twice."""
    with_cache = run_sample_main(capsys, *sample_args(run_dir))
    without = run_sample_main(capsys, *sample_args(run_dir, "--kv_cache=False"))
    assert with_cache == without
    assert with_cache.startswith("ROMEO:") and with_cache.count("---------------") == 2


def test_prompt_from_file_and_escaped_stop(run_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("JULIET:\n", encoding="utf-8")
    # typed in a shell, --stop="\n" arrives as a backslash and an n: sample.py reads it as a newline
    out = run_sample_main(capsys, *sample_args(run_dir, f"--start=FILE:{prompt}", "--stop=\\n",
                                               "--num_samples=1", "--max_new_tokens=300", "--temperature=1.0"))
    assert out.startswith("JULIET:\n")
    generated = out.split("\n---------------")[0][len("JULIET:\n"):]
    assert "\n" not in generated


def test_a_bpe_checkpoint_alone_samples_the_text_of_the_tokens_the_model_picks(bpe_data, tmp_path, capsys):
    """A run cut into a trained byte-level BPE samples from its checkpoint alone (the merges travel in it; no
    dataset beside it), its prompt, characters cut between tokens and all, printed as typed; greedy, the text is the
    tokenizer's decoding of the tokens the model picks, found here by a plain loop: argmax over the whole text."""
    tok = bpe_data[2]
    run = saved_run(tmp_path / "bpe", tok=tok, sharpen=40.0, block_size=64)  # the window never slides here
    prompt = "🎶 狐狸"
    assert partial_tokens(tok, tok.encode(prompt))
    out = run_sample_main(capsys, f"--out_dir={run}", "--device=cpu", "--dtype=float32", "--num_samples=1",
                          "--max_new_tokens=20", "--temperature=0", f"--start={prompt}")
    text = out.split("\n---------------")[0]
    model, loaded = load_model(run, "cpu")
    assert loaded.to_meta() == tok.to_meta()
    ids = tok.encode(prompt)
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    expected = tok.decode(ids)  # a character cut at the very end: U+FFFD here, held back by the stream
    assert text.startswith(prompt) and text in (expected, expected.removesuffix("\ufffd"))


@pytest.mark.parametrize("stop", ["", "<|end|>"])
def test_a_chat_models_markers_are_typed_and_printed_by_their_names(chat_run, monkeypatch, stop):
    """A chat run's markers are private characters no keyboard has: --start and --stop take their names, and the
    text prints them by name."""
    _, tok = load_model(chat_run, "cpu")
    drawn = tok.encode("2" + MARKERS["end"] + "1+")

    def scripted(model, idx, n, **kwargs):
        assert idx[0].tolist() == tok.encode(MARKERS["user"] + "1+1" + MARKERS["assistant"])
        yield from (torch.tensor([[token]] * idx.size(0)) for token in drawn[:n])

    monkeypatch.setattr("gptkit.sampling.decoding.generate_stream", scripted)  # the script imports it afresh
    proc = check_ok(run_here("sample.py", f"--out_dir={chat_run}", "--start=<|user|>1+1<|assistant|>",
                             f"--stop={stop}", "--num_samples=2", "--max_new_tokens=5"))
    answer = "2" if stop else "2<|end|>1+"
    assert proc.stdout == f"<|user|>1+1<|assistant|>{answer}\n---------------\n<|user|>1+1<|assistant|>{answer}\n" \
                          "---------------\n"


def run_interactive(run_dir, stdin_text, *extra):
    """sample.py --interactive as a real process, its stdin a pipe: what a user types, then EOF (Ctrl-D)."""
    args = [sys.executable, str(REPO / "sample.py"), *sample_args(run_dir, "--interactive", *extra)]
    return subprocess.run(args, cwd=REPO, input=stdin_text, capture_output=True, text=True, timeout=120,
                          encoding="utf-8")


def test_interactive_mode_reads_prompts_until_eof(run_dir):
    """A prompt, a prompt the vocabulary cannot encode (reported, session goes on), another, then Ctrl-D."""
    proc = run_interactive(run_dir, "ROMEO\n\u4e2d\u6587\nJULIET\n", "--num_samples=1", "--max_new_tokens=30")
    check_ok(proc)
    assert "prompt> ROMEO" in proc.stdout and "prompt> JULIET" in proc.stdout
    assert proc.stdout.count("prompt> ") == 4  # asked again after each, then EOF ends the session
    assert "outside the training vocabulary" in proc.stderr


def test_interactive_mode_asks_again_after_a_line_that_is_not_utf8(run_dir):
    """Bytes of another encoding (a terminal set to Latin-1) are a bad prompt, not the session's end."""
    args = [sys.executable, str(REPO / "sample.py"), *sample_args(run_dir, "--interactive", "--num_samples=1",
                                                                   "--max_new_tokens=10")]
    proc = subprocess.run(args, cwd=REPO, input=b"caf\xe9\nROMEO\n", capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().count("prompt> ") == 3 and "prompt> ROMEO" in proc.stdout.decode()
    assert "error: the prompt is not UTF-8 text: byte 0xe9 at offset 3; give UTF-8 text" in proc.stderr.decode()


def test_interactive_mode_one_prompt_then_ctrl_d(run_dir):
    proc = run_interactive(run_dir, "ROMEO\n", "--num_samples=2", "--max_new_tokens=20")
    check_ok(proc)
    out = proc.stdout
    assert out.startswith("\nprompt> ROMEO") and out.count("prompt> ") == 2
    assert out.count("\nROMEO") == 1 and out.count("---------------") == 2  # streamed sample, then the other


@pytest.mark.parametrize("case", ["vocabulary not a string", "model_args not a dict", "a weight not a tensor",
                                  "a model setting of another type", "tokenizer unknown"])
def test_sample_refuses_a_damaged_field_in_one_line(run, case):
    """The first case as a user runs it, the others in this process."""
    path = run / "best.pt"
    problem = damage(path, case)
    sample_py = run_script if case == "vocabulary not a string" else run_here
    proc = sample_py("sample.py", f"--out_dir={run}", "--device=cpu", "--num_samples=1", "--max_new_tokens=5")
    assert proc.returncode == 1
    # the run's latest.pt is whole: the line says how to read it instead
    assert_one_error_line(proc.stderr, f"error: {path} is damaged: {problem}; the run's latest state may still load: "
                                       "--checkpoint=latest")


def test_a_mask_taken_out_by_hand_is_warned_of_as_an_encoders_is(tmp_path, monkeypatch, capsys):
    """The notes' encoder: "just delete the single line that does masking". Its settings still say causal, and
    sample.py warned only where they did not; now a model whose positions see the tokens after them is warned of
    whatever its settings say, and a decoder is not."""
    import model as model_py

    run = saved_run(tmp_path / "run")
    args = [f"--out_dir={run}", "--device=cpu", "--dtype=float32", "--num_samples=1", "--max_new_tokens=3"]
    sample.main(args)
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(model_py.SelfAttention, "sdpa", lambda self, q, k, v: F.scaled_dot_product_attention(q, k, v))
    sample.main(args)
    assert "warning: model.py's attention lets each position see the tokens after it, though this model's settings " \
        "say causal=True (an edit took out or changed the mask), so it learned to read the next token from its " \
        "input; generating, it has no next token to read, and its text is garbage\n" in capsys.readouterr().err


def test_the_page_s_options_table_is_sample_py_s_options():
    """docs/sampling.md's table: a row for every option --help lists (out_dir aside, in every command there), and
    the checkpoint row names every checkpoint the option opens."""
    lines = (REPO / "docs" / "sampling.md").read_text(encoding="utf-8").splitlines()
    rows = {line.split("`")[1].removeprefix("--"): line for line in lines if line.startswith("| `--")}
    assert set(rows) == {f.name for f in dataclasses.fields(sample.SampleConfig)} - {"out_dir"}
    assert all(f"`{which}`" in rows["checkpoint"] for which in ("best", "latest", "iter:N"))


@pytest.mark.parametrize("args,said", [(["--start="], "the prompt is empty: pass some text with --start"),
                                       (["--dtype=float16"], "dtype float16 is not supported on CPU")])
def test_a_prompt_or_precision_it_cannot_use_is_its_one_line_before_any_measuring(tmp_path, monkeypatch, args, said):
    """Measuring the threads prints a line of its own ('decoding on 1 thread ...'), which came before these."""
    run = saved_run(tmp_path / "run")
    monkeypatch.setattr(sample, "pick_decode_threads", lambda *a: pytest.fail("measured before the error"))
    with pytest.raises(UserError, match=said):
        sample.main([f"--out_dir={run}", "--device=cpu", *args])


@pytest.mark.slow
def test_a_model_py_with_its_attention_matrix_and_head_renamed_trains_and_samples(data_dir, tmp_path):
    """sed 's/self.c_attn/self.qkv/g; s/lm_head/out_head/g' model.py: the run stopped before its first step (the
    check of an edited __init__ read c_attn) and sample.py refused it (the KV cache read lm_head's precision)."""
    import shutil

    from conftest import train_args

    tree = tmp_path / "project"
    shutil.copytree(REPO / "gptkit", tree / "gptkit", ignore=shutil.ignore_patterns("__pycache__"))
    for script in ("train.py", "sample.py"):
        shutil.copy(REPO / script, tree)
    source = (REPO / "model.py").read_text(encoding="utf-8")
    (tree / "model.py").write_text(source.replace("self.c_attn", "self.qkv").replace("lm_head", "out_head"),
                                   encoding="utf-8")
    out = tmp_path / "out"
    check_ok(run_script(tree / "train.py", *train_args(data_dir, out, "--max_iters=10", "--eval_interval=5",
                                                      "--eval_iters=1")))
    proc = check_ok(run_script(tree / "sample.py", f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=8"))
    assert "error" not in proc.stderr
