"""Conversations as tokens: the chat template, the roles that tell the loss what to count (char-level and with a
BPE, whose markers are tokens of their own), and conversation files' bad lines, each one line naming its number."""

import json

import pytest

from conftest import BPE_VOCAB, mixed_script_text
from gptkit.base.errors import UserError
from gptkit.data.conversations import (ANSWER, MARKERS, PROMPT, is_conversation_file, read_conversations, render,
                                       shown, typed)
from gptkit.data.tokenizer import CharTokenizer, TiktokenTokenizer, TrainedBPE

TOK = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz0123456789+: ?") | set(MARKERS.values())))
MESSAGES = [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"},
            {"role": "user", "content": "why?"}, {"role": "assistant", "content": "sums"}]
SHOWN = "<|user|>1+2<|assistant|>3<|end|><|user|>why?<|assistant|>sums<|end|>"


def test_the_mask_covers_exactly_the_assistants_tokens_and_the_end_marker():
    ids, roles = render(MESSAGES, TOK)
    u, a, e = MARKERS["user"], MARKERS["assistant"], MARKERS["end"]
    # by hand: each character of the conversation, and whether the loss counts it
    expected = [(u, 0), ("1", 0), ("+", 0), ("2", 0), (a, 0), ("3", 1), (e, 1),
                (u, 0), ("w", 0), ("h", 0), ("y", 0), ("?", 0), (a, 0), ("s", 1), ("u", 1), ("m", 1), ("s", 1), (e, 1)]
    assert ids == [TOK.stoi[c] for c, _ in expected]
    assert roles == [ANSWER if counted else PROMPT for _, counted in expected]
    assert shown(TOK.decode(ids)) == SHOWN


@pytest.fixture(params=["gpt2", "trained"])
def bpe(request):
    """A BPE with the chat markers: GPT-2's, and one trained here."""
    if request.param == "gpt2":
        request.getfixturevalue("tiktoken_cache")
        return TiktokenTokenizer("gpt2", chat=True)
    from gptkit.data.bpe import train_bpe

    return TrainedBPE(train_bpe([mixed_script_text()], BPE_VOCAB), chat=True)


def test_with_a_bpe_the_mask_covers_exactly_the_assistants_tokens_and_the_end_marker(bpe):
    ids, roles = render(MESSAGES, bpe)
    u, a, e = (bpe.chat[name] for name in MARKERS)
    # by hand: each piece of the conversation (a marker's one token, the text's tokens), and whether the loss
    # counts it
    expected = [([u], 0), (bpe.encode("1+2"), 0), ([a], 0), (bpe.encode("3"), 1), ([e], 1),
                ([u], 0), (bpe.encode("why?"), 0), ([a], 0), (bpe.encode("sums"), 1), ([e], 1)]
    assert ids == [t for piece, _ in expected for t in piece]
    assert roles == [ANSWER if counted else PROMPT for piece, counted in expected for _ in piece]
    assert shown(bpe.decode([t for t, role in zip(ids, roles) if role == ANSWER])) == "3<|end|>sums<|end|>"
    assert shown(bpe.decode(ids)) == SHOWN


def test_a_chat_models_markers_are_typed_by_their_names_and_other_models_text_as_it_is(bpe):
    """What a person types, <|user|>1+2<|assistant|>, is the conversation render writes, for a chat model char-level
    or BPE; for a model without the markers those names are ordinary text."""
    for tok in (TOK, bpe):
        assert tok.encode(typed(tok, SHOWN)) == render(MESSAGES, tok)[0]
    plain = TiktokenTokenizer("gpt2") if bpe.name == "gpt2" else CharTokenizer(sorted(set(SHOWN)))
    assert plain.chat is None and typed(plain, SHOWN) == SHOWN


def write_lines(path, lines):
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode("utf-8") for line in lines))
    return path


GOOD = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})


@pytest.mark.parametrize("bad, expected", [
    ("{not json", "line 3 is not JSON"),
    (b"\xff\xfe", "line 3 is not UTF-8 text"),
    pytest.param("[" * 100_000 + "]" * 100_000, "line 3 is nested too deeply to be a conversation", id="nested"),
    (json.dumps({"messages": [{"role": "tool", "content": "x"}]}), "line 3: message 1 has role 'tool'"),
    (json.dumps({"messages": [{"role": "system", "content": "x"}]}),
     "line 3: message 1 is the system's, which must be text and have a user's message after it"),
    (json.dumps({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "q"},
                              {"role": "user", "content": "q"}]}), "line 3: message 3 is the user's, but turns"),
    (json.dumps({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a"}]}),
     "line 3: message 1 (user) is empty"),
    (json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " \r\n"}]}),
     "line 3: message 2 (assistant) is empty but for whitespace"),
    (json.dumps({"messages": [{"role": "user", "content": 12}, {"role": "assistant", "content": "a"}]}),
     "line 3: message 1 (user)'s content is 12, not a string"),
    (json.dumps({"messages": [{"role": "user", "content": "q"}]}), "line 3: the conversation has no assistant turn"),
    (json.dumps({"messages": [{"role": "assistant", "content": "a"}]}), "line 3: message 1 is the assistant's"),
    (json.dumps({"text": "plain"}), "line 3: expected {\"messages\""),
    ('{"messages": [{"role": "user", "content": "x\\ud800"}, {"role": "assistant", "content": "3"}]}',
     "line 3: message 1 holds '\\ud800', half of a surrogate pair, which is no character"),
])
def test_a_bad_line_is_one_error_naming_its_number(tmp_path, bad, expected):
    path = write_lines(tmp_path / "chats.jsonl", [GOOD, "", bad, GOOD])
    with pytest.raises(UserError) as e:
        read_conversations(path)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_skip_bad_leaves_every_bad_line_out_and_names_it(tmp_path):
    """prepare's --skip_bad, which a chat file once ignored: each kind of bad line left out, its number kept."""
    path = write_lines(tmp_path / "chats.jsonl", [GOOD, "not json", b"\xff", "", json.dumps({"text": "plain"}), GOOD])
    skipped = []
    assert read_conversations(path, skipped) == read_conversations(write_lines(tmp_path / "g.jsonl", [GOOD, GOOD]))
    assert skipped == [2, 3, 5]
    with pytest.raises(UserError, match=r"holds no conversations \(2 bad lines skipped\)$"):
        read_conversations(write_lines(tmp_path / "bad.jsonl", ["x", "y"]), [])


def test_a_first_line_nested_too_deeply_to_read_is_one_error_naming_it(tmp_path):
    path = write_lines(tmp_path / "chats.jsonl", ["", "[" * 100_000 + "]" * 100_000])
    with pytest.raises(UserError, match="line 2 is nested too deeply to be a record of text or a conversation"):
        is_conversation_file(path)


def test_a_first_system_message_is_merged_into_the_users_after_it_as_nanochat_renders_it(tmp_path):
    system = json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "yo"}]})
    assert read_conversations(write_lines(tmp_path / "s.jsonl", [system])) == [
        [{"role": "user", "content": "Be brief.\n\nhi"}, {"role": "assistant", "content": "yo"}]]


def test_a_file_that_starts_with_utf_8s_byte_order_mark_reads_as_without_it(tmp_path):
    path = write_lines(tmp_path / "bom.jsonl", [b"\xef\xbb\xbf" + GOOD.encode(), GOOD])
    assert is_conversation_file(path)
    assert read_conversations(path) == read_conversations(write_lines(tmp_path / "plain.jsonl", [GOOD, GOOD]))


def test_a_conversation_file_is_told_from_records_of_text(tmp_path):
    assert is_conversation_file(write_lines(tmp_path / "a.jsonl", ["", GOOD]))
    assert not is_conversation_file(write_lines(tmp_path / "b.jsonl", [json.dumps({"text": "hi"})]))
    assert not is_conversation_file(write_lines(tmp_path / "c.txt", [GOOD]))
    assert len(read_conversations(tmp_path / "a.jsonl")) == 1


def test_a_conversation_file_named_in_capitals_is_one_and_a_compressed_one_is_one_line(tmp_path):
    """A.JSONL holds conversations as a.jsonl does; compressed, read as records of text it named none (every line
    skipped), so it is one line saying to decompress it."""
    import gzip
    assert is_conversation_file(write_lines(tmp_path / "A.JSONL", [GOOD]))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(GOOD + "\n")
    with pytest.raises(UserError, match=r"a.jsonl.gz holds conversations, compressed: decompress it to a .jsonl"):
        is_conversation_file(tmp_path / "a.jsonl.gz")
    with gzip.open(tmp_path / "text.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "hi"}) + "\n")
    assert not is_conversation_file(tmp_path / "text.jsonl.gz")
