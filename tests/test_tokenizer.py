"""Tokenizers (gptkit/data/tokenizer.py): streaming decoding holds back a character split across tokens until it is
whole, with a byte-level encoding and with GPT-2's BPE; a BPE with the chat markers has each as one token past its
own, and its metadata rebuilds it."""

import codecs
import random
import re

import numpy as np
import pytest

from conftest import R50K_BASE, SHARED_TIKTOKEN
from gptkit.base.errors import UserError
from gptkit.data.conversations import MARKERS, shown
from gptkit.data.tokenizer import TiktokenTokenizer, TrainedBPE, same_bpe, same_token_ids, tokenizer_from_meta

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


@pytest.mark.parametrize("trained_on", ["NFC", "NFD"])
def test_a_prompt_in_the_other_canonical_form_is_read_as_the_training_text_wrote_it(trained_on):
    """'café' as the training text wrote it (one 'é', or 'e' and a combining acute), prompted the other way:
    the same text by Unicode's definition, so the same tokens."""
    import unicodedata

    from gptkit.data.tokenizer import CharTokenizer

    corpus = unicodedata.normalize(trained_on, "un café, une crème ")
    tok = CharTokenizer(sorted(set(corpus)))
    other = "NFD" if trained_on == "NFC" else "NFC"
    prompt = unicodedata.normalize(other, "café crème")
    assert prompt != unicodedata.normalize(trained_on, prompt)
    assert tok.encode(prompt) == tok.encode(unicodedata.normalize(trained_on, prompt))


def test_a_compatibility_character_is_named_with_the_equivalent_the_vocabulary_holds():
    """'ﬁ' (a ligature) and 'Ａ' (full width) are other characters, equivalent only by compatibility: named, with
    what to write; a character with no equivalent held is named alone."""
    from gptkit.base.errors import UserError
    from gptkit.data.tokenizer import CharTokenizer

    tok = CharTokenizer(sorted(set("fine A day")))
    with pytest.raises(UserError) as caught:
        tok.encode("\ufb01ne \uff21 day@")
    assert str(caught.value) == ("the text has characters outside the training vocabulary: '@', '\ufb01' (the "
                                 "vocabulary has 'fi': write that), '\uff21' (the vocabulary has 'A': write that)")


# ------------------------------------------------------------------------------------------ a trained byte-level BPE

@pytest.fixture(scope="module")
def trained():
    from conftest import mixed_script_text
    from gptkit.data.bpe import train_bpe
    from gptkit.data.tokenizer import TrainedBPE

    return TrainedBPE(train_bpe([mixed_script_text(30000, seed=1)], 500))


def random_text(rng, n):
    """Any text: code points drawn from every plane Unicode assigns (surrogates aside, which no UTF-8 text holds),
    with combining marks, joiners, controls and the end-of-text token's spelling among them."""
    points = []
    while len(points) < n:
        c = rng.choice([rng.randrange(0x80), rng.randrange(0x80, 0x800), rng.randrange(0x800, 0xD800),
                        rng.randrange(0xE000, 0x10000), rng.randrange(0x10000, 0x110000), 0x200D, 0x301, 0])
        points.append(c)
    return "".join(map(chr, points)) + "<|endoftext|>"


def test_any_text_encodes_and_decodes_back_with_a_trained_bpe(trained):
    """It cannot fail on a character it never saw: every byte is a token."""
    rng = random.Random(0)
    for n in (1, 5, 50, 2000):
        text = random_text(rng, n)
        ids = trained.encode(text)
        assert trained.decode(ids) == text and all(0 <= i < trained.vocab_size for i in ids)
        assert "".join(stream_pieces(trained, ids)) == text
    assert [trained.enc.decode_single_token_bytes(b) for b in range(256)] == [bytes([b]) for b in range(256)]


def test_the_trained_tokenizer_is_checked_against_its_checksum(trained):
    meta = trained.to_meta()
    assert tokenizer_from_meta(meta).encode("Язык 🙂") == trained.encode("Язык 🙂")
    edited = dict(meta, bpe=dict(meta["bpe"], merges=meta["bpe"]["merges"][:-1]))
    with pytest.raises(UserError, match="^the checkpoint's tokenizer is damaged or was edited: it does not match"):
        tokenizer_from_meta(edited)
    broken = dict(meta, bpe=dict(meta["bpe"], merges=[[0, 400]]))  # a merge of a token not made yet
    with pytest.raises(UserError, match="^the checkpoint's tokenizer is damaged: it is not a byte-level BPE"):
        tokenizer_from_meta(broken)
    with pytest.raises(UserError, match="^the checkpoint's tokenizer is missing"):
        tokenizer_from_meta({k: v for k, v in meta.items() if k != "bpe"})


def test_labels_show_the_bytes_of_part_of_a_character(trained):
    from gptkit.interp.hooks import token_label

    assert trained.token_label(0xE4) == "⟨e4⟩" and token_label(trained, 32) == "␣"
    partial = [t for t in range(256, trained.vocab_size - 1) if "⟨" in trained.token_label(t)]
    assert partial  # the mixed-script text makes tokens that end inside a character
    for t in partial:  # read back, the label spells exactly the token's bytes
        parts = re.split(r"⟨([0-9a-f]{2})⟩", trained.token_label(t))
        spelled = b"".join(bytes.fromhex(p) if i % 2 else p.encode("utf-8") for i, p in enumerate(parts))
        assert spelled == trained.enc.decode_single_token_bytes(t)


@pytest.mark.parametrize("which", ["trained", "r50k"])
def test_char_counts_add_up_to_the_characters_a_text_spells(which, trained, request):
    from conftest import mixed_script_text

    if which == "r50k":
        request.getfixturevalue("tiktoken_cache")
    tok = trained if which == "trained" else tokenizer_from_meta({"tokenizer": "tiktoken", "encoding": "r50k_base"})
    text = mixed_script_text(5000, seed=7)
    counts = tok.char_counts()
    assert int(counts[tok.encode(text)].sum()) == len(text)
    assert counts[tok.eot_token] == 0


def test_prepare_options_name_the_tokenizer_a_dataset_or_checkpoint_was_made_with():
    from gptkit.data.tokenizer import prepare_options

    assert prepare_options({"tokenizer": "char", "vocab": "ab"}) == "--tokenizer=char"
    assert prepare_options({"tokenizer": "tiktoken", "encoding": "gpt2"}) == "--tokenizer=gpt2"
    assert prepare_options({"tokenizer": "bpe", "vocab_size": 512, "tokenizer_sha256": "0" * 64}) == \
        "--tokenizer=bpe --vocab_size=512"
    # a chat dataset's: the markers come with its conversations; --vocab_size is the BPE's own, without them
    chat = {"user": 512, "assistant": 513, "end": 514}
    assert prepare_options({"tokenizer": "bpe", "vocab_size": 515, "tokenizer_sha256": "0" * 64, "chat": chat}) == \
        "--tokenizer=bpe --vocab_size=512"
    assert prepare_options({"tokenizer": "tiktoken", "encoding": "gpt2", "chat": chat}) == "--tokenizer=gpt2"


# ------------------------------------------------------------------------------------------ the chat markers in a BPE

@pytest.fixture(params=["gpt2", "trained"])
def bpe_and_chat(request, trained):
    """(a BPE, the same with the chat markers): GPT-2's, and one trained here."""
    if request.param == "gpt2":
        request.getfixturevalue("tiktoken_cache")
        return TiktokenTokenizer("gpt2"), TiktokenTokenizer("gpt2", chat=True)
    return trained, TrainedBPE(trained.content, chat=True)


U, A, E = MARKERS.values()
CONVERSATION = f"{U}naïve 12+34? <|endoftext|> 漢字🙂{A} 46\n{E}{U}x{A}y{E}"


def test_each_chat_marker_is_one_token_past_the_bpes_own(bpe_and_chat):
    plain, chat = bpe_and_chat
    first = plain.vocab_size  # gpt2: 50257; trained: after its <|endoftext|>
    assert chat.chat == {"user": first, "assistant": first + 1, "end": first + 2} and chat.vocab_size == first + 3
    assert plain.chat is None and len(plain.encode(MARKERS["user"])) > 1  # without them: the character's bytes
    for name, char in MARKERS.items():
        assert chat.encode(char) == [chat.chat[name]]
        assert chat.decode([chat.chat[name]]) == char == chat.token_label(chat.chat[name])
    ids = chat.encode(CONVERSATION)
    assert chat.decode(ids) == CONVERSATION and "".join(stream_pieces(chat, ids)) == CONVERSATION
    assert shown(chat.decode(ids)) == "<|user|>naïve 12+34? <|endoftext|> 漢字🙂<|assistant|> 46\n<|end|>" \
                                      "<|user|>x<|assistant|>y<|end|>"
    assert [i for i in ids if i >= first] == [first, first + 1, first + 2] * 2  # <|endoftext|>'s text is text
    # between the markers, the text is cut and merged as the plain BPE does it on its own
    pieces = re.split("[\ue000-\ue002]", CONVERSATION)
    assert [i for i in ids if i < first] == [t for piece in pieces for t in plain.encode(piece)]
    assert chat.encode_array(CONVERSATION, np.uint32).tolist() == ids
    text = re.sub("[\ue000-\ue002]", "", random_text(random.Random(1), 500))  # no marker: the ids without them
    assert chat.encode(text) == plain.encode(text) and chat.encode_array(text, np.uint32).tolist() == plain.encode(text)


def test_the_metadata_names_the_markers_and_rebuilds_the_same_tokenizer(bpe_and_chat):
    plain, chat = bpe_and_chat
    meta = chat.to_meta()
    assert meta["chat"] == chat.chat and "chat" not in plain.to_meta()
    again = tokenizer_from_meta(meta)
    assert again.chat == chat.chat and again.encode(CONVERSATION) == chat.encode(CONVERSATION)
    assert tokenizer_from_meta(plain.to_meta()).chat is None
    # the markers give text other ids (the resume check refuses the one for the other), but the rest is one BPE
    assert same_token_ids(meta, again.to_meta()) and not same_token_ids(meta, plain.to_meta())
    assert same_bpe(meta, plain.to_meta()) and same_bpe(plain.to_meta(), meta)
    moved = dict(meta, chat={"user": 1, "assistant": 2, "end": 3})
    with pytest.raises(UserError, match="is damaged or was edited: it puts the chat markers at"):
        tokenizer_from_meta(moved)
