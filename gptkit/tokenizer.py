"""
Tokenizers: characters (the vocabulary is stored with the data and the checkpoint)
or any tiktoken BPE encoding (stored by name). Both round-trip through a JSON-able dict.
"""

import codecs
import unicodedata

import numpy as np

from gptkit.errors import UserError


class CharTokenizer:
    kind = "char"

    def __init__(self, chars):
        self.chars = "".join(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

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

    def __init__(self, name):
        import tiktoken

        try:
            self.enc = get_encoding(tiktoken, name)
        except ValueError:
            raise UserError(f"unknown tokenizer {name!r}: use 'char' or a tiktoken encoding "
                            f"({', '.join(tiktoken.list_encoding_names())})") from None
        except Exception as e:  # tiktoken fetches its files on first use
            raise UserError(f"could not load tiktoken encoding {name!r} ({type(e).__name__}); offline, "
                            "point TIKTOKEN_CACHE_DIR at a folder that holds its cached files") from None
        self.name = name
        self.vocab_size = self.enc.n_vocab
        self.eot_token = self.enc.eot_token

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def encode_array(self, text, dtype):
        """encode() as a numpy array, without the Python list between, which is faster;
        special tokens' text is ordinary text here too."""
        return self.enc.encode_to_numpy(text, disallowed_special=()).astype(dtype, copy=False)

    def decode(self, ids):
        return self.enc.decode(list(ids))

    def stream_decoder(self):
        """A function from token to text that holds back bytes until they form whole characters."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda token: utf8.decode(self.enc.decode_single_token_bytes(token))

    def to_meta(self):
        return {"tokenizer": "tiktoken", "encoding": self.name}


def make_tokenizer(name, text_chars=None):
    """'char' (needs the corpus characters) or a tiktoken encoding name."""
    if name == "char":
        return CharTokenizer(sorted(text_chars))
    return TiktokenTokenizer(name)


def tokenizer_from_meta(meta):
    if meta.get("tokenizer") == "char":
        return CharTokenizer(meta["vocab"])
    if meta.get("tokenizer") == "tiktoken":
        return TiktokenTokenizer(meta["encoding"])
    raise UserError(f"unknown tokenizer in metadata: {meta.get('tokenizer')!r}")


def same_token_ids(a, b):
    """Whether two tokenizer metadata (a checkpoint's, a dataset's) give every text the same token ids."""
    if a.get("tokenizer") != b.get("tokenizer"):
        return False
    if a.get("tokenizer") == "char":
        return a.get("vocab") == b.get("vocab")
    names = {a.get("encoding"), b.get("encoding")}
    return len(names) == 1 or names == set(SAME_ENCODING)


def describe_vocabulary(meta):
    if meta.get("tokenizer") == "char":
        return f"a vocabulary of {len(meta.get('vocab', ''))} characters"
    return f"tiktoken's {meta.get('encoding')!r} tokens"
