"""Sampling: KV cache against full recompute (also past block_size), stop strings, top-p, streaming
of multi-byte characters, and sample.py end to end (CLI, FILE: prompts, interactive mode)."""

import codecs
import io
import subprocess
import sys

import pytest
import torch

import sample
from conftest import REPO, SHARED_TIKTOKEN, assert_one_error_line, check_ok, run_script
from gptkit import decoding, timing
from gptkit.decoding import lay_out_for_decoding, sample_next
from gptkit.errors import UserError
from gptkit.prompts import read_prompt, unescape
from gptkit.tokenizer import CharTokenizer, TiktokenTokenizer
from model import GPT, GPTConfig
from sample import SampleConfig, StopFilter, generate_texts


@pytest.fixture(scope="module")
def run_dir(trained_run):
    return trained_run[0]


@pytest.fixture(scope="module")
def trained(run_dir):
    from gptkit.rundir import load_model

    return load_model(run_dir, "cpu")


def tiny_model(pos_emb="learned", block_size=16, seed=0, sharpen=8.0):
    """A random GPT in eval mode; sharpen scales the head so sampling is far from uniform."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=29, n_layer=2, n_head=2, n_embd=32,
                          pos_emb=pos_emb, dropout=0.0)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def prompt_tokens(length, batch=1, seed=3):
    return torch.randint(29, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, idx, n, kv_cache, seed=7, **kwargs):
    return decoding.generate(model, idx, n, kv_cache=kv_cache, generator=torch.Generator().manual_seed(seed), **kwargs)


def recorded_logits(model, idx, n, kv_cache, seed=7, **kwargs):
    """The tokens and the logits of every step, as decode_steps samples them (generate's seed by default)."""
    steps = list(decoding.decode_steps(model, idx, n, kv_cache=kv_cache, generator=torch.Generator().manual_seed(seed),
                                       **kwargs))
    return torch.cat([idx] + [token for token, _, _ in steps], dim=1), torch.stack([logits for _, logits, _ in steps])


# ----------------------------------------------------------------------------- KV cache vs full recompute


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0),
                                      dict(temperature=0.8, top_k=10, top_p=0.9)],
                         ids=["greedy", "seeded", "topk_topp"])
def test_cache_matches_full_recompute_past_block_size(pos_emb, sampling):
    """3.5 blocks of new tokens: the window slides several times; every step's logits and token agree."""
    model = tiny_model(pos_emb)
    idx = prompt_tokens(5, batch=3)
    cached, logits_cached = recorded_logits(model, idx, 56, True, **sampling)
    full, logits_full = recorded_logits(model, idx, 56, False, **sampling)
    assert cached.shape == (3, 5 + 56)
    torch.testing.assert_close(logits_cached, logits_full, rtol=1e-4, atol=1e-4)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_prompt_longer_than_block_size(pos_emb):
    model = tiny_model(pos_emb)
    idx = prompt_tokens(40)  # 2.5 blocks: only the last block is seen
    a, b = generate(model, idx, 20, True, temperature=0.0), generate(model, idx, 20, False, temperature=0.0)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :40], idx)
    # the continuation depends only on the last block of the prompt
    c = generate(model, idx[:, -16:], 20, True, temperature=0.0)
    assert torch.equal(a[:, 40:], c[:, 16:])


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
@pytest.mark.parametrize("kv_cache", [True, False])
def test_window_slides_by_half_a_block(pos_emb, kv_cache):
    """Every forward stays inside block_size; once full, the context restarts from the last half block."""
    model = tiny_model(pos_emb)
    calls = []  # (cache position before the call, tokens fed)

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        calls.append((cache.pos if cache is not None else 0, args[0].size(1)))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        generate(model, prompt_tokens(3), 40, kv_cache, temperature=0.0)
    finally:
        handle.remove()
    assert len(calls) == 40
    assert all(start + fed <= 16 for start, fed in calls)
    contexts = [start + fed for start, fed in calls]  # tokens the model saw at each step
    # 3 prompt tokens grow to a full block, then slide to 8 and grow again
    assert contexts[:14] == list(range(3, 17))
    assert contexts[14:23] == list(range(8, 17))
    assert contexts[23:32] == list(range(8, 17))
    if kv_cache:  # re-prefilled exactly at the slides, one token per step otherwise
        assert [fed for _, fed in calls if fed > 1] == [3, 8, 8, 8]


@pytest.mark.parametrize("kv_cache", [True, False])
def test_decoding_holds_only_the_window_however_many_tokens(monkeypatch, kv_cache):
    """The tokens before the window are dropped: a huge --max_new_tokens streams in bounded memory, each step as
    fast as the first (it grew a tensor of every token so far and copied it at each step)."""
    widths, cat = [], torch.cat

    def spy(tensors, dim=0, **kwargs):
        if dim == 1 and tensors[0].dtype == torch.long:  # the running context, with the new token
            widths.append(tensors[0].size(1))
        return cat(tensors, dim=dim, **kwargs)

    monkeypatch.setattr(torch, "cat", spy)
    steps = decoding.generate_stream(tiny_model(), prompt_tokens(40), 200, kv_cache=kv_cache, temperature=0.0)
    assert sum(1 for _ in steps) == 200
    assert len(widths) == 200 and max(widths) <= 16


def test_same_seed_same_text_and_batch_rows_differ():
    model = tiny_model(sharpen=1.0)
    idx = prompt_tokens(4, batch=4)
    a, b = generate(model, idx, 30, True, seed=11), generate(model, idx, 30, True, seed=11)
    assert torch.equal(a, b)
    assert len({tuple(row[4:].tolist()) for row in a}) > 1  # one batch, independent samples
    assert not torch.equal(a, generate(model, idx, 30, True, seed=12))


# ----------------------------------------------------------------------------- sampling controls


def test_top_p_one_is_plain_sampling():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    for temperature in (1.0, 0.7):
        got = sample_next(logits, temperature=temperature, top_p=1.0, generator=torch.Generator().manual_seed(4))
        plain = torch.multinomial((logits / temperature).softmax(-1), 1, generator=torch.Generator().manual_seed(4))
        assert torch.equal(got, plain)


def test_tiny_top_p_is_greedy():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(1))
    greedy = sample_next(logits, temperature=0.0)
    assert torch.equal(greedy, logits.argmax(-1, keepdim=True))
    for seed in range(5):
        got = sample_next(logits, temperature=1.5, top_p=1e-9, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got, greedy)


def test_top_p_keeps_the_smallest_covering_set():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.7 keeps the first two, top_p=0.8 still two, 0.81 three
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for top_p, allowed in ((0.5, {0}), (0.7, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2})):
        g = torch.Generator().manual_seed(0)
        drawn = {sample_next(logits, top_p=top_p, generator=g).item() for _ in range(300)}
        assert drawn == allowed, top_p


def test_top_k_and_temperature_zero():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    assert {sample_next(logits, temperature=5.0, top_k=2, generator=g).item() for _ in range(200)} == {1, 2}
    assert sample_next(logits, temperature=0.0, top_k=2).item() == 1


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


# ----------------------------------------------------------------------------- BPE streaming

EMOJI_TEXT = "é—😀"


class ByteEncoding:
    """A fake tiktoken encoding with one token per byte: every multi-byte character is split."""

    def decode_single_token_bytes(self, token):
        return bytes([token])


def byte_level_tokenizer():
    tok = object.__new__(TiktokenTokenizer)
    tok.enc, tok.name, tok.vocab_size = ByteEncoding(), "bytes", 256
    return tok


def stream_pieces(tok, tokens):
    decode = tok.stream_decoder()
    return [decode(t) for t in tokens]


def test_stream_decoder_holds_back_partial_utf8_characters():
    tok = byte_level_tokenizer()
    tokens = list(EMOJI_TEXT.encode("utf-8"))  # 2 + 3 + 4 bytes
    pieces = stream_pieces(tok, tokens)
    assert "".join(pieces) == EMOJI_TEXT
    assert "\ufffd" not in "".join(pieces)
    assert pieces == ["", "é", "", "", "—", "", "", "", "😀"]  # each character appears once complete


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


@pytest.fixture
def r50k(monkeypatch):
    if not (SHARED_TIKTOKEN / "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4").exists():
        pytest.skip(f"no cached r50k_base tiktoken files at {SHARED_TIKTOKEN} (offline: cannot download them)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))
    return TiktokenTokenizer("r50k_base")


def test_r50k_streaming_of_characters_split_across_tokens(r50k):
    text = "naïve café — " + EMOJI_TEXT + " 😀😀 done"
    tokens = r50k.encode(text)
    pieces = stream_pieces(r50k, tokens)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # the test means something only if some character really is split between tokens
    whole = [r50k.enc.decode_single_token_bytes(t) for t in tokens]
    assert any(not _is_utf8(b) for b in whole)


def _is_utf8(data):
    try:
        codecs.decode(data, "utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ----------------------------------------------------------------------------- sample.py end to end


def sample_args(run_dir, *extra):
    return [f"--out_dir={run_dir}", "--device=cpu", "--dtype=float32", "--num_samples=2", "--max_new_tokens=70",
            "--start=ROMEO:", *extra]


def run_sample_main(capsys, *args):
    """sample.py's main() in this process (no interpreter start-up); returns what it printed."""
    import sample

    capsys.readouterr()
    sample.main(list(args))
    return capsys.readouterr().out


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


def test_unescape_of_command_line_text(tmp_path):
    assert unescape("\\n\\n") == "\n\n" and read_prompt("A\\tB\\\\n") == "A\tB\\n"
    assert unescape("caf\u00e9 \\x") == "caf\u00e9 \\x"  # other text and unknown escapes unchanged
    prompt = tmp_path / "new"
    prompt.write_text("a \\n stays two characters", encoding="utf-8")
    assert read_prompt(f"FILE:{prompt}") == "a \\n stays two characters"  # a file's text is taken as it is


def test_errors_are_one_line(run_dir, tmp_path):
    missing = run_script("sample.py", f"--out_dir={tmp_path}", "--device=cpu")
    assert missing.returncode == 1
    assert_one_error_line(missing.stderr, "error: no checkpoint*")
    with pytest.raises(UserError, match="could not read prompt file"):
        read_prompt(f"FILE:{tmp_path / 'nope.txt'}")
    with pytest.raises(UserError, match="outside the training vocabulary"):
        import sample

        sample.main(sample_args(run_dir, "--start=\u4e2d"))


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


def test_interactive_mode_one_prompt_then_ctrl_d(run_dir):
    proc = run_interactive(run_dir, "ROMEO\n", "--num_samples=2", "--max_new_tokens=20")
    check_ok(proc)
    out = proc.stdout
    assert out.startswith("\nprompt> ROMEO") and out.count("prompt> ") == 2
    assert out.count("\nROMEO") == 1 and out.count("---------------") == 2  # streamed sample, then the other


# ----------------------------------------------------------------------------- bench.py sample


def test_bench_sample_reports_both_rates_and_the_speedup(capsys):
    import bench

    bench.main(["sample", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--max_new_tokens=40",
                "--warmup_tokens=2", "--pos_emb=rope", "--dtype=float32"])
    out = capsys.readouterr().out
    assert "with KV cache (float32):" in out and "without cache (float32):" in out and "tokens/s" in out
    assert "speedup: " in out and "same tokens: yes" in out
    with pytest.raises(UserError, match="unknown benchmark"):
        bench.main(["nope"])
    with pytest.raises(UserError, match="modes must be"):
        bench.main(["sample", "--modes=fast"])


@pytest.mark.parametrize("bf16_speedup,want", [(2.0, "bfloat16"), (1.1, "float32"), (0.5, "float32")])
def test_decode_precision_is_measured_and_must_win_clearly(monkeypatch, bf16_speedup, want):
    monkeypatch.setattr(timing, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(timing, "decode_seconds", lambda model, batch, tokens: {
        torch.float32: 1.0, torch.bfloat16: 1.0 / bf16_speedup}[next(model.parameters()).dtype])
    dtype, why = timing.pick_decode_dtype("auto", tiny_model(), "cpu")
    assert dtype == want and why == f"decoding in {want} (bfloat16 was {bf16_speedup:.2f}x as fast as float32 on this model)"
    assert timing.pick_decode_dtype("float32", tiny_model(), "cpu")[0] == "float32"


@pytest.mark.parametrize("two_thread_speedup,want", [(1.8, 2), (1.1, 1), (0.2, 1)])
def test_decode_threads_are_measured_and_more_must_win_clearly(monkeypatch, two_thread_speedup, want):
    """On a busy machine a second thread stalls every step, so it is taken only when a probe shows it
    clearly faster; the count chosen is the one left set."""
    before = torch.get_num_threads()
    monkeypatch.setattr(timing, "decode_seconds", lambda model, batch, tokens: 1.0 / (
        two_thread_speedup if torch.get_num_threads() == 2 else 1.0))
    try:
        torch.set_num_threads(2)
        threads, why = timing.pick_decode_threads(0, tiny_model(), "cpu")
        assert threads == want == torch.get_num_threads()
        assert why.endswith(f" (2 threads were {two_thread_speedup:.2f}x as fast as 1 on this model)")
        assert timing.pick_decode_threads(3, tiny_model(), "cpu")[0] == 3 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_decoding_layout_keeps_values_ties_and_tokens():
    model = tiny_model()
    assert model.transformer.wte.weight is model.lm_head.weight  # tied, as GPT-2's head
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = prompt_tokens(4)
    want = generate(model, idx, 20, True, temperature=0.0)
    lay_out_for_decoding(model)
    assert model.lm_head.weight.t().is_contiguous()  # the layout did change
    assert model.transformer.wte.weight is model.lm_head.weight
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert torch.equal(generate(model, idx, 20, True, temperature=0.0), want)


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
    model, tok = tiny_model(sharpen=40.0), CharTokenizer([chr(ord("a") + i) for i in range(29)])
    greedy = generate_texts(model, tok, "abc", SampleConfig(num_samples=1, max_new_tokens=12, temperature=0.0),
                            stream=io.StringIO())
    for value in values:
        cfg = SampleConfig(**{"num_samples": 1, "max_new_tokens": 12, setting: value})
        texts = generate_texts(model, tok, "abc", cfg, stream=io.StringIO())
        assert len(texts) == cfg.num_samples and all(len(t) == 3 + cfg.max_new_tokens for t in texts)
        if setting == "temperature" and value < 1e-20:
            assert texts == greedy, value
