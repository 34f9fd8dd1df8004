"""data/prepare.py on a text file or a folder of them (gptkit/data/preparing.py): token files and metadata that
round-trip, the dtype chosen, text read in pieces that encode as the whole does, the download (from a local server:
tests never touch the network), one-line CLI errors. (Corpora of records: see test_corpora.py.)"""

import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import (REPO, assert_one_error_line, check_ok, copied_again, make_text, mixed_script_text, run_here,
                      run_script)
from gptkit.base.errors import UserError
from gptkit.data import preparing, sources
from gptkit.data.dataset import load_meta
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.data.tokenizer import tokenizer_from_meta


@pytest.fixture
def prepared(tmp_path, corpus_file):
    """A char-level dataset 'tiny' under tmp_path/data; returns (data_dir, out_dir, meta)."""
    data_dir = tmp_path / "data"
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(data_dir)))
    return data_dir, out_dir, meta


def read_tokens(out_dir, meta, split):
    return np.fromfile(out_dir / f"{split}.bin", dtype=meta["dtype"])


def decode_all(out_dir, meta):
    tok = tokenizer_from_meta(meta)
    return tuple(tok.decode(read_tokens(out_dir, meta, split).tolist()) for split in ("train", "val"))


def test_char_round_trip(prepared, corpus_file, corpus_text):
    data_dir, out_dir, meta = prepared
    assert out_dir == data_dir / "tiny"
    on_disk = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    assert on_disk == meta
    assert meta["tokenizer"] == "char"
    assert meta["vocab"] == "".join(sorted(set(corpus_text)))
    assert meta["vocab_size"] == len(set(corpus_text))
    assert "é" in meta["vocab"] and "—" in meta["vocab"]
    assert meta["dtype"] == "uint16"
    assert [(s["path"], s["bytes"]) for s in meta["sources"]] == [(str(corpus_file), corpus_file.stat().st_size)]
    assert meta["split"] == "by position" and meta["documents"] == 1
    n = len(corpus_text)
    assert meta["train_tokens"] == int(n * 0.9)
    assert meta["val_tokens"] == n - int(n * 0.9)
    train, val = read_tokens(out_dir, meta, "train"), read_tokens(out_dir, meta, "val")
    assert len(train) == meta["train_tokens"] and len(val) == meta["val_tokens"]
    train_text, val_text = decode_all(out_dir, meta)
    assert train_text + val_text == corpus_text
    assert train_text == corpus_text[:int(n * 0.9)]
    assert not (out_dir / "all.bin.tmp").exists()


def dataset_bytes(out_dir):
    """Every file a reader finds in a dataset folder, by name: what a prepare that is refused must leave as it was."""
    return {p.name: p.read_bytes() for p in out_dir.iterdir() if p.is_file() and not p.name.startswith(".")}


def test_the_same_text_and_settings_prepare_again_and_other_text_only_with_start_over(tmp_path, corpus_file,
                                                                                     capsys):
    cfg = PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d"))
    out_dir, meta = prepare(cfg)
    assert prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d"),
                                 shard_tokens=1000, dtype="uint32"))[1]["train_shards"][0]["file"] == "train_000.bin"
    assert prepare(cfg)[1] == meta  # the same again, as it was: a repair, or another layout of the same tokens
    before = dataset_bytes(out_dir)
    corpus_file.write_text("short text, but long enough\n" * 4, encoding="utf-8")
    with pytest.raises(UserError) as e:
        prepare(cfg)
    assert str(e.value) == (f"{out_dir} holds a dataset made from other text ({corpus_file} as it was then); "
                            "prepare this one under another --name, or replace that dataset with --start_over=True "
                            "(it is deleted)")
    assert dataset_bytes(out_dir) == before
    capsys.readouterr()
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d"),
                                          start_over=True))
    assert capsys.readouterr().out == (f"note: {out_dir} holds a dataset made from other text ({corpus_file} as it "
                                       "was then); --start_over=True: it is deleted once this one is whole\n")
    train, val = decode_all(out_dir, meta)
    assert train + val == corpus_file.read_text(encoding="utf-8")
    assert len(os.listdir(out_dir / ".versions")) == 1  # the old dataset is gone, as the line said


def test_the_same_text_copied_again_prepares_again_and_an_edit_of_its_size_does_not(tmp_path, corpus_file):
    """A source is known by its size and time, and where the time moved by its bytes' sha256: the same text copied
    over it again is the text the dataset was made of; an edit that keeps its size is other text."""
    cfg = PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d"))
    out_dir, meta = prepare(cfg)
    text = corpus_file.read_bytes()
    copied_again(corpus_file, text)
    assert prepare(cfg)[1]["train_shards"] == meta["train_shards"]
    before = dataset_bytes(out_dir)
    copied_again(corpus_file, text.replace(b"e", b"f", 1))
    with pytest.raises(UserError, match=r"holds a dataset made from other text \("):
        prepare(cfg)
    assert dataset_bytes(out_dir) == before


@pytest.mark.parametrize("first,then,made", [
    ({}, {"tokenizer": "bpe", "vocab_size": 300}, "made with --tokenizer=char"),
    ({"tokenizer": "bpe", "vocab_size": 300}, {"tokenizer": "bpe", "vocab_size": 290},
     "made with --tokenizer=bpe --vocab_size=300"),
    ({"tokenizer": "bpe", "vocab_size": 300}, {}, "made with --tokenizer=bpe --vocab_size=300"),
    ({}, {"val_fraction": 0.2}, "made with --val_fraction=0.1"),
])
def test_a_dataset_another_tokenizer_or_split_made_is_never_replaced_unasked(tmp_path, corpus_file, first, then,
                                                                             made):
    """Other merges (or another split, which a trained BPE learns from) are other token ids: a run trained on the
    dataset there could no longer resume."""
    data_dir = str(tmp_path / "d")
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=data_dir, **first))
    before = dataset_bytes(out_dir)
    with pytest.raises(UserError, match=f"^{out_dir} holds a dataset {made}; prepare this one under another --name"):
        prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=data_dir, **then))
    assert dataset_bytes(out_dir) == before and len(os.listdir(out_dir / ".versions")) == 1
    prepare(PrepareConfig(input=str(corpus_file), name="other", data_dir=data_dir, **then))
    assert prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=data_dir, **first))[1] == meta


def test_a_dataset_prepared_into_its_own_input_folder_is_not_read_as_input_the_next_time(tmp_path, corpus_file):
    """nanoGPT keeps input.txt beside the dataset: prepared again, the folder's own meta.json and token files (links
    into .versions/) were read as more text, and the same command was refused as other text."""
    data_dir = tmp_path / "d"
    (data_dir / "mine").mkdir(parents=True)
    shutil.copy(corpus_file, data_dir / "mine" / "input.txt")
    cfg = PrepareConfig(input=str(data_dir / "mine"), name="mine", data_dir=str(data_dir))
    meta = prepare(cfg)[1]
    (data_dir / "mine" / ".notes").mkdir()
    (data_dir / "mine" / ".notes" / "todo.txt").write_text("not the corpus")
    assert prepare(cfg)[1] == meta


@pytest.mark.parametrize("damage,made", [
    ("not json", "whose meta.json cannot be read to say what made it"),
    ("no meta", "without a meta.json to say what made it (train.bin, val.bin)"),
])
def test_a_dataset_whose_making_is_unknown_is_replaced_only_with_start_over(tmp_path, corpus_file, damage, made):
    out_dir, _ = prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d")))
    meta_file = out_dir / os.readlink(out_dir / "meta.json")
    if damage == "not json":
        meta_file.write_text("{ cut sho", encoding="utf-8")
    else:
        meta_file.unlink()
    with pytest.raises(UserError, match=rf"^{out_dir} holds a dataset {re.escape(made)}; .* --start_over=True"):
        prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d")))
    meta = prepare(PrepareConfig(input=str(corpus_file), name="tiny", data_dir=str(tmp_path / "d"),
                                 start_over=True))[1]
    assert "".join(decode_all(out_dir, meta)) == corpus_file.read_text(encoding="utf-8")


@pytest.mark.slow
def test_cli_preparing_over_another_dataset_is_one_line_and_start_over_replaces_it(tmp_path, corpus_file):
    args = [f"--input={corpus_file}", "--name=tiny", f"--data_dir={tmp_path / 'd'}"]
    check_ok(run_script("data/prepare.py", *args))
    out_dir = tmp_path / "d" / "tiny"
    before = dataset_bytes(out_dir)
    proc = run_script("data/prepare.py", *args, "--tokenizer=bpe", "--vocab_size=300")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {out_dir} holds a dataset made with --tokenizer=char; prepare this "
                                       "one under another --name, or replace that dataset with --start_over=True "
                                       "(it is deleted)")
    assert dataset_bytes(out_dir) == before
    check_ok(run_script("data/prepare.py", *args, "--tokenizer=bpe", "--vocab_size=300", "--start_over=True"))
    assert json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))["tokenizer"] == "bpe"


@pytest.mark.parametrize("bad", ["empty", "latin-1", "vocabulary too big", "too little text"])
def test_a_prepare_that_fails_leaves_no_folder_and_train_s_hint_works(tmp_path, corpus_file, bad):
    """A dataset folder holding only a lock would tell train.py a dataset is there, half made; with none, its hint
    is the command that makes one."""
    path = tmp_path / "bad.txt"
    settings = {"tokenizer": "bpe", "vocab_size": 60000} if bad == "vocabulary too big" else {}
    path.write_bytes({"empty": b"", "latin-1": "café".encode("latin-1"), "too little text": b"a"}.get(bad, b"text"))
    data = tmp_path / "d"
    data.mkdir()
    with pytest.raises(UserError):
        prepare(PrepareConfig(input=str(path), name="mine", data_dir=str(data), **settings))
    assert os.listdir(data) == []
    with pytest.raises(UserError) as e:
        load_meta(str(data), "mine")
    command = re.fullmatch(r"dataset folder .* not found; create it with `python (.*)`", str(e.value)).group(1)
    check_ok(run_here(*command.replace("YOUR.txt", str(corpus_file)).split()))


def test_a_failed_prepare_clears_what_one_left_before_but_keeps_a_folder_the_user_made(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    left = tmp_path / "d" / "left"
    (left / ".versions").mkdir(parents=True)
    (left / ".prepare.lock").write_text("4242\n", encoding="utf-8")
    (tmp_path / "d" / "made").mkdir()
    for name in ("left", "made"):
        with pytest.raises(UserError, match="is empty"):
            prepare(PrepareConfig(input=str(empty), name=name, data_dir=str(tmp_path / "d")))
    assert os.listdir(tmp_path / "d") == ["made"] and os.listdir(tmp_path / "d" / "made") == []


def test_val_fraction(tmp_path, corpus_file, corpus_text):
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="t", data_dir=str(tmp_path / "d"),
                                          val_fraction=0.25))
    assert meta["train_tokens"] == int(len(corpus_text) * 0.75)
    assert meta["train_tokens"] + meta["val_tokens"] == len(corpus_text)


def test_a_text_file_in_shards_splits_where_its_val_tail_spans_whole_shards(tmp_path, corpus_file, corpus_text):
    """The last tenth of the tokens moves to val: the train shards it held go, and the part being filled with
    them must follow the shards kept (it once stayed at the old count, and finishing failed)."""
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="s", data_dir=str(tmp_path / "d"),
                                          shard_tokens=400, workers=1))
    n = len(corpus_text)
    assert meta["train_tokens"] == int(n * 0.9) and len(meta["train_shards"]) == -(-int(n * 0.9) // 400)
    tok = tokenizer_from_meta(meta)
    text = "".join(tok.decode(np.fromfile(out_dir / s["file"], dtype=meta["dtype"]).tolist())
                   for split in ("train", "val") for s in meta[f"{split}_shards"])
    assert text == corpus_text
    assert not [p for p in (out_dir / ".current").iterdir() if p.name.endswith(".part")]


def test_folder_input_reads_files_in_sorted_order(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second document\n", encoding="utf-8")
    (folder / "a.txt").write_text("first document — é\n", encoding="utf-8")
    (folder / "sub" / "c.txt").write_text("third one\n", encoding="utf-8")
    (folder / ".hidden").write_text("never read\n", encoding="utf-8")
    out_dir, meta = prepare(PrepareConfig(input=str(folder), name="docs", data_dir=str(tmp_path / "d")))
    train, val = decode_all(out_dir, meta)
    assert train + val == "first document — é\nsecond document\nthird one\n"


def test_uint32_when_vocab_exceeds_uint16(tmp_path):
    codepoints = [c for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c <= 0xDFFF][:66000]
    chars = [chr(c) for c in codepoints]
    text = "\n".join("".join(chars[i:i + 200]) for i in range(0, len(chars), 200)) + "\n"
    assert len(set(text)) > 65536
    path = tmp_path / "wide.txt"
    path.write_text(text, encoding="utf-8")
    out_dir, meta = prepare(PrepareConfig(input=str(path), name="wide", data_dir=str(tmp_path / "d")))
    assert meta["vocab_size"] == len(set(text)) > 65536
    assert meta["dtype"] == "uint32"
    assert (out_dir / "train.bin").stat().st_size == 4 * meta["train_tokens"]
    ids = np.concatenate([read_tokens(out_dir, meta, "train"), read_tokens(out_dir, meta, "val")])
    assert ids.max() > 65535  # ids that a uint16 file would have wrapped
    train_text, val_text = decode_all(out_dir, meta)
    assert train_text + val_text == text


def test_bpe_round_trip(tmp_path, tiktoken_cache, corpus_file, corpus_text):
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="bpe", tokenizer="r50k_base",
                                          data_dir=str(tmp_path / "d")))
    assert meta["tokenizer"] == "tiktoken" and meta["encoding"] == "r50k_base"
    assert meta["vocab_size"] == 50257
    assert meta["dtype"] == "uint16"
    train, val = read_tokens(out_dir, meta, "train"), read_tokens(out_dir, meta, "val")
    n = meta["train_tokens"] + meta["val_tokens"]
    assert len(train) == meta["train_tokens"] == int(n * 0.9) and len(val) == meta["val_tokens"]
    assert n < len(corpus_text) / 2  # BPE really merged characters
    tok = tokenizer_from_meta(meta)
    assert tok.decode(train.tolist() + val.tolist()) == corpus_text


def test_bpe_folder_separates_documents_with_end_of_text(tmp_path, tiktoken_cache):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("one two three four five six\n", encoding="utf-8")
    (folder / "b.txt").write_text("seven eight nine ten\n", encoding="utf-8")
    out_dir, meta = prepare(PrepareConfig(input=str(folder), name="docs", tokenizer="r50k_base",
                                          data_dir=str(tmp_path / "d")))
    ids = read_tokens(out_dir, meta, "train").tolist() + read_tokens(out_dir, meta, "val").tolist()
    assert ids.count(50256) == 2
    tok = tokenizer_from_meta(meta)
    assert tok.decode(ids) == "one two three four five six\n<|endoftext|>seven eight nine ten\n<|endoftext|>"


def test_a_trained_bpe_round_trips_and_is_trained_on_the_train_split_only(tmp_path, corpus_file):
    from gptkit.data.bpe import train_bpe
    from gptkit.data.tokenizer import TrainedBPE

    text = mixed_script_text(30000, seed=4)
    corpus_file.write_text(text, encoding="utf-8")
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="bpe", tokenizer="bpe", vocab_size=400,
                                          data_dir=str(tmp_path / "d")))
    content = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tok = TrainedBPE(content)
    assert meta["tokenizer"] == "bpe" and meta["tokenizer_file"] == "tokenizer.json"
    assert meta["tokenizer_sha256"] == tok.sha256 and meta["vocab_size"] == 400 and meta["dtype"] == "uint16"
    train, val = read_tokens(out_dir, meta, "train").tolist(), read_tokens(out_dir, meta, "val").tolist()
    assert tok.decode(train + val) == text  # the split may fall inside a character: decoded apart, each shows a �
    train_bytes = tok.enc.decode_bytes(train)  # its characters: those whose first byte is in train
    assert meta["train_chars"] == sum(1 for b in train_bytes if b & 0xC0 != 0x80) > 0
    assert meta["train_chars"] + meta["val_chars"] == len(text)
    data = text.encode("utf-8")  # the val split is the tail: the tokenizer saw the first 90% of the bytes
    assert content == train_bpe([data[:int(0.9 * len(data))].decode("utf-8", "ignore")], 400)


SPLIT_FIELDS = ["dtype", "train_tokens", "val_tokens", "train_chars", "val_chars", "train_shards", "val_shards",
                "split", "val_fraction", "documents", "skipped", "source", "sources", "sha256"]
PLAIN_FIELDS = {"gpt2": ["tokenizer", "encoding", "vocab_size", *SPLIT_FIELDS],
                "bpe": ["tokenizer", "tokenizer_sha256", "vocab_size", "tokenizer_file", *SPLIT_FIELDS]}


@pytest.mark.parametrize("tokenizer", ["gpt2", "bpe"])
def test_a_plain_bpe_dataset_is_as_it_was_before_chat_datasets_took_a_bpe(tmp_path, corpus_file, corpus_text,
                                                                         tokenizer, request):
    """Only a chat dataset's BPE has the chat markers: a plain dataset's meta.json has the fields it always had, in
    their order (no "chat"), its vocabulary is the encoding's own, and its tokens are the plain encoding's, a
    marker's character in the text spelled in bytes like any other."""
    import tiktoken

    from gptkit.data.conversations import MARKERS
    from gptkit.data.tokenizer import TrainedBPE, get_encoding

    text = corpus_text + MARKERS["user"] + "not a marker" + MARKERS["end"] + "\n"
    corpus_file.write_text(text, encoding="utf-8")
    if tokenizer == "gpt2":
        request.getfixturevalue("tiktoken_cache")
    out_dir, meta = prepare(PrepareConfig(input=str(corpus_file), name="plain", tokenizer=tokenizer,
                                          vocab_size=300 if tokenizer == "bpe" else 0, data_dir=str(tmp_path / "d")))
    on_disk = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    assert list(on_disk) == PLAIN_FIELDS[tokenizer]
    plain = get_encoding(tiktoken, "gpt2") if tokenizer == "gpt2" else \
        TrainedBPE(json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))).enc
    assert on_disk["vocab_size"] == plain.n_vocab == (50257 if tokenizer == "gpt2" else 300)
    ids = read_tokens(out_dir, meta, "train").tolist() + read_tokens(out_dir, meta, "val").tolist()
    assert ids == plain.encode_ordinary(text) and max(ids) < plain.n_vocab
    assert tokenizer_from_meta(meta).chat is None


def test_show_merges_prints_the_first_merges_with_their_counts(tmp_path, corpus_file, capsys):
    prepare(PrepareConfig(input=str(corpus_file), name="bpe", tokenizer="bpe", vocab_size=300, show_merges=4,
                          data_dir=str(tmp_path / "d")))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("the first 4 of 43 merges (count: how often the pair")
    assert [line.split()[0] for line in lines[1:5]] == ["1", "2", "3", "4"] and " → " in lines[1]


def test_token_files_take_the_smallest_type_that_holds_the_vocabulary():
    from types import SimpleNamespace

    cfg = PrepareConfig(input="x", name="x")
    assert preparing.token_dtype(cfg, SimpleNamespace(vocab_size=65536)) == "uint16"
    assert preparing.token_dtype(cfg, SimpleNamespace(vocab_size=65537)) == "uint32"


@pytest.mark.slow
def test_cli_a_vocabulary_the_corpus_cannot_fill_is_one_line_and_leaves_nothing(tmp_path, corpus_file):
    proc = run_script("data/prepare.py", f"--input={corpus_file}", "--name=big", f"--data_dir={tmp_path / 'd'}",
                      "--tokenizer=bpe", "--vocab_size=60000")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, "error: the corpus can be merged into only *")
    assert "--vocab_size=" in proc.stderr and not list((tmp_path / "d" / "big").glob("*.json"))


def test_unknown_tokenizer_is_user_error(tmp_path, corpus_file):
    with pytest.raises(UserError, match="tokenizer"):
        prepare(PrepareConfig(input=str(corpus_file), name="x", tokenizer="no_such_bpe",
                              data_dir=str(tmp_path / "d")))


def test_too_little_text(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("a", encoding="utf-8")
    with pytest.raises(UserError, match="too little"):
        prepare(PrepareConfig(input=str(path), name="x", data_dir=str(tmp_path / "d")))


@pytest.mark.slow
@pytest.mark.parametrize("name,content,word", [
    ("empty.txt", b"", "empty"),
    ("binary.txt", b"some text\x00\x01\x02 more", "binary"),
    ("latin1.txt", b"\xff\xfe abc", "UTF-8"),
    ("truncated.txt", "abc é".encode("utf-8")[:-1], "UTF-8"),
])
def test_cli_rejects_bad_input(tmp_path, name, content, word):
    path = tmp_path / name
    path.write_bytes(content)
    proc = run_script("data/prepare.py", f"--input={path}", "--name=bad", f"--data_dir={tmp_path / 'd'}")
    assert proc.returncode != 0
    line = assert_one_error_line(proc.stderr)
    assert word in line and name in line
    assert not (tmp_path / "d" / "bad" / "meta.json").exists()


@pytest.mark.slow
def test_cli_names_that_are_not_utf8(tmp_path, corpus_text):
    """File names are bytes: one that is not UTF-8 is read like any other, and shown (in meta.json, the summary
    line, an error) with those bytes escaped."""
    data_dir = tmp_path / os.fsdecode(b"d\xfe")
    good = tmp_path / os.fsdecode(b"caf\xe9.txt")
    good.write_text(corpus_text, encoding="utf-8")
    proc = check_ok(run_script("data/prepare.py", f"--input={good}", "--name=ok", f"--data_dir={data_dir}"))
    assert proc.stdout.startswith(f"wrote {tmp_path}/d\\xfe/ok: ")
    meta = json.loads((data_dir / "ok" / "meta.json").read_text(encoding="utf-8"))
    assert meta["source"] == f"{tmp_path}/caf\\xe9.txt"
    assert "".join(decode_all(data_dir / "ok", meta)) == corpus_text
    latin1, gone = tmp_path / os.fsdecode(b"bad\xff.txt"), tmp_path / os.fsdecode(b"gone\xff.txt")
    latin1.write_bytes("café\n".encode("latin-1"))
    for path, line in [(latin1, f"error: {tmp_path}/bad\\xff.txt is not UTF-8 text: byte 0xe9 at offset 3"),
                       (gone, f"error: input file not found: {tmp_path}/gone\\xff.txt")]:
        proc = run_script("data/prepare.py", f"--input={path}", "--name=bad", f"--data_dir={data_dir}")
        assert proc.returncode == 1
        assert_one_error_line(proc.stderr, line)


@pytest.mark.slow
def test_cli_refuses_pipes_and_devices(tmp_path):
    """prepare reads its input more than once, so a pipe (a FIFO, or /dev/stdin fed by one) is refused in one line,
    not read as empty, and never opened: opening a FIFO no one writes to would wait forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    again = "not a regular file: prepare reads its input more than once; save the text to a file and pass that"
    args = ["--name=bad", f"--data_dir={tmp_path / 'd'}"]
    for path, kind in [(fifo, "a pipe"), ("/dev/null", "a device")]:
        proc = run_script("data/prepare.py", f"--input={path}", *args, timeout=60)
        assert_one_error_line(proc.stderr, f"error: input {path} is {kind}, {again}")
    proc = subprocess.run([sys.executable, str(REPO / "data" / "prepare.py"), "--input=/dev/stdin", *args],
                          input=make_text(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: input /dev/stdin is a pipe, {again}")
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_cli_reads_stdin_redirected_from_a_file(tmp_path, corpus_file, corpus_text):
    with open(corpus_file, "rb") as stdin:
        check_ok(subprocess.run([sys.executable, str(REPO / "data" / "prepare.py"), "--input=/dev/stdin",
                                 "--name=piped", f"--data_dir={tmp_path / 'd'}"],
                                stdin=stdin, capture_output=True, text=True, timeout=60))
    out_dir = tmp_path / "d" / "piped"
    meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    assert "".join(decode_all(out_dir, meta)) == corpus_text


@pytest.mark.slow
def test_cli_success(tmp_path, corpus_file, corpus_text):
    proc = run_script("data/prepare.py", f"--input={corpus_file}", "--name=tiny", f"--data_dir={tmp_path / 'd'}",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    meta = json.loads((tmp_path / "d" / "tiny" / "meta.json").read_text(encoding="utf-8"))
    assert meta["train_tokens"] + meta["val_tokens"] == len(corpus_text)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A web server on 127.0.0.1 serving tmp_path/www, with the download URL pointed at it."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(www), **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(preparing, "SHAKESPEARE_URL", f"http://127.0.0.1:{httpd.server_port}/input.txt")
    yield www
    httpd.shutdown()
    httpd.server_close()


def test_download_is_checked_and_kept(server, tmp_path):
    real = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
    if not real.is_file():
        pytest.skip(f"no copy of tinyshakespeare at {real} to serve")
    (server / "input.txt").write_bytes(real.read_bytes())
    out_dir, meta = prepare(PrepareConfig(data_dir=str(tmp_path / "d")))
    assert (out_dir / "input.txt").read_bytes() == real.read_bytes()
    assert meta["vocab_size"] == 65 and meta["train_tokens"] + meta["val_tokens"] == 1_115_394
    (server / "input.txt").unlink()  # a second run uses the kept copy, never the network
    assert prepare(PrepareConfig(data_dir=str(tmp_path / "d")))[1] == meta


def test_download_failures_are_one_line(server, tmp_path, monkeypatch):
    data = tmp_path / "d"
    with pytest.raises(UserError, match=r"could not download tinyshakespeare \(File not found\); pass a local copy"):
        prepare(PrepareConfig(data_dir=str(data)))  # the server has no such file
    assert not data.exists()  # no folder that would tell train.py a dataset is there, nor the one it was to go in
    (server / "input.txt").write_text("not shakespeare\n", encoding="utf-8")
    with pytest.raises(UserError, match="is not the tinyshakespeare file .*; delete it and run again"):
        prepare(PrepareConfig(data_dir=str(data)))
    (data / "shakespeare_char" / "input.txt").unlink()
    monkeypatch.setattr(preparing, "SHAKESPEARE_URL", "http://127.0.0.1:9/input.txt")  # nothing listens there
    with pytest.raises(UserError, match=r"could not download tinyshakespeare \(.*refused\)"):
        prepare(PrepareConfig(data_dir=str(data)))


def test_the_default_dataset_prepared_from_a_copy_keeps_it_where_the_download_puts_it(tmp_path, monkeypatch,
                                                                                       corpus_file, capsys):
    """Offline (--input=PATH/input.txt): data/shakespeare_char/input.txt is there after, as online, for the chat
    lesson's --mix; of the same time, so that a prepare from it reads as the same text. Another text, or a file
    already there, is left alone."""
    monkeypatch.setattr(preparing, "SHAKESPEARE_SHA256", hashlib.sha256(corpus_file.read_bytes()).hexdigest())
    monkeypatch.setattr(preparing, "SHAKESPEARE_BYTES", corpus_file.stat().st_size)
    os.utime(corpus_file, (1_700_000_000, 1_700_000_000))
    data = tmp_path / "d"
    _, meta = prepare(PrepareConfig(input=str(corpus_file), data_dir=str(data)))
    kept = data / "shakespeare_char" / "input.txt"
    assert kept.read_bytes() == corpus_file.read_bytes() and kept.stat().st_mtime == 1_700_000_000
    assert f"kept a copy of {corpus_file} as {kept}" in capsys.readouterr().out
    assert prepare(PrepareConfig(data_dir=str(data)))[1]["train_tokens"] == meta["train_tokens"]  # the same text
    other = tmp_path / "other.txt"
    other.write_text("not the text the download gives\n" * 50, encoding="utf-8")
    prepare(PrepareConfig(input=str(other), name="mine", data_dir=str(data)))
    prepare(PrepareConfig(input=str(corpus_file), name="copy", data_dir=str(data)))
    assert not (data / "mine" / "input.txt").exists() and not (data / "copy" / "input.txt").exists()
    kept.write_text("the user's own\n", encoding="utf-8")
    prepare(PrepareConfig(input=str(corpus_file), data_dir=str(data), start_over=True))
    assert kept.read_text(encoding="utf-8") == "the user's own\n"


DOWNLOAD_FAILS = """import runpy, sys
sys.path.insert(0, {repo!r})
from gptkit.data import preparing
preparing.SHAKESPEARE_URL = "http://127.0.0.1:9/input.txt"  # nothing listens there
sys.argv = ["data/prepare.py", "--data_dir={data}"]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_a_failed_download_says_what_it_was_downloading_then_its_error_on_a_line_of_its_own(tmp_path):
    """stdout and stderr into one pipe, as `2>&1 | tee log` takes them (block-buffered): the download's line, then
    the error's, each whole."""
    driver = DOWNLOAD_FAILS.format(repo=str(REPO), data=tmp_path / "d", script=str(REPO / "data" / "prepare.py"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == "downloading http://127.0.0.1:9/input.txt" and len(lines) == 2, proc.stdout
    assert re.fullmatch(r"error: could not download tinyshakespeare \(.*refused\); pass a local copy .*", lines[1])


DRAW_STOPPED = """import os, runpy, signal, sys, time
sys.path.insert(0, {repo!r})
from gptkit.data import synthetic

def stopped(cfg):  # SIGTERM as the problems are drawn, before anything is written
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)

synthetic.SYNTHETIC["tasks"] = stopped
sys.argv = ["data/prepare.py", "--synthetic=tasks", "--data_dir={data}"]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_sigterm_while_a_synthetic_text_is_drawn_is_one_line_and_leaves_no_folder(tmp_path):
    """It ended the prepare as SIGTERM's default does: no line, and the dataset's lock left in a folder of its own."""
    driver = DRAW_STOPPED.format(repo=str(REPO), data=tmp_path / "d", script=str(REPO / "data" / "prepare.py"))
    proc = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert_one_error_line(proc.stderr, "error: stopped by SIGTERM while preparing; run the same command again to "
                                       "continue where this prepare stopped")
    assert not (tmp_path / "d" / "tasks").exists()


def test_the_download_is_written_whole_and_never_through_a_link(server, tmp_path, outside):
    (server / "input.txt").write_text("not shakespeare\n", encoding="utf-8")
    folder = tmp_path / "d" / "shakespeare_char"
    folder.mkdir(parents=True)
    (folder / "input.txt").symlink_to(tmp_path / "elsewhere" / "gone.txt")  # dangling: the download would go there
    with pytest.raises(UserError, match=f"^{folder / 'input.txt'} is a link, and the tool writes this file itself"):
        prepare(PrepareConfig(data_dir=str(tmp_path / "d")))
    assert (folder / "input.txt").is_symlink() and os.listdir(tmp_path / "elsewhere") == ["precious.txt"]


def test_name_must_be_plain(tmp_path, corpus_file):
    with pytest.raises(ValueError, match="name"):
        PrepareConfig(input=str(corpus_file), name="../escape")


def test_make_text_is_deterministic():
    assert make_text() == make_text() and len(make_text().encode()) >= 6000


def test_prepare_streams_text_without_line_breaks(tmp_path, monkeypatch):
    """Memory follows the chunk size, not the line length: a file with no newline at all is read in pieces of
    about CHUNK_BYTES, and the pieces put together are the text. Each piece's position is where reading starts
    again for the rest of the text (a stopped prepare continues from there)."""
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1000)
    text = "abcdefghij" * 5000 + " é" * 3000
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8")

    class Bar:
        def update(self, n):
            pass

    for cut in (len, preparing.bpe_cut):
        pieces = list(sources.read_text(path, 0, Bar(), cut))
        assert "".join(p for p, _, _ in pieces) == text and max(len(p) for p, _, _ in pieces) <= 2000
        assert [last for _, _, last in pieces] == [False] * (len(pieces) - 1) + [True]
        for i, (_, position, _) in enumerate(pieces[:-1]):
            rest = "".join(p for p, _, _ in sources.read_text(path, position, Bar(), cut))
            assert rest == "".join(p for p, _, _ in pieces[i + 1:])


def test_bpe_pieces_encode_to_the_tokens_of_the_whole(tiktoken_cache, monkeypatch):
    """Cut where bpe_cut says, the pieces encode to exactly the whole text's tokens, under the pre-tokenizer of
    every OpenAI encoding tiktoken knows (their patterns decide where pieces may end; r50k_base's merges stand
    in for the others', which are not cached here). The text mixes words, digits, punctuation before spaces and
    newlines, and runs of whitespace."""
    import tiktoken
    import tiktoken_ext.openai_public as openai_public

    r50k = tiktoken.get_encoding("r50k_base")  # GPT-2's, and the one cached here
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: r50k._mergeable_ranks)
    encodings = [tiktoken.Encoding(name, pat_str=make()["pat_str"], mergeable_ranks=r50k._mergeable_ranks,
                                   special_tokens={})  # gpt2 reads other files; r50k_base is it
                 for name, make in openai_public.ENCODING_CONSTRUCTORS.items() if name != "gpt2"]
    assert len({e._pat_str for e in encodings}) >= 3  # gpt2's, cl100k's and o200k's patterns at least
    text = make_text(20000, seed=3).replace(". ", ".  \n ") + "x1 2!\n\n  \t y's, (z)\r\n"
    pieces, rest = [], text
    while len(rest) > 500:
        at = preparing.bpe_cut(rest[:500]) or 500
        pieces.append(rest[:at])
        rest = rest[at:]
    pieces.append(rest)
    assert len(pieces) > 40
    for enc in encodings:
        assert sum((enc.encode_ordinary(p) for p in pieces), []) == enc.encode_ordinary(text), enc.name


def test_the_bpe_bar_fills_and_says_the_merges_are_learned_once_the_trainer_has_read_every_text():
    """A 50 MB corpus sat at 90% for half its training, the merges being learned with nothing said."""
    from gptkit.data.preparing import then_merging

    class Bar:
        n, total, postfix = 0, 10, ""

        def update(self, k):
            self.n += k

        def set_postfix_str(self, s):
            self.postfix = s

    bar = Bar()
    texts = then_merging(iter(["a", "b"]), bar)
    assert [next(texts), next(texts)] == ["a", "b"] and bar.postfix == ""
    assert list(texts) == [] and bar.n == 10 and bar.postfix == "read; learning the merges"
