"""Training a byte-level BPE (gptkit/data/bpe.py): the merges a naive BPE loop written here learns, with their
counts; the same tokens as Hugging Face's own encoder of what it trained; the same merges when trained again;
and one line for a vocabulary the text cannot fill."""

import os
from collections import Counter

import pytest
import regex

from conftest import make_text, mixed_script_text
from gptkit.base.errors import UserError
from gptkit.data.bpe import WordCounts, merges_table, save_tokenizer, saved_checksum, train_bpe
from gptkit.data.preparing import bpe_cut
from gptkit.data.tokenizer import END_OF_TEXT, GPT2_PATTERN, TrainedBPE


def naive_bpe(text, trained):
    """BPE as the notes write it: split into words by GPT-2's pattern, each word a list of its bytes; then, again
    and again, count every pair of neighbours over all words and merge the most frequent into a new token. Where
    pairs tie, it takes the one `trained` (a list of byte pairs) took, which must be among them. The merges as
    (first bytes, second bytes, count)."""
    words = Counter(tuple(bytes([b]) for b in w.encode("utf-8")) for w in regex.findall(GPT2_PATTERN, text))
    learned = []
    for taken in trained:
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        count = max(pairs.values())
        tied = [pair for pair, n in pairs.items() if n == count]
        best = tied[0] if len(tied) == 1 else taken if taken in tied else None
        assert best is not None, f"{taken} was merged, but the most frequent pairs were {tied}"
        learned.append((*best, count))
        new = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new[tuple(out)] += n
        words = new
    return learned


@pytest.mark.parametrize("text", [make_text(20000, seed=1), mixed_script_text(20000, seed=2)], ids=["en", "mixed"])
def test_the_merges_and_their_counts_are_a_naive_bpe_loops(text):
    tok = TrainedBPE(train_bpe([text], 300))
    words = WordCounts()
    words.add(text)
    bytes_of = tok.enc.decode_single_token_bytes
    counts = words.merge_counts(tok.merges, 40)
    ours = [(bytes_of(a), bytes_of(b), count) for (a, b, _), count in zip(tok.merges, counts)]
    assert ours == naive_bpe(text, [(a, b) for a, b, _ in ours])
    assert all(bytes_of(new) == bytes_of(a) + bytes_of(b) for a, b, new in tok.merges)
    assert counts == sorted(counts, reverse=True)  # a merge never makes a pair more frequent than itself


def test_token_ids_are_the_bytes_then_the_merges_in_order_then_end_of_text():
    tok = TrainedBPE(train_bpe([make_text(20000)], 300))
    assert tok.vocab_size == 300 and tok.eot_token == 299
    assert [tok.enc.decode_single_token_bytes(i) for i in range(256)] == [bytes([i]) for i in range(256)]
    assert [new for _, _, new in tok.merges] == list(range(256, 299))
    assert tok.encode(END_OF_TEXT) != [299]  # ordinary text; only the corpus's separators are the special token


@pytest.mark.parametrize("text", [make_text(30000, seed=4), mixed_script_text(30000, seed=5)], ids=["en", "mixed"])
def test_tiktoken_encodes_the_trained_ranks_as_hugging_faces_own_encoder_does(text):
    """The reference: the tokenizer Hugging Face trained, encoding with its own merges."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from gptkit.data.bpe import byte_chars

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.train_from_iterator([text], trainers.BpeTrainer(vocab_size=511, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    byte_of = {c: b for b, c in byte_chars().items()}
    ours = TrainedBPE(train_bpe([text], 512))
    unseen = mixed_script_text(8000, seed=9) + " Zebras quickly vexed 1234567"
    for sample in (text, unseen):
        theirs = [bytes(byte_of[c] for c in hf.id_to_token(i)) for i in hf.encode(sample).ids]
        assert [ours.enc.decode_single_token_bytes(i) for i in ours.encode(sample)] == theirs


def test_trained_again_on_the_same_text_it_learns_the_same_merges():
    text = mixed_script_text(20000, seed=3)
    at = bpe_cut(text[:10000])  # where no word is cut: the same words in two pieces
    first, second = TrainedBPE(train_bpe([text], 400)), TrainedBPE(train_bpe([text[:at], text[at:]], 400))
    assert first.content == second.content and first.sha256 == second.sha256


def test_a_vocabulary_the_text_cannot_fill_says_the_size_it_reached():
    with pytest.raises(UserError, match=r"^the corpus can be merged into only 2\d\d tokens .* vocab_size 5,000: "
                                        r"ask for --vocab_size=2\d\d or fewer"):
        train_bpe(["abc abd abe"], 5000)


def test_the_merges_table_draws_whitespace():
    text = make_text(20000)
    tok = TrainedBPE(train_bpe([text], 300))
    words = WordCounts()
    words.add(text)
    lines = merges_table(tok, words.merge_counts(tok.merges, 5))
    assert len(lines) == 6 and "of 43 merges" in lines[0]
    assert any("␣" in line and " → " in line for line in lines[1:])
    assert lines[1].split()[-1].replace(",", "").isdigit()


def test_the_tokenizer_file_is_written_whole_and_never_through_a_link(tmp_path, outside):
    content = train_bpe([make_text(5000)], 270)
    path = tmp_path / "tokenizer.json"
    save_tokenizer(path, content)
    assert saved_checksum(path) == TrainedBPE(content).sha256
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "tokenizer.json"]  # no temporary file left beside it
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(UserError, match=f"^{path} is a link, and the tool writes this file itself"):
        save_tokenizer(path, content)
    assert outside.read_text() == "precious\n" and path.is_symlink()
