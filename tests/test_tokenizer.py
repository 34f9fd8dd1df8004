"""Tokenizers (gptkit/tokenizer.py): streaming decoding holds back a character split across tokens until it is whole,
with a byte-level encoding and with GPT-2's BPE."""

import codecs

import pytest

from conftest import R50K_BASE, SHARED_TIKTOKEN
from gptkit.tokenizer import TiktokenTokenizer, tokenizer_from_meta


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


def test_r50k_streaming_of_characters_split_across_tokens(tiktoken_cache):
    r50k = tokenizer_from_meta({"tokenizer": "tiktoken", "encoding": "r50k_base"})
    split = "naïve café — " + EMOJI_TEXT + " 😀😀 done"
    for text in (split, "naïve — café 漢字"):
        tokens = r50k.encode(text)
        pieces = stream_pieces(r50k, tokens)
        assert "".join(pieces) == text
        assert all("\ufffd" not in p for p in pieces)
    # the test means something only if some character really is split between tokens
    whole = [r50k.enc.decode_single_token_bytes(t) for t in r50k.encode(split)]
    assert any(not _is_utf8(b) for b in whole)


def _is_utf8(data):
    try:
        codecs.decode(data, "utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_the_tests_take_the_tiktoken_cache_the_user_points_to(monkeypatch, tmp_path, request):
    """A TIKTOKEN_CACHE_DIR the user set is where the BPE tests look first (conftest's tiktoken_cache), so that a
    fresh clone away from the shared cache still runs them."""
    shared = SHARED_TIKTOKEN / R50K_BASE
    if not shared.is_file():
        pytest.skip(f"no r50k_base at {SHARED_TIKTOKEN} to copy into the user's cache")
    (tmp_path / R50K_BASE).write_bytes(shared.read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert request.getfixturevalue("tiktoken_cache") == {"TIKTOKEN_CACHE_DIR": str(tmp_path)}
