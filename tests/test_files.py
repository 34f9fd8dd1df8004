"""gptkit/base/files.py: every file the tools keep whole in a run's folder or a dataset's is written by one function,
written_whole (aside, synced, renamed over its name), and a link at a file's name is refused in one line, never
written through."""

import errno
import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import train
from conftest import make_text, train_args
from gptkit.base import files
from gptkit.base.errors import UserError
from gptkit.base.files import link_in_place, write_whole, written_whole
from gptkit.machine.wisdom import Wisdom
from gptkit.run.checkpoint import load_checkpoint, save_checkpoint
from gptkit.run.metrics import not_rewritten, records_through

# what a run and a prepare write as they go rather than whole, and why: appended records, held locks, and token
# shards streamed to disk (gptkit/data/shards.py)
STREAMED = {"metrics.jsonl", "run.lock", ".prepare.lock", "train.bin", "val.bin"}


@pytest.fixture
def writes(monkeypatch):
    """The paths the one writer wrote whole, with the path each kept the file it replaced at (or None), in order;
    every caller looks it up in gptkit.base.files when it writes."""
    done, real = [], files.written_whole

    @contextmanager
    def recording(path, *args, **kwargs):
        with real(path, *args, **kwargs) as f:
            yield f
        done.append((Path(path), kwargs.get("previous")))

    monkeypatch.setattr(files, "written_whole", recording)
    return done


@pytest.mark.slow
def test_every_file_of_a_run_and_of_its_dataset_is_written_by_the_one_writer(tmp_path, writes):
    """A tiny dataset prepared and a tiny run trained on it (checkpoints, the state before the latest, snapshots):
    each file they leave, but those written as they go (STREAMED), went through written_whole. A dataset is made
    in a work folder, renamed whole into place: its files are found there by name."""
    from gptkit.data.preparing import PrepareConfig, prepare

    (tmp_path / "input.txt").write_text(make_text(), encoding="utf-8")
    data, out = tmp_path / "data", tmp_path / "out"
    prepare(PrepareConfig(input=str(tmp_path / "input.txt"), name="tiny", data_dir=str(data), workers=1))
    train.main(train_args(data, out, "--max_iters=4", "--eval_interval=2", "--eval_iters=1", "--log_interval=1",
                          "--snapshots=2"))
    written = {p for path, previous in writes for p in (path, previous) if p is not None}
    kept = sorted(p for p in out.rglob("*") if p.is_file() and p.name not in STREAMED)
    assert {"best.pt", "latest.pt", "latest.prev.pt"} <= {p.name for p in kept} and (out / "snapshots").is_dir()
    assert [p for p in kept if p not in written] == []
    dataset = [p for p in (data / "tiny").rglob("*") if p.is_file() and not p.is_symlink()]
    made = {path.name for path, _ in writes if data in path.parents}
    assert "meta.json" in made and [p for p in dataset if p.name not in STREAMED | made] == []


@pytest.mark.parametrize("caller", ["text", "bytes", "checkpoint"])
def test_a_link_at_the_name_is_refused_in_one_line_and_what_it_points_at_is_untouched(tmp_path, outside, caller):
    """Whoever writes, the link the user put at the name is left as it is, and so is the file it points at."""
    path = tmp_path / "kept.file"
    path.symlink_to(outside)
    write = {"text": lambda: write_whole(path, "new\n"), "bytes": lambda: write_whole(path, b"new\n"),
             "checkpoint": lambda: save_checkpoint({"iter_num": 1}, path, previous=tmp_path / "kept.prev")}[caller]
    with pytest.raises(UserError) as e:
        write()
    assert str(e.value) == link_in_place(path) and "\n" not in str(e.value)
    assert path.is_symlink() and outside.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "kept.file"]


def test_a_link_at_the_wisdom_cache_is_a_note_and_what_it_points_at_is_untouched(tmp_path, outside):
    """The wisdom cache is a convenience: a run whose entries cannot be kept goes on, with one note saying why."""
    wisdom = Wisdom("cpu", 1, tmp_path)
    (tmp_path / "wisdom.json").symlink_to(outside)  # made by the time it keeps what it measured
    wisdom.keep("shape", {"params": 1, "measured": "today"})
    assert outside.read_text() == "precious\n" and len(wisdom.notes) == 1
    assert "could not keep this machine's wisdom" in wisdom.notes[0] and "is a link" in wisdom.notes[0]


def test_the_file_replaced_is_kept_as_previous_where_asked(tmp_path):
    path, previous = tmp_path / "latest.pt", tmp_path / "latest.prev.pt"
    save_checkpoint({"iter_num": 1}, path, previous=previous)
    assert not previous.exists()
    save_checkpoint({"iter_num": 2}, path, previous=previous)
    assert load_checkpoint(path)["iter_num"] == 2 and load_checkpoint(previous)["iter_num"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.prev.pt", "latest.pt"]


@pytest.mark.parametrize("failed,message", [(None, "could not write {} (disk full); it is as it was"),
                                            (not_rewritten, "disk full while rewriting {}; it is as it was")])
def test_a_failed_write_leaves_the_file_as_it_was_and_says_so_in_the_callers_words(tmp_path, monkeypatch, failed,
                                                                                     message):
    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(UserError) as e:
        write_whole(path, "new\n", failed=failed)
    assert str(e.value) == message.format(path)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_a_file_where_a_folder_goes_is_named_as_such_not_as_a_permission(tmp_path):
    """analyze.py features writes into out/sae: with a file of that name in the way, the line says so."""
    from gptkit.base.files import writable

    (tmp_path / "sae").write_text("in the way")
    with pytest.raises(UserError) as e:
        writable(tmp_path / "sae" / "cfg.json")
    assert str(e.value) == (f"cannot write {tmp_path / 'sae' / 'cfg.json'}: {tmp_path / 'sae'} is a file where a "
                            "folder goes; move it out of the way")


def test_a_shared_file_is_written_aside_under_this_process_own_name(tmp_path):
    """Files no lock keeps to one writer (the wisdom cache): another process's temporary file is never this one's."""
    path = tmp_path / "wisdom.json"
    with written_whole(path, shared=True) as f:
        assert Path(f.name).name == f".wisdom.json.{os.getpid()}.tmp"
        f.write("{}")
    assert path.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["wisdom.json"]


def test_metrics_rewritten_for_a_resume_go_through_the_one_writer(tmp_path, writes):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "train", "iter": i, "loss": 1.0}) + "\n" for i in range(4)))
    assert records_through(path, 1) == (2, False)
    assert writes == [(path, None)] and [json.loads(line)["iter"] for line in path.read_text().splitlines()] == [0, 1]


def test_a_checkpoint_saved_goes_through_the_one_writer(tmp_path, writes):
    save_checkpoint({"w": torch.ones(2)}, tmp_path / "best.pt")
    assert writes == [(tmp_path / "best.pt", None)] and torch.equal(load_checkpoint(tmp_path / "best.pt")["w"],
                                                                     torch.ones(2))
