"""
A chat dataset: conversations (gptkit/data/conversations.py) as tokens, each token's role beside it (which
tells the loss what to count), plain text mixed in where asked, and for synthetic tasks their held-out problems.

Files, beside meta.json: train.bin and val.bin (the tokens, as any dataset's), train_roles.bin and val_roles.bin
(one byte a token: PROMPT, ANSWER or TEXT), heldout.jsonl (the held-out problems, one conversation a line with
its task's name), and a trained BPE's tokenizer.json. Conversations are split by a hash of their line, as records
are; plain text by position (its tail is val), so that mixing tinyshakespeare in keeps its val text the one the
base model was scored on.

Any tokenizer serves, with the chat markers as single tokens (gptkit/data/tokenizer.py): characters, a tiktoken
encoding (gpt2: the markers are 50257-50259, past GPT-2's tokens, so a model trained on GPT-2's tokens keeps its
ids), or a BPE trained here on the train split's conversations and text (the markers after its <|endoftext|>).
"""

import hashlib
import json
from pathlib import Path

import numpy as np

from gptkit.base.errors import UserError
from gptkit.base.files import write_whole
from gptkit.data.bpe import TOKENIZER_FILE, WordCounts, merges_table, save_tokenizer, tokenizer_fields, train_bpe
from gptkit.data.conversations import MARKERS, TEXT, read_conversations, render
from gptkit.data.shards import token_dtype
from gptkit.data.sources import in_val, sha256_of, shown, source_record
from gptkit.data.tasks import conversation, problems
from gptkit.data.tokenizer import TiktokenTokenizer, TrainedBPE, make_tokenizer

PIECE_CHARS = 1000  # plain text is mixed in as pieces of about this many characters, cut after a newline
HELDOUT_FILE = "heldout.jsonl"
# the tasks with the main job's text mixed in, which keeps what a base run learned of it (docs/chat.md)
PREPARE_TASKS = "python data/prepare.py --synthetic=tasks --mix=data/shakespeare_char/input.txt"
MIXED_VAL_FILE = "mixed_val.txt"  # the val part of the text mixed in: chat.py --eval scores every stage on it


def text_pieces(text):
    """The text in pieces of about PIECE_CHARS characters, each ending after a newline where it has one."""
    pieces, at = [], 0
    while at < len(text):
        end = text.find("\n", at + PIECE_CHARS)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[at:end])
        at = end
    return pieces


def mixed_text(cfg):
    """(train text, val text) of the plain text to mix in: its first 1 - val_fraction and its tail."""
    if not cfg.mix:
        return "", ""
    try:
        text = Path(cfg.mix).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"--mix={cfg.mix}: no such file") from None
    except UnicodeDecodeError:
        raise UserError(f"--mix={cfg.mix} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"could not read --mix={cfg.mix} ({e.strerror or e})") from None
    if not text.strip():
        raise UserError(f"--mix={cfg.mix} holds no text to mix in")
    cut = int(len(text) * (1 - cfg.val_fraction))  # as a char-level prepare of that text splits it
    return text[:cut], text[cut:]


class Stream:
    """One split's tokens and their roles, as they are appended."""

    def __init__(self):
        self.ids, self.roles = [], []
        self.conversations = self.chat_tokens = self.text_tokens = 0

    def add(self, ids, roles):
        self.ids.extend(ids)
        self.roles.extend(roles)
        self.conversations += 1
        self.chat_tokens += len(ids)

    def add_text(self, ids):
        self.ids.extend(ids)
        self.roles.extend([TEXT] * len(ids))
        self.text_tokens += len(ids)


def side_of(messages, cfg):
    """'train' or 'val': a conversation's split, decided by a hash of it."""
    return "val" if in_val(json.dumps(messages).encode("utf-8"), cfg.val_fraction) else "train"


def split_streams(cfg, conversations, tok, mix):
    """The train and val Streams: each conversation on its side, decided by a hash of it, and after it pieces
    of that side's plain text while they make less than mix_share of its tokens (the pieces again from the
    first, where the text is too short). Both sides mix alike, so val loss weighs answers and text as training
    does."""
    streams = {"train": Stream(), "val": Stream()}
    pieces = {side: text_pieces(text) for side, text in zip(streams, mix)}
    ratio = cfg.mix_share / (1 - cfg.mix_share) if cfg.mix else 0.0
    taken = {side: 0 for side in streams}
    for messages in conversations:
        side = side_of(messages, cfg)
        stream = streams[side]
        stream.add(*render(messages, tok))
        while pieces[side] and stream.text_tokens < ratio * stream.chat_tokens:
            stream.add_text(tok.encode(pieces[side][taken[side] % len(pieces[side])]))
            taken[side] += 1
    return streams


def heldout_lines(cfg):
    """heldout.jsonl's text: cfg.heldout held-out problems of each synthetic task (none for a file)."""
    if cfg.synthetic != "tasks":
        return ""
    return "".join(json.dumps(conversation(task, q, a)) + "\n"
                   for task, _ in cfg.task_list() for q, a in problems(task, "heldout", cfg.heldout, seed=0))


def write_chat_dataset(cfg, path, work):
    """Tokenize the conversations of `path` (and the text to mix in) into the work folder: the token and role
    files of both splits, heldout.jsonl and a trained BPE's tokenizer.json; the tokenizer and the metadata."""
    skipped = [] if cfg.skip_bad else None
    conversations, mix = read_conversations(path, skipped), mixed_text(cfg)
    if skipped:
        lines = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        print(f"note: skipped {len(skipped):,} bad line{'s' * (len(skipped) > 1)} of {shown(path)} (--skip_bad): "
              f"line{'s' * (len(skipped) > 1)} {lines}")
    heldout = heldout_lines(cfg)
    tok = chat_tokenizer(cfg, conversations, mix, heldout, work)
    streams = split_streams(cfg, conversations, tok, mix)
    if not streams["val"].ids or not streams["train"].conversations:
        different = len({json.dumps(messages) for messages in conversations})
        copies = "" if different == len(conversations) else \
            f", {different:,} of them different (a conversation's split is decided by its text: copies share one)"
        raise UserError(f"{shown(path)}: too few conversations to split into train and val "
                        f"({len(conversations):,}{copies}; val_fraction {cfg.val_fraction})")
    dtype, files = token_dtype(cfg, tok), {}
    for split, stream in streams.items():
        for name, values, kind in ((f"{split}.bin", stream.ids, dtype), (f"{split}_roles.bin", stream.roles, "uint8")):
            write_whole(work / name, np.asarray(values, dtype=kind).tobytes())
            files[name] = {"file": name, "tokens": len(values), "sha256": sha256_of(work / name)}
    texts = {name: text.encode("utf-8") for name, text in ((HELDOUT_FILE, heldout), (MIXED_VAL_FILE, mix[1])) if text}
    for name, data in texts.items():
        write_whole(work / name, data)
    meta = chat_meta(cfg, path, tok, dtype, streams, files, heldout)
    # their checksums: chat.py and rl.py score on these files, which no token count checks
    return tok, dict(meta, text_sha256={name: hashlib.sha256(data).hexdigest() for name, data in texts.items()})


def chat_tokenizer(cfg, conversations, mix, heldout, work):
    """The dataset's tokenizer, the chat markers single tokens in it: char-level, of every character the
    conversations, the text mixed in and the held-out problems hold; a tiktoken encoding; or a BPE trained on
    the train split's conversations and mixed text (as a plain dataset's learns from its train split only), its
    merges written to the work folder's tokenizer.json."""
    if cfg.tokenizer == "char":
        chars = set("".join(MARKERS.values())) | set(mix[0]) | set(mix[1]) | set(heldout_text_chars(heldout))
        for messages in conversations:
            for message in messages:
                chars.update(message["content"])
        return make_tokenizer("char", "".join(sorted(chars)))
    if cfg.tokenizer != "bpe":
        return TiktokenTokenizer(cfg.tokenizer, chat=True)
    texts = [m["content"] for messages in conversations if side_of(messages, cfg) == "train" for m in messages]
    words = WordCounts() if cfg.show_merges else None
    content = train_bpe(texts + text_pieces(mix[0]), cfg.vocab_size, words)
    save_tokenizer(work / TOKENIZER_FILE, content)
    tok = TrainedBPE(content, chat=True)
    if words:
        print("\n".join(merges_table(tok, words.merge_counts(tok.merges, cfg.show_merges))))
    return tok


def heldout_text_chars(heldout):
    return "".join(m["content"] for line in heldout.splitlines() for m in json.loads(line)["messages"])


def chat_meta(cfg, path, tok, dtype, streams, files, heldout):
    """meta.json's fields for a chat dataset (its checksum and write are prepare's)."""
    tasks = sorted({json.loads(line)["task"] for line in heldout.splitlines()})
    counts = tok.char_counts()  # characters each token spells: one char-level, none for a BPE's markers
    return dict(tokenizer_fields(tok), vocab_size=tok.vocab_size, dtype=dtype,
                **{f"{split}_tokens": len(stream.ids) for split, stream in streams.items()},
                **{f"{split}_chars": int(counts[stream.ids].sum()) for split, stream in streams.items()},
                train_shards=[files["train.bin"]], val_shards=[files["val.bin"]],
                roles={split: files[f"{split}_roles.bin"] for split in streams},
                chat=tok.chat,
                conversations={split: stream.conversations for split, stream in streams.items()},
                text_tokens={split: stream.text_tokens for split, stream in streams.items()},
                **({"tasks": tasks, "heldout_file": HELDOUT_FILE, "heldout_per_task": cfg.heldout} if tasks else {}),
                split="by document", val_fraction=cfg.val_fraction,
                documents=sum(s.conversations for s in streams.values()),
                skipped={"empty": 0, "bad": 0}, source=shown(path),
                sources=[source_record(path)],
                **({"mix": {**source_record(Path(cfg.mix)), "share": cfg.mix_share, "val_file": MIXED_VAL_FILE}}
                   if cfg.mix else {}))
