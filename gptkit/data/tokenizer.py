"""
Tokenizers: characters (the vocabulary is stored with the data and the checkpoint), any tiktoken BPE encoding
(stored by name), or a byte-level BPE trained on the corpus by data/prepare.py --tokenizer=bpe (its merges
stored with the data and in every checkpoint). Each round-trips through a JSON-able dict.

A chat dataset's tokenizer has the chat markers (gptkit/data/conversations.py) as single tokens: char-level, as
characters of its vocabulary; a BPE's, as tokens of their own with the ids just past its vocabulary (gpt2's
50257-50259), which its dict names under "chat", as meta.json does.
"""

import codecs
import hashlib
import json
import unicodedata

import numpy as np

from gptkit.base.errors import UserError
from gptkit.data.conversations import MARKERS


class CharTokenizer:
    kind = "char"

    def __init__(self, chars):
        self.chars = "".join(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)
        # the chat markers' ids ({"user": id, "assistant": id, "end": id}) where the vocabulary holds them, else None
        held = all(c in self.stoi for c in MARKERS.values())
        self.chat = {name: self.stoi[c] for name, c in MARKERS.items()} if held else None

    def encode(self, text):
        if not set(text) <= self.stoi.keys():
            text = self.as_trained(text)
        return [self.stoi[c] for c in text]

    def as_trained(self, text):
        """The text in the canonical Unicode form (NFC or NFD) whose characters the vocabulary holds: the same
        text by Unicode's definition ('é' as one character or as 'e' and a combining accent), written as the
        training text wrote it. Else one line naming the characters outside the vocabulary, and for each the
        compatibility equivalent it holds, where it holds one (NFKC: 'ﬁ' for 'fi', full-width letters), which
        is another text and so only named."""
        for form in ("NFC", "NFD"):
            same = unicodedata.normalize(form, text)
            if set(same) <= self.stoi.keys():
                return same
        missing = sorted(set(text) - self.stoi.keys())
        shown = []
        for c in missing[:10]:
            like = unicodedata.normalize("NFKC", c)
            held = like != c and set(like) <= self.stoi.keys()
            shown.append(f"{c!r} (the vocabulary has {like!r}: write that)" if held else repr(c))
        raise UserError(f"the text has characters outside the training vocabulary: {', '.join(shown)}")

    def encode_array(self, text, dtype):
        """encode() as a numpy array, at numpy's speed: each character's code point looked up among the
        vocabulary's, sorted."""
        if not hasattr(self, "points"):
            points = np.frombuffer(self.chars.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            self.order = np.argsort(points)
            self.points = points[self.order]
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        at = np.minimum(np.searchsorted(self.points, codes), len(self.points) - 1)
        if not np.array_equal(self.points[at], codes):
            return np.asarray(self.encode(text), dtype=dtype)  # says which characters are missing
        return self.order[at].astype(dtype)

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def stream_decoder(self):
        return lambda token: self.chars[token]

    def to_meta(self):
        return {"tokenizer": "char", "vocab": self.chars}

    def token_label(self, token):
        return self.chars[token]

    def char_counts(self):
        """Characters of text each token spells: one each."""
        return np.ones(self.vocab_size, dtype=np.int64)

    def chars_spelled(self, ids):
        return len(ids)


# gpt2 and r50k_base are one encoding (same ranks, pattern and <|endoftext|>) that tiktoken downloads
# from different files, so either one's cached files serve both names
SAME_ENCODING = {"gpt2": "r50k_base", "r50k_base": "gpt2"}


def get_encoding(tiktoken, name):
    try:
        return tiktoken.get_encoding(name)
    except Exception:
        if name not in SAME_ENCODING:
            raise
        return tiktoken.get_encoding(SAME_ENCODING[name])


class TiktokenTokenizer:
    kind = "tiktoken"
    chat, markers = None, frozenset()  # with_markers: the chat markers' ids, and their characters

    def __init__(self, name, chat=False):
        import tiktoken

        try:
            self.enc = get_encoding(tiktoken, name)
        except ValueError:
            raise UserError(f"unknown tokenizer {name!r}: use 'char', 'bpe' (trained on your text) or a tiktoken "
                            f"encoding ({', '.join(tiktoken.list_encoding_names())})") from None
        except Exception as e:  # tiktoken fetches its files on first use
            raise UserError(f"could not load tiktoken encoding {name!r} ({type(e).__name__}); offline, "
                            "point TIKTOKEN_CACHE_DIR at a folder that holds its cached files") from None
        self.name = name
        self.vocab_size = self.enc.n_vocab
        self.eot_token = self.enc.eot_token
        if chat:
            self.with_markers()

    def with_markers(self):
        """Add the chat markers as tokens of their own, with the ids just past the encoding's: tiktoken's special
        tokens, so that each marker character is one token wherever it stands and never its UTF-8 bytes, and the
        text between markers is cut and merged as it would be on its own."""
        import tiktoken

        self.chat = {name: self.enc.n_vocab + i for i, name in enumerate(MARKERS)}
        self.markers = frozenset(MARKERS.values())
        # a new Encoding of the old one's parts and more special tokens, as tiktoken's README extends an encoding
        specials = {**self.enc._special_tokens, **{MARKERS[name]: i for name, i in self.chat.items()}}
        self.enc = tiktoken.Encoding(f"{self.enc.name}-chat", pat_str=self.enc._pat_str,
                                     mergeable_ranks=self.enc._mergeable_ranks, special_tokens=specials)
        self.vocab_size = self.enc.n_vocab

    def encode(self, text):
        if self.chat:  # a marker's character is its token; any other special token's text is ordinary text
            return self.enc.encode(text, allowed_special=self.markers, disallowed_special=())
        return self.enc.encode_ordinary(text)

    def encode_array(self, text, dtype):
        """encode() as a numpy array, without the Python list between, which is faster;
        special tokens' text (but the chat markers') is ordinary text here too."""
        return self.enc.encode_to_numpy(text, allowed_special=self.markers,
                                        disallowed_special=()).astype(dtype, copy=False)

    def decode(self, ids):
        return self.enc.decode(list(ids))

    def stream_decoder(self):
        """A function from token to text that holds back bytes until they form whole characters."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda token: utf8.decode(self.enc.decode_single_token_bytes(token))

    def to_meta(self):
        return {"tokenizer": "tiktoken", "encoding": self.name, **({"chat": self.chat} if self.chat else {})}

    def token_label(self, token):
        """A token's text; where it holds only part of a character's UTF-8 bytes, those bytes in hex."""
        return bytes_label(self.enc.decode_single_token_bytes(token))

    def chars_of(self, token):
        """Characters of text a token spells, counted as the characters its bytes begin (UTF-8 bytes other than
        0b10xxxxxx), so a character cut between two tokens counts once; a special token spells none."""
        data = self.enc.decode_single_token_bytes(token)
        if data.decode("utf-8", "replace") in self.enc.special_tokens_set:
            return 0
        return sum(1 for b in data if b & 0xC0 != 0x80)

    def char_counts(self):
        """chars_of every token, by id (an id no token has, as some encodings leave, spells none)."""
        counts = np.zeros(self.enc.n_vocab, dtype=np.int64)
        for token in range(self.enc.n_vocab):
            try:
                counts[token] = self.chars_of(token)
            except KeyError:
                continue
        return counts

    def chars_spelled(self, ids):
        """Characters of text the tokens spell, without char_counts' pass over the whole vocabulary (a page
        reading a short text asks for a few tokens' worth)."""
        return sum(self.chars_of(token) for token in ids)


VISIBLE = {"\n": "\u21b5", "\t": "\u21e5", " ": "\u2423", "\r": "\u23ce"}  # ↵ ⇥ ␣ ⏎: blanks cannot be read


def visible(text):
    """Text with its whitespace drawn as symbols."""
    return "".join(VISIBLE.get(ch, ch) for ch in text)


def bytes_label(data):
    """Bytes as readable text: UTF-8 where they decode, each byte of a partial character as ⟨e4⟩."""
    return "".join(piece if isinstance(piece, str) else f"⟨{piece:02x}⟩" for piece in utf8_pieces(data))


def utf8_pieces(data):
    """The bytes as the longest UTF-8 texts they hold, and each byte that belongs to no whole character."""
    at = 0
    while at < len(data):
        for size in (4, 3, 2, 1):
            try:
                yield data[at:at + size].decode("utf-8")
                at += size
                break
            except UnicodeDecodeError:
                continue
        else:
            yield data[at]
            at += 1


# GPT-2's pre-tokenizer (tiktoken's r50k pattern, the regex of Hugging Face's ByteLevel): text is cut into words,
# numbers, punctuation and whitespace, each with at most one space in front, and merges never cross those cuts
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"
BPE_FORMAT = "gptkit byte-level BPE 1"


class TrainedBPE(TiktokenTokenizer):
    """A byte-level BPE trained on the corpus (gptkit/data/bpe.py): token ids 0-255 are the bytes, each merge
    that makes a new token gives it the next id, and <|endoftext|> is the last. tiktoken encodes with these
    ranks, as nanochat does: faster than the training library's own encoder (docs/tokenizers.md)."""
    kind = "bpe"

    def __init__(self, content, where="the tokenizer", chat=False):
        import tiktoken

        self.merges, ranks = checked_ranks(content, where)
        self.content, self.sha256 = content, bpe_checksum(content)
        self.eot_token, self.vocab_size = len(ranks), len(ranks) + 1
        self.name = f"bpe-{self.vocab_size}"
        self.enc = tiktoken.Encoding(self.name, pat_str=content["pattern"], mergeable_ranks=ranks,
                                     special_tokens={END_OF_TEXT: self.eot_token})
        if chat:  # after <|endoftext|>
            self.with_markers()

    def to_meta(self):
        return {"tokenizer": "bpe", "tokenizer_sha256": self.sha256, "vocab_size": self.vocab_size,
                **({"chat": self.chat} if self.chat else {}), "bpe": self.content}


def ranks_of(merges):
    """The merges as (first id, second id, new id), and every token's bytes by id as tiktoken's ranks; a merge
    whose bytes another merge made already keeps that token's id."""
    tokens = [bytes([b]) for b in range(256)]
    ranks = {t: i for i, t in enumerate(tokens)}
    made = []
    for a, b in merges:
        joined = tokens[a] + tokens[b]
        if joined not in ranks:
            ranks[joined] = len(tokens)
            tokens.append(joined)
        made.append((a, b, ranks[joined]))
    return made, ranks


def bpe_checksum(content):
    """sha256 of a trained tokenizer's content as compact JSON with sorted keys: the same merges, the same sum."""
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def checked_ranks(content, where):
    """ranks_of a trained tokenizer's merges, each naming tokens made before it; else one line."""
    fine = (isinstance(content, dict) and content.get("format") == BPE_FORMAT
            and isinstance(content.get("pattern"), str) and isinstance(content.get("merges"), list)
            and all(isinstance(pair, list) and len(pair) == 2 and all(type(i) is int and i >= 0 for i in pair)
                    for pair in content["merges"]))
    try:
        if fine:
            return ranks_of(content["merges"])
    except IndexError:  # a merge of a token no merge before it made
        pass
    raise UserError(f"{where} is damaged: it is not a byte-level BPE with merges data/prepare.py wrote; "
                    "run data/prepare.py for its dataset again")


def make_tokenizer(name, text_chars=None):
    """'char' (needs the corpus characters) or a tiktoken encoding name ('bpe' is trained: gptkit/data/bpe.py)."""
    if name == "char":
        return CharTokenizer(sorted(text_chars))
    return TiktokenTokenizer(name)


def tokenizer_from_meta(meta):
    if meta.get("tokenizer") == "char":
        return CharTokenizer(meta["vocab"])
    if meta.get("tokenizer") == "tiktoken":
        return checked_markers(TiktokenTokenizer(meta["encoding"], chat=bool(meta.get("chat"))), meta,
                               "the tokenizer's metadata")
    if meta.get("tokenizer") == "bpe":
        return trained_bpe(meta)
    raise UserError(f"unknown tokenizer in metadata: {meta.get('tokenizer')!r}")


def trained_bpe(meta, where="the checkpoint's tokenizer"):
    """A trained BPE from its metadata (a checkpoint's, or a dataset's with its tokenizer file read in), checked
    against the checksum stored beside it."""
    if "bpe" not in meta:
        raise UserError(f"{where} is missing: the metadata names a trained BPE but holds none of its merges")
    tok = TrainedBPE(meta["bpe"], where, chat=bool(meta.get("chat")))
    if tok.sha256 != meta.get("tokenizer_sha256"):
        raise UserError(f"{where} is damaged or was edited: it does not match its checksum; run data/prepare.py "
                        "for its dataset again")
    return checked_markers(tok, meta, where)


def checked_markers(tok, meta, where):
    """A BPE with the chat markers, refused where its metadata names other ids for them: a model learned its
    rows at those ids."""
    if meta.get("chat") and meta["chat"] != tok.chat:
        raise UserError(f"{where} is damaged or was edited: it puts the chat markers at {meta['chat']}, but the "
                        f"tokenizer has them at {tok.chat}; run data/prepare.py for its dataset again")
    return tok


def same_token_ids(a, b):
    """Whether two tokenizer metadata (a checkpoint's, a dataset's) give every text the same token ids."""
    if a.get("tokenizer") != b.get("tokenizer"):
        return False
    if a.get("tokenizer") == "char":
        return a.get("vocab") == b.get("vocab")
    if a.get("chat") != b.get("chat"):  # a BPE's chat markers: tokens of their own in one, bytes in the other
        return False
    if a.get("tokenizer") == "bpe":
        return a.get("tokenizer_sha256") == b.get("tokenizer_sha256")
    names = {a.get("encoding"), b.get("encoding")}
    return len(names) == 1 or names == set(SAME_ENCODING)


def same_bpe(a, b):
    """Whether two tokenizer metadata are one BPE (the same encoding, or the same trained merges), with or without
    the chat markers: every other token has the same id in both, as the markers' ids are past them all."""
    return a.get("tokenizer") != "char" and same_token_ids(dict(a, chat=None), dict(b, chat=None))


def trained_size(meta):
    """The tokens a trained BPE learned, which --vocab_size asks for: its vocabulary less the chat markers."""
    size = meta.get("vocab_size")
    return size - len(MARKERS) if meta.get("chat") and type(size) is int else size


def describe_vocabulary(meta):
    if meta.get("tokenizer") == "char":
        return f"a vocabulary of {len(meta.get('vocab', ''))} characters"
    markers = " and the chat markers" if meta.get("chat") else ""
    if meta.get("tokenizer") == "bpe":
        return (f"a trained BPE of {trained_size(meta) or '?'} tokens ({str(meta.get('tokenizer_sha256'))[:12]})"
                f"{markers}")
    return f"tiktoken's {meta.get('encoding')!r} tokens{markers}"


def prepare_options(meta):
    """The data/prepare.py options that make a dataset's (or a checkpoint's) tokenizer: for characters and a trained
    BPE, from the same text (a trained BPE also with the same --val_fraction, as it learns from the train split).
    The chat markers come with conversations, whatever the options."""
    if meta.get("tokenizer") == "bpe":
        return f"--tokenizer=bpe --vocab_size={trained_size(meta)}"
    return f"--tokenizer={meta.get('encoding') if meta.get('tokenizer') == 'tiktoken' else meta.get('tokenizer')}"
