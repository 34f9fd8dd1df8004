"""Corpora of records: JSON Lines (plain, gzip, zstd) and Parquet, split by document hash, written as shards,
read back as one stream in flat memory, prepared again from where a stopped prepare left off, and every kind
of bad input one line that names the file and the line or row."""

import gzip
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard

from benchmarks.prepare_cost import tree_rss
from conftest import REPO, assert_one_error_line, check_ok, make_text, run_script
from gptkit.base.errors import UserError
from gptkit.data import preparing, sources
from gptkit.data.dataset import Split, TrainingData, load_meta
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.data.sources import in_val
from gptkit.data.tokenizer import tokenizer_from_meta

DOCS = [doc.strip() for doc in make_text(60_000, seed=3).split("\n\n") if doc.strip()]  # ~1,900 small documents


def write_jsonl(path, docs, field="text"):
    lines = "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode("utf-8")
    if path.name.endswith(".gz"):
        lines = gzip.compress(lines)
    elif path.name.endswith(".zst"):
        lines = zstandard.ZstdCompressor().compress(lines)
    path.write_bytes(lines)
    return path


def write_parquet(path, docs, row_group_size=100):
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path, row_group_size=row_group_size)
    return path


def mixed_corpus(folder):
    """A folder of every kind, each holding its own share of DOCS, and the documents in order."""
    folder.mkdir(parents=True, exist_ok=True)
    q = len(DOCS) // 4
    write_jsonl(folder / "a.jsonl", DOCS[:q])
    write_jsonl(folder / "b.jsonl.gz", DOCS[q:2 * q])
    write_jsonl(folder / "c.jsonl.zst", DOCS[2 * q:3 * q])
    write_parquet(folder / "d.parquet", DOCS[3 * q:])
    return folder


def read_split(out_dir, meta, split):
    """A split's tokens, its shards joined in order."""
    return np.concatenate([np.fromfile(out_dir / s["file"], dtype=meta["dtype"]) for s in meta[f"{split}_shards"]])


def documents(out_dir, meta, split):
    """The documents a split holds, cut at the separator prepare puts after each."""
    tok = tokenizer_from_meta(meta)
    text = tok.decode(read_split(out_dir, meta, split).tolist())
    return text.split("<|endoftext|>" if meta["tokenizer"] != "char" else preparing.CHAR_SEPARATOR)[:-1]


def tokenizer_settings(tokenizer):
    """PrepareConfig's settings for a tokenizer: a trained BPE needs its size."""
    return {"tokenizer": tokenizer, **({"vocab_size": 300} if tokenizer == "bpe" else {})}


@pytest.mark.parametrize("tokenizer", ["char", "r50k_base", "bpe"])
def test_every_record_kind_prepares_each_document_once_split_by_its_hash(tmp_path, tokenizer, request):
    if tokenizer == "r50k_base":
        request.getfixturevalue("tiktoken_cache")
    src = mixed_corpus(tmp_path / "src")
    out_dir, meta = prepare(PrepareConfig(input=str(src), name="mix", data_dir=str(tmp_path / "d"), shard_tokens=5000,
                                          **tokenizer_settings(tokenizer)))
    train, val = documents(out_dir, meta, "train"), documents(out_dir, meta, "val")
    assert sorted(train + val) == sorted(DOCS)
    assert set(val) == {d for d in DOCS if in_val(d.encode(), 0.1)}
    assert 0.05 < len(val) / len(DOCS) < 0.15 and meta["val_documents"] == len(val)
    assert meta["split"] == "by document" and meta["documents"] == len(DOCS)
    assert len(meta["train_shards"]) > 1 and all(s["tokens"] <= 5000 for s in meta["train_shards"])
    assert [s["path"] for s in meta["sources"]] == [str(p) for p in sorted(src.iterdir())]


def test_adding_files_moves_no_document_between_splits(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", DOCS[:900])
    out_dir, meta = prepare(PrepareConfig(input=str(src), name="a", data_dir=str(tmp_path / "d")))
    before = set(documents(out_dir, meta, "val"))
    write_jsonl(src / "0.jsonl", DOCS[900:])  # read first: every document of a.jsonl comes later now
    out_dir, meta = prepare(PrepareConfig(input=str(src), name="b", data_dir=str(tmp_path / "d")))
    assert before <= set(documents(out_dir, meta, "val"))


def test_shards_read_as_the_stream_a_single_file_holds(tmp_path):
    """The same corpus in one file per split and in shards of 1,000 tokens: every window, including those that
    cross from one shard into the next, and every sampled batch are the same."""
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS[:600])
    whole = prepare(PrepareConfig(input=str(src), name="whole", data_dir=str(tmp_path / "d")))
    sharded = prepare(PrepareConfig(input=str(src), name="sharded", data_dir=str(tmp_path / "d"), shard_tokens=1000))
    assert len(sharded[1]["train_shards"]) > 10 and len(whole[1]["train_shards"]) == 1
    opened = [TrainingData(*load_meta(str(tmp_path / "d"), name), 64, 8, 2, 0, "cpu") for name in ("whole", "sharded")]
    split = opened[1].splits["train"]
    crossing = torch.tensor([1000 * k - d for k in range(1, 9) for d in (1, 30, 64)])
    for a, b in zip(opened[0].splits["train"].batch(crossing, "cpu"), split.batch(crossing, "cpu")):
        assert torch.equal(a, b)
    stream = torch.from_numpy(read_split(sharded[0], sharded[1], "train").astype(np.int64))
    x, y = split.batch(crossing, "cpu")
    assert torch.equal(x[5], stream[crossing[5]:crossing[5] + 64]) and torch.equal(y[5], stream[crossing[5] + 1:][:64])
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(opened[0].sampler.next(), opened[1].sampler.next()))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads resident memory from /proc")
def test_reading_every_shard_keeps_resident_memory_flat(tmp_path):
    """96 MB of shards read from end to end: resident memory grows by a small fraction of that (a memmap kept
    open would grow it by all of it)."""
    folder, n = tmp_path / "d", 16 << 20
    folder.mkdir()
    shards = []
    for k in range(3):
        tokens = (np.arange(n, dtype=np.uint32) * (k + 1) % 50_000).astype(np.uint16)
        tokens.tofile(folder / f"train_{k:03d}.bin")
        shards.append({"file": f"train_{k:03d}.bin", "tokens": n, "sha256": None})
    meta = {"dtype": "uint16", "vocab_size": 50_000, "train_shards": shards}
    split = Split(folder, "train", meta, 4096)
    before = tree_rss(os.getpid())
    for start in range(0, split.length - 4097, 64 * 4096):
        split.batch(torch.arange(start, start + 64 * 4096, 4096).clamp(max=split.length - 4097), "cpu")
    assert tree_rss(os.getpid()) - before < 24 << 20


@pytest.mark.slow
def test_a_shard_missing_or_damaged_is_one_line_before_training(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS[:600])
    out_dir, meta = prepare(PrepareConfig(input=str(src), name="s", data_dir=str(tmp_path / "d"), shard_tokens=5000))
    shard = out_dir / meta["train_shards"][2]["file"]
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"train_002\.bin is damaged: its contents do not match the checksum"):
        TrainingData(*load_meta(str(tmp_path / "d"), "s"), 16, 4, 1, 0, "cpu")
    os.unlink(os.path.realpath(shard))
    proc = run_script("train.py", f"--data_dir={tmp_path / 'd'}", "--dataset=s", f"--out_dir={tmp_path / 'o'}")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {shard} not found; run data/prepare.py for this dataset again")


# prepare in a process of its own that, when it finishes shard N, dies (os._exit, as SIGKILL: no clean-up) or
# sends itself SIGTERM; with small batches, so that states are saved between shards. N = 0 runs through.
STOP_AT_SHARD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from gptkit.data import preparing, shards
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.base.errors import run_main

preparing.BATCH_CHARS, at, how, closed = 2000, int(sys.argv[1]), sys.argv[6], [0]
close = shards.ShardWriter.close_shard


def stopping(self):
    close(self)
    closed[0] += 1
    if closed[0] == at:
        os._exit(86) if how == "kill" else os.kill(os.getpid(), signal.SIGTERM)


shards.ShardWriter.close_shard = stopping
run_main(lambda: prepare(PrepareConfig(input=sys.argv[2], name="s", data_dir=sys.argv[3], tokenizer=sys.argv[4],
                                       shard_tokens=3000, workers=int(sys.argv[5]),
                                       vocab_size=300 if sys.argv[4] == "bpe" else 0)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer,workers,how", [("char", 1, "kill"), ("r50k_base", 2, "kill"),
                                                   ("r50k_base", 2, "SIGTERM"), ("bpe", 2, "kill")])
def test_a_stopped_prepare_continues_to_the_same_dataset(tmp_path, tokenizer, workers, how, request):
    """Stopped at a few points, and the same command run again: every token file is the one a prepare that was
    never stopped writes. A stopped prepare leaves no dataset a run would accept, and no worker behind. A trained
    tokenizer is not trained again: the one the stopped prepare saved is used, checked by its checksum."""
    if tokenizer == "r50k_base":
        request.getfixturevalue("tiktoken_cache")
    src = mixed_corpus(tmp_path / "src")
    script = tmp_path / "stop_at_shard.py"
    script.write_text(STOP_AT_SHARD.format(repo=str(REPO)), encoding="utf-8")

    def run(at, data_dir):  # a worker left behind would hold the pipes open past the timeout
        return subprocess.run([sys.executable, str(script), str(at), str(src), str(data_dir), tokenizer, str(workers),
                               how], capture_output=True, text=True, timeout=60)

    check_ok(run(0, tmp_path / "whole"))
    whole = (tmp_path / "whole" / "s").resolve()
    for at in (2, 5):
        data_dir = tmp_path / f"stopped-{at}"
        proc = run(at, data_dir)
        if how == "kill":
            assert proc.returncode == 86
        else:
            assert proc.returncode == 128 + signal.SIGTERM
            assert_one_error_line(proc.stderr, "error: stopped by SIGTERM while preparing; run the same command "
                                               "again to continue where this prepare stopped")
        assert not (data_dir / "s" / "meta.json").exists()
        proc = check_ok(run_script("data/prepare.py", f"--input={src}", "--name=s", f"--data_dir={data_dir}",
                                   f"--tokenizer={tokenizer}", "--shard_tokens=3000", f"--workers={workers}",
                                   *(["--vocab_size=300"] if tokenizer == "bpe" else [])))
        assert "continuing the prepare that was stopped" in proc.stdout
        assert "training a 300-token BPE" not in proc.stderr
        names = sorted(n for n in os.listdir(whole) if n.endswith(".bin"))
        assert names == sorted(n for n in os.listdir(data_dir / "s") if n.endswith(".bin"))
        for name in names + (["tokenizer.json"] if tokenizer == "bpe" else []):
            assert (data_dir / "s" / name).read_bytes() == (whole / name).read_bytes(), name


@pytest.mark.slow
def whole_and_stopped(tmp_path, tokenizer):
    """A corpus prepared whole (into tmp_path/whole) and killed at its third shard (tmp_path/stopped): its folder."""
    src = mixed_corpus(tmp_path / "src")
    script = tmp_path / "stop_at_shard.py"
    script.write_text(STOP_AT_SHARD.format(repo=str(REPO)), encoding="utf-8")
    for at, data_dir in ((0, tmp_path / "whole"), (3, tmp_path / "stopped")):
        subprocess.run([sys.executable, str(script), str(at), str(src), str(data_dir), tokenizer, "1", "kill"],
                       capture_output=True, text=True, timeout=60)
    return src


def test_a_stopped_prepare_whose_tokenizer_file_changed_starts_again(tmp_path):
    """The token files a stopped prepare wrote came from its tokenizer: with that file edited, none of them is
    kept, and the dataset is the one a prepare never stopped writes."""
    src = whole_and_stopped(tmp_path, "bpe")
    saved = next((tmp_path / "stopped" / "s").glob(".versions/work-*/tokenizer.json"))
    saved.write_text(saved.read_text(encoding="utf-8").replace("[32,", "[33,", 1), encoding="utf-8")
    proc = check_ok(run_script("data/prepare.py", f"--input={src}", "--name=s", f"--data_dir={tmp_path / 'stopped'}",
                               "--tokenizer=bpe", "--vocab_size=300", "--shard_tokens=3000", "--workers=1"))
    assert ("the stopped prepare's tokenizer.json is missing or does not match its checksum; starting again"
            in proc.stdout)
    whole = (tmp_path / "whole" / "s").resolve()
    for name in sorted(n for n in os.listdir(whole) if n.endswith((".bin", ".json")) and n != "meta.json"):
        assert (tmp_path / "stopped" / "s" / name).read_bytes() == (whole / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["{", '{"vocab": 5, "position": "x"}', "[1]", "\udcff"],
                         ids=["cut short", "fields of other kinds", "a list", "not UTF-8"])
def test_a_stopped_prepare_whose_saved_state_is_damaged_starts_again(tmp_path, damage):
    """The state a stopped prepare saved, damaged: one line says it starts again, and the dataset is the one a
    prepare never stopped writes."""
    src = whole_and_stopped(tmp_path, "char")
    saved = next((tmp_path / "stopped" / "s").glob(".versions/work-*/state.json"))
    saved.write_bytes(damage.encode("utf-8", "surrogateescape"))
    proc = check_ok(run_script("data/prepare.py", f"--input={src}", "--name=s", f"--data_dir={tmp_path / 'stopped'}",
                               "--shard_tokens=3000", "--workers=1"))
    assert "the stopped prepare's saved state is damaged; starting again" in proc.stdout
    whole = (tmp_path / "whole" / "s").resolve()
    for name in sorted(n for n in os.listdir(whole) if n.endswith(".bin")):
        assert (tmp_path / "stopped" / "s" / name).read_bytes() == (whole / name).read_bytes(), name


def interrupt_at_the_fourth_shard(monkeypatch):
    """Ctrl-C as the fourth shard is closed, once written (prepare's shards are its saved state); returns the real
    close_shard, to put back."""
    real_close, closed = preparing.ShardWriter.close_shard, [0]

    def interrupted(self):
        real_close(self)
        closed[0] += 1
        if closed[0] == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(preparing.ShardWriter, "close_shard", interrupted)
    return real_close


def test_ctrl_c_keeps_the_work_and_says_how_to_continue(tmp_path, monkeypatch):
    src = mixed_corpus(tmp_path / "src")
    monkeypatch.setattr(preparing, "BATCH_CHARS", 2000)
    real_close = interrupt_at_the_fourth_shard(monkeypatch)
    cfg = PrepareConfig(input=str(src), name="s", data_dir=str(tmp_path / "d"), shard_tokens=3000, workers=1)
    with pytest.raises(UserError) as e:
        prepare(cfg)
    assert e.value.exit_code == 128 + signal.SIGINT
    assert str(e.value) == "interrupted; run the same command again to continue where this prepare stopped"
    work = [p for p in (tmp_path / "d" / "s" / ".versions").iterdir() if p.name.startswith("work-")]
    assert len(work) == 1 and (work[0] / "state.json").is_file()
    monkeypatch.setattr(preparing.ShardWriter, "close_shard", real_close)
    out_dir, meta = prepare(cfg)
    assert sorted(documents(out_dir, meta, "train") + documents(out_dir, meta, "val")) == sorted(DOCS)
    assert [p.name for p in (tmp_path / "d" / "s" / ".versions").iterdir() if p.name.startswith("work-")] == []


def test_a_stopped_prepare_that_replaces_another_dataset_continues_and_the_old_one_stays_till_then(tmp_path,
                                                                                                   monkeypatch,
                                                                                                   capsys):
    """Replacing a dataset another split made takes --start_over=True, and a prepare given it that was stopped
    continues with the same command; the one without it is refused, the stopped work kept for it."""
    src = mixed_corpus(tmp_path / "src")
    data_dir = str(tmp_path / "d")
    prepare(PrepareConfig(input=str(src), name="s", data_dir=data_dir, shard_tokens=3000, workers=1))
    monkeypatch.setattr(preparing, "BATCH_CHARS", 2000)
    real_close = interrupt_at_the_fourth_shard(monkeypatch)
    again = dict(input=str(src), name="s", data_dir=data_dir, val_fraction=0.2, shard_tokens=3000, workers=1)
    with pytest.raises(UserError, match="^interrupted; run the same command again"):
        prepare(PrepareConfig(**again, start_over=True))
    monkeypatch.setattr(preparing.ShardWriter, "close_shard", real_close)
    assert load_meta(data_dir, "s")[1]["val_fraction"] == 0.1  # the old dataset, whole, until the new one is
    with pytest.raises(UserError, match="holds a dataset made with --val_fraction=0.1; prepare this one under"):
        prepare(PrepareConfig(**again))
    capsys.readouterr()
    out_dir, meta = prepare(PrepareConfig(**again, start_over=True))
    assert "continuing the prepare that was stopped" in capsys.readouterr().out
    assert meta["val_fraction"] == 0.2 and load_meta(data_dir, "s")[1] == meta
    assert sorted(documents(out_dir, meta, "train") + documents(out_dir, meta, "val")) == sorted(DOCS)


def test_records_read_from_another_field_are_other_text(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d, "title": d[:20]}) + "\n" for d in DOCS[:300]), encoding="utf-8")
    prepare(PrepareConfig(input=str(src), name="s", data_dir=str(tmp_path / "d")))
    with pytest.raises(UserError, match="holds a dataset made with --text_field=text; prepare this one under"):
        prepare(PrepareConfig(input=str(src), name="s", data_dir=str(tmp_path / "d"), text_field="title"))


BAD_LINES = {
    "malformed": (b'{"text": "fine"}\n{"text": "cut sh\n', "2: not valid JSON"),
    "missing field": (b'{"text": "fine"}\n{"body": "no text field"}\n', "2: no text in field 'text'"),
    "not a string": (b'{"text": "fine"}\n{"text": 42}\n', "2: field 'text' holds int, not text"),
    "not an object": (b'{"text": "fine"}\n["a list"]\n', "2: the line is not a JSON object"),
    "invalid utf-8": (b'{"text": "fine"}\n{"text": "caf\xe9"}\n', "2: not UTF-8 text (byte 0xe9)"),
    "utf-16": (b'{"text": "fine"}\n\xff\xfe{\x00}\x00\n', "2: not UTF-8 text (byte 0xff)"),  # a BOM and "{}"
    "lone surrogate": (b'{"text": "fine"}\n{"text": "\\ud800"}\n', "2: the text is not valid Unicode"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_LINES)
def test_a_bad_record_names_its_file_and_line_and_skip_bad_counts_it(tmp_path, case):
    content, what = BAD_LINES[case]
    path = tmp_path / "docs.jsonl"
    path.write_bytes(content + "".join(json.dumps({"text": d}) + "\n" for d in DOCS[:300]).encode())
    proc = run_script("data/prepare.py", f"--input={path}", "--name=bad", f"--data_dir={tmp_path / 'd'}")
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, f"error: {path}:{what}*")
    assert not (tmp_path / "d").exists()  # nothing half-written left behind, not even the folder it made for it
    proc = check_ok(run_script("data/prepare.py", f"--input={path}", "--name=bad", f"--data_dir={tmp_path / 'd'}",
                               "--skip_bad=True"))
    assert "skipped 0 empty and 1 bad" in proc.stdout


@pytest.mark.parametrize("skip_bad", [False, True])
def test_conversations_in_a_folder_are_one_line_saying_a_chat_file_is_prepared_alone(tmp_path, skip_bad):
    """A chat .jsonl beside other files was read as records without text, and --skip_bad, which the line suggested,
    skipped every one of them."""
    folder = tmp_path / "chats"
    folder.mkdir()
    turn = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}
    (folder / "a.jsonl").write_text(json.dumps(turn) + "\n", encoding="utf-8")
    (folder / "b.txt").write_text(DOCS[0], encoding="utf-8")
    with pytest.raises(UserError) as e:
        prepare(PrepareConfig(input=str(folder), name="c", data_dir=str(tmp_path / "d"), skip_bad=skip_bad))
    assert str(e.value) == (f"{folder / 'a.jsonl'}:1: a conversation ({{\"messages\": [...]}}), not a record of "
                            "text; a chat dataset is prepared from one .jsonl file of conversations, given alone as "
                            "--input")


@pytest.mark.parametrize("tokenizer", ["char", "r50k_base"])
@pytest.mark.parametrize("skip_bad", [False, True])
def test_a_null_parquet_text_is_one_line_or_skipped_whatever_the_tokenizer(tmp_path, tokenizer, skip_bad, request):
    """A Parquet row whose text is null: one line naming its row, or with --skip_bad counted as bad, for a tokenizer
    with no vocabulary pass before the tokens too (the null reached the batching as a text of no length)."""
    if tokenizer == "r50k_base":
        request.getfixturevalue("tiktoken_cache")
    path = write_parquet(tmp_path / "t.parquet", [*DOCS[:150], None, *DOCS[150:300], None])
    cfg = PrepareConfig(input=str(path), name="n", data_dir=str(tmp_path / "d"), tokenizer=tokenizer, skip_bad=skip_bad)
    if not skip_bad:
        with pytest.raises(UserError, match=r"t\.parquet: row 151: no text in field 'text' \(pass --skip_bad"):
            prepare(cfg)
        return
    out_dir, meta = prepare(cfg)
    assert meta["skipped"] == {"empty": 0, "bad": 2} and meta["documents"] == 300
    assert sorted(documents(out_dir, meta, "train") + documents(out_dir, meta, "val")) == sorted(DOCS[:300])


def test_empty_documents_are_skipped_and_counted(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": ""}) + "\n\n" + "".join(json.dumps({"text": d}) + "\n" for d in DOCS[:300]))
    out_dir, meta = prepare(PrepareConfig(input=str(path), name="e", data_dir=str(tmp_path / "d")))
    assert meta["skipped"] == {"empty": 1, "bad": 0} and meta["documents"] == 300


def damaged_gzip(path, cut):
    data = bytearray(gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in DOCS).encode()))
    if cut:
        del data[-10:]
    else:
        data[len(data) // 2:len(data) // 2 + 8] = b"garbage!"
    path.write_bytes(bytes(data))


BAD_FILES = {
    "parquet without the column": (
        "t.parquet", lambda p: pq.write_table(pa.table({"body": ["x"]}), p),
        "error: {p} has no column 'text' (its columns: body); name the text column with --text_field"),
    "parquet column not text": (
        "t.parquet", lambda p: pq.write_table(pa.table({"text": [1, 2]}), p),
        "error: column 'text' of {p} holds int64, not text"),
    "not parquet": ("t.parquet", lambda p: p.write_bytes(b"PAR1 but not really"), "error: could not read {p} as Parquet*"),
    "null in parquet": ("t.parquet", lambda p: pq.write_table(pa.table({"text": ["a", None]}), p),
                        "error: {p}: row 2: no text in field 'text' (pass --skip_bad to skip such records)"),
    "gzip cut short": ("t.jsonl.gz", lambda p: damaged_gzip(p, True), "error: could not read {p}: damaged or cut short*"),
    # damage inside deflated data may first come out as bytes that are not JSON, before gzip's check sees it
    "gzip damaged": ("t.jsonl.gz", lambda p: damaged_gzip(p, False), "error: *"),
    "zstd cut short": ("t.jsonl.zst", lambda p: p.write_bytes(write_jsonl(p, DOCS).read_bytes()[:-3]),
                     "error: could not read {p}: damaged or cut short*"),
    "no documents": ("t.jsonl", lambda p: p.write_text('{"text": ""}\n\n'),
                     "error: input {p} holds no documents (1 empty, 0 skipped as bad)"),
    "empty file": ("t.jsonl", lambda p: p.write_bytes(b""), "error: input {p} is empty"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_one_line_and_leaves_nothing(tmp_path, case):
    name, make, expected = BAD_FILES[case]
    path = tmp_path / name
    make(path)
    proc = run_script("data/prepare.py", f"--input={path}", "--name=bad", f"--data_dir={tmp_path / 'd'}")
    assert proc.returncode == 1
    assert str(path) in assert_one_error_line(proc.stderr, expected.format(p=path))
    assert not (tmp_path / "d").exists()


def test_too_few_documents_for_a_split_by_document(tmp_path):
    path = write_jsonl(tmp_path / "few.jsonl", ["one document", "and a second"])
    with pytest.raises(UserError, match="none of the 2 documents of .* fell in the val split"):
        prepare(PrepareConfig(input=str(path), name="few", data_dir=str(tmp_path / "d")))


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """Files may grow to 64 KiB only (RLIMIT_FSIZE), as on a disk that fills up during the prepare."""
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    limited = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16)); "
               f"sys.argv = ['data/prepare.py', '--input={src}', '--name=full', '--data_dir={tmp_path / 'd'}']; "
               "runpy.run_path('data/prepare.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", limited], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr, "error: could not write the dataset to *")
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_train_and_sample_on_a_sharded_record_corpus(tmp_path):
    """From the command line, as a user would: a folder of every record kind, prepared into shards, trained on
    and sampled from."""
    src = mixed_corpus(tmp_path / "src")
    check_ok(run_script("data/prepare.py", f"--input={src}", "--name=mix", f"--data_dir={tmp_path / 'd'}",
                        "--shard_tokens=50000"))
    out = tmp_path / "out"
    check_ok(run_script("train.py", f"--data_dir={tmp_path / 'd'}", "--dataset=mix", f"--out_dir={out}",
                        "--device=cpu", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32",
                        "--block_size=32", "--batch_size=4", "--max_iters=4", "--eval_interval=2", "--eval_iters=1",
                        "--final_eval_tokens=2000", "--max_time=0", "--compile=False"))
    final = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["kind"] == "final" and final["val_loss"] < 5
    proc = check_ok(run_script("sample.py", f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=20",
                               "--start=The"))
    assert proc.stdout.strip()


@pytest.mark.parametrize("tokenizer", ["char", "r50k_base", "bpe"])
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_long_record_is_tokenized_in_pieces_to_the_tokens_of_the_whole(tmp_path, monkeypatch, request, tokenizer,
                                                                         kind):
    """A record longer than LONG_RECORD (here 2,000 characters) is read in pieces of CHUNK_BYTES (here 1,000),
    cut where the tokenizer cannot merge across: the dataset is the one its whole text gives (a trained BPE is
    trained on the pieces too, and learns the same merges)."""
    if tokenizer == "r50k_base":
        request.getfixturevalue("tiktoken_cache")
    long_doc = make_text(30000, seed=5).replace("\n", " ")
    docs = DOCS[:200] + [long_doc] + DOCS[200:400]
    src = (write_jsonl if kind == "jsonl" else write_parquet)(tmp_path / f"docs.{kind}", docs)

    def dataset(name):
        out_dir, meta = prepare(PrepareConfig(input=str(src), name=name, workers=1, data_dir=str(tmp_path / "d"),
                                              **tokenizer_settings(tokenizer)))
        return [read_split(out_dir, meta, split) for split in ("train", "val")], meta

    whole, meta = dataset("whole")
    cut = []
    monkeypatch.setattr(sources, "LONG_RECORD", 2000)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(sources.Reader, "long_record", lambda self, *a, f=sources.Reader.long_record: (
        piece for piece in f(self, *a) if not cut.append(piece)))
    pieces, pieced_meta = dataset("pieces")
    assert len(cut) >= 30 and all(len(piece.text) <= 1000 for piece in cut)
    assert all(np.array_equal(a, b) for a, b in zip(pieces, whole))
    assert pieced_meta["documents"] == meta["documents"] == len(docs)
