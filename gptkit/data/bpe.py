"""
Train a byte-level BPE tokenizer on a corpus with Hugging Face `tokenizers` (its trainer is Rust, on every core),
and turn what it learned into the merges gptkit/data/tokenizer.py's TrainedBPE encodes with: ids 0-255 the bytes,
then each new token in the order it was merged, then <|endoftext|>. Saved as the dataset's tokenizer.json.

The trainer cuts text as GPT-2 does (its ByteLevel pre-tokenizer, no space put in front) and counts how often
each pair of neighbouring tokens occurs inside the words; each step merges the most frequent pair into a new
token, until the vocabulary has the size asked for. Trained twice on the same text, it learns the same merges.
"""

import json
from collections import Counter

from gptkit.base.errors import UserError
from gptkit.base.files import write_whole
from gptkit.data.tokenizer import BPE_FORMAT, END_OF_TEXT, GPT2_PATTERN, bpe_checksum, ranks_of, visible

SMALLEST = 257  # the 256 bytes and <|endoftext|>
# Hugging Face's trainer sets aside about 70 bytes for each token asked for before it reads a byte: a billion
# would abort the process; 2**24 is 80 times the largest vocabularies in use (o200k) and 1.2 GB set aside
LARGEST = 2 ** 24
TOKENIZER_FILE = "tokenizer.json"  # a trained BPE's merges, in the dataset folder beside meta.json


def check_vocab_size(vocab_size):
    if vocab_size < SMALLEST:
        raise ValueError(f"vocab_size {vocab_size} is too small: a byte-level BPE holds the 256 bytes and "
                        f"{END_OF_TEXT}, so at least {SMALLEST} (each token past them is a merge)")
    if vocab_size > LARGEST:
        raise ValueError(f"vocab_size must be at most {LARGEST:,} (got {vocab_size:,}): the trainer sets aside about "
                         f"70 bytes for each token asked for, {vocab_size * 70 / 1e9:,.0f} GB for these, before it "
                         "reads the text")


def byte_chars():
    """GPT-2's map from each byte to the printable character Hugging Face's ByteLevel writes it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def train_bpe(texts, vocab_size, words=None):
    """The tokenizer content (gptkit/data/tokenizer.py's format) of a byte-level BPE of vocab_size tokens, the
    end-of-text token included, trained on texts (an iterable of strings, read once); with `words` (a WordCounts),
    their words counted on the way."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    check_vocab_size(vocab_size)
    if words is not None:
        texts = (words.add(t) or t for t in texts)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # every byte is a token from the start, seen in the corpus or not, so any text can be encoded
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    content = from_hugging_face(json.loads(tok.to_str())["model"])
    reached = len(ranks_of(content["merges"])[1]) + 1
    if reached < vocab_size:
        raise UserError(f"the corpus can be merged into only {reached:,} tokens ({END_OF_TEXT} included), fewer "
                        f"than vocab_size {vocab_size:,}: ask for --vocab_size={reached} or fewer, or give it more "
                        "text")
    return content


def from_hugging_face(model):
    """Hugging Face's BPE model (tokens written as ByteLevel characters) as merges of our ids."""
    byte_of = {c: b for b, c in byte_chars().items()}
    ids = {bytes([b]): b for b in range(256)}
    merges = []
    for merge in model["merges"]:
        first, second = merge.split(" ") if isinstance(merge, str) else merge
        a, b = (ids[bytes(byte_of[c] for c in part)] for part in (first, second))
        merges.append([a, b])
        ids.setdefault(bytes(byte_of[c] for c in first + second), len(ids))  # a new token: the next id
    return {"format": BPE_FORMAT, "pattern": GPT2_PATTERN, "merges": merges}


class WordCounts:
    """How often each of the corpus's words (GPT-2's pre-tokenizer pieces) occurs, gathered while the trainer
    reads the text, so the first merges can be shown with the counts that chose them."""

    def __init__(self):
        import regex  # tiktoken's own dependency

        self.pattern, self.counts = regex.compile(GPT2_PATTERN), Counter()

    def add(self, text):
        self.counts.update(self.pattern.findall(text))

    def merge_counts(self, merges, k):
        """The first k merges' counts: how many times each pair stood side by side in the words (weighted by
        each word's count, as the trainer counts) when it was merged."""
        words = Counter()
        for word, n in self.counts.items():
            words[tuple(word.encode("utf-8"))] += n
        counts = []
        for a, b, new in merges[:k]:
            counts.append(0)
            for word in [w for w in words if a in w and b in w]:
                n = words.pop(word)
                counts[-1] += n * sum(1 for i in range(len(word) - 1) if word[i] == a and word[i + 1] == b)
                words[merged(word, a, b, new)] += n
        return counts


def merged(word, a, b, new):
    """A word's tokens with each (a, b) side by side replaced by new, left to right."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def merges_table(tok, counts):
    """The first merges as lines: 't h → th' with the count that chose each."""
    lines = [f"the first {len(counts):,} of {len(tok.merges):,} merges (count: how often the pair stood side by "
             "side in the training text when it was merged):"]
    for rank, ((a, b, new), count) in enumerate(zip(tok.merges, counts), 1):
        pair = f"{visible(tok.token_label(a))} {visible(tok.token_label(b))} → {visible(tok.token_label(new))}"
        lines.append(f"{rank:>6}  {pair:<32}{count:>14,}")
    return lines


def save_tokenizer(path, content):
    """The trained tokenizer's file: its format and pattern, then one merge a line (token ids; 0-255 are bytes);
    written whole and synced, never through a link."""
    head = {k: v for k, v in content.items() if k != "merges"}
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
    merges = ",\n  ".join(json.dumps(m) for m in content["merges"])
    write_whole(path, "{\n" + "\n".join(lines) + f'\n "merges": [\n  {merges}\n ]\n}}\n')


def tokenizer_fields(tok):
    """meta.json's fields that name a dataset's tokenizer: its metadata, but a trained BPE's merges, which are in
    TOKENIZER_FILE, named instead."""
    about = {k: v for k, v in tok.to_meta().items() if k != "bpe"}
    if tok.kind == "bpe":
        about["tokenizer_file"] = TOKENIZER_FILE
    return about


def saved_checksum(path):
    """The checksum of a tokenizer file's content, or None where it is missing or not JSON."""
    try:
        return bpe_checksum(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
