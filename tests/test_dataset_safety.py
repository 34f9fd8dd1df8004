"""A dataset is replaced as a whole, by one prepare at a time, and a run whose dataset changes under it stops with
one line: prepare killed at every step that changes a name on disk, a held lock, a reader whose files change."""

import fcntl
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, assert_one_error_line, check_ok, make_text, run_script
from gptkit.corpus import PrepareConfig, prepare
from gptkit.dataset_folder import LOCK, OUTPUTS
from gptkit.dataset import Split, TrainingData, load_meta
from gptkit.errors import UserError

KILLED = 86  # the exit status of a prepare that the script below killed

# prepare in a process of its own that dies at the Nth call changing a name on disk, by os._exit: no `finally`,
# no clean-up, as under SIGKILL. With N = 0 it runs through and prints how many such calls it made.
KILL_AT_STEP = """
import os, shutil, sys
sys.path.insert(0, {repo!r})
from gptkit.corpus import PrepareConfig, prepare

at, calls = int(sys.argv[1]), [0]


def dying(f):
    def step(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            os._exit({killed})
        return f(*args, **kwargs)
    return step


for name in ("replace", "rename", "symlink", "link", "unlink", "mkdir", "rmdir"):
    setattr(os, name, dying(getattr(os, name)))
shutil.rmtree = dying(shutil.rmtree)
prepare(PrepareConfig(input=sys.argv[2], name="tiny", data_dir=sys.argv[3]))
print(calls[0])
"""

# what a dataset folder holds after a prepare: the names readers open, and what replaces them as a whole
FOLDER = {*OUTPUTS, ".current", ".versions", LOCK}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """(old, new): the text of the dataset there before, and of the one a prepare replaces it with."""
    folder = tmp_path_factory.mktemp("texts")
    old, new = folder / "old.txt", folder / "new.txt"
    old.write_text(make_text(9000, seed=1), encoding="utf-8")
    new.write_text(make_text(5000, seed=2), encoding="utf-8")
    return old, new


def prepared(text, data_dir):
    prepare(PrepareConfig(input=str(text), name="tiny", data_dir=str(data_dir)))
    return data_dir


def found(data_dir):
    """What a reader finds at the dataset's three names: their bytes, or None where none of them is there."""
    paths = [data_dir / "tiny" / name for name in OUTPUTS]
    there = tuple(path.read_bytes() for path in paths if path.exists())
    return there or None


def opens(data_dir):
    """Open the dataset as train.py does: metadata, then both splits checked in full."""
    folder, meta = load_meta(str(data_dir), "tiny")
    return TrainingData(folder, meta, 16, 4, 1, 0, "cpu")


def assert_tidy(data_dir):
    folder = data_dir / "tiny"
    assert set(os.listdir(folder)) == FOLDER
    assert len(os.listdir(folder / ".versions")) == 1


def as_plain_files(data_dir):
    """The dataset as a prepare before versions wrote it: three plain files in the folder."""
    folder = data_dir / "tiny"
    contents = found(data_dir)
    shutil.rmtree(folder)
    folder.mkdir()
    for name, data in zip(OUTPUTS, contents):
        (folder / name).write_bytes(data)
    return data_dir


@pytest.mark.parametrize("before", ["versions", "plain files", "none"])
def test_prepare_killed_at_any_step_leaves_the_old_dataset_or_the_new(tmp_path, texts, before):
    old_text, new_text = texts
    new = found(prepared(new_text, tmp_path / "reference"))
    pristine = tmp_path / "before"
    if before != "none":
        prepared(old_text, pristine)
    if before == "plain files":
        as_plain_files(pristine)
    old = found(pristine)
    script = tmp_path / "kill_at_step.py"
    script.write_text(KILL_AT_STEP.format(repo=str(REPO), killed=KILLED), encoding="utf-8")

    def run(at, data_dir):
        if pristine.exists():
            shutil.copytree(pristine, data_dir, symlinks=True)
        return subprocess.run([sys.executable, str(script), str(at), str(new_text), str(data_dir)],
                              capture_output=True, text=True, timeout=60)

    steps = int(check_ok(run(0, tmp_path / "whole")).stdout)
    assert found(tmp_path / "whole") == new
    seen = set()
    for at in range(1, steps + 1):
        data_dir = tmp_path / f"killed-{at}"
        proc = run(at, data_dir)
        assert proc.returncode == KILLED, proc.stderr
        there = found(data_dir)
        assert there in (old, new), f"killed at step {at} of {steps}: neither the old dataset nor the new one"
        seen.add("old" if there == old else "new")
        if there is None:
            with pytest.raises(UserError, match="not found"):
                opens(data_dir)
        else:
            opens(data_dir)
        prepared(new_text, data_dir)  # the next prepare finishes the job and clears what the killed one left
        assert found(data_dir) == new
        assert_tidy(data_dir)
    # with no dataset before, nothing changes a name once the new one is in place
    assert seen == ({"old", "new"} if before != "none" else {"old"}), "no kill fell on one side of the commit"


def test_failed_prepare_keeps_the_dataset_and_leaves_nothing(tmp_path, texts):
    data_dir = prepared(texts[0], tmp_path / "data")
    before = found(data_dir)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(make_text().encode("utf-8") + "café".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        prepared(latin1, data_dir)
    assert found(data_dir) == before
    assert_tidy(data_dir)
    assert found(prepared(texts[1], data_dir)) != before  # the failed prepare let its lock go


def test_prepare_over_a_copy_that_followed_the_links(tmp_path, texts):
    """A copy made without keeping links (shutil.copytree, cp -L) holds plain files, .current as a folder; it opens,
    and a prepare there replaces it like any other."""
    copy = tmp_path / "copy"
    shutil.copytree(prepared(texts[0], tmp_path / "data") / "tiny", copy / "tiny")
    assert found(copy) == found(tmp_path / "data") and not (copy / "tiny" / ".current").is_symlink()
    opens(copy)
    assert found(prepared(texts[1], copy)) == found(prepared(texts[1], tmp_path / "reference"))
    assert_tidy(copy)
    opens(copy)


def test_a_second_prepare_of_a_dataset_is_refused(tmp_path, texts):
    old_text, new_text = texts
    data_dir = prepared(old_text, tmp_path / "data")
    before = found(data_dir)
    folder = data_dir / "tiny"
    with open(folder / LOCK, "a+", encoding="utf-8") as lock:  # as a prepare at work holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.truncate(0)
        lock.write("4242\n")
        lock.flush()
        proc = run_script("data/prepare.py", f"--input={new_text}", "--name=tiny", f"--data_dir={data_dir}")
        assert proc.returncode == 1
        assert_one_error_line(proc.stderr, f"error: {folder} is being prepared by another data/prepare.py "
                                           "(process 4242); wait for it to end or pick another --name")
        assert found(data_dir) == before
        check_ok(run_script("data/prepare.py", f"--input={new_text}", "--name=other", f"--data_dir={data_dir}"))
    check_ok(run_script("data/prepare.py", f"--input={new_text}", "--name=tiny", f"--data_dir={data_dir}"))
    assert found(data_dir) == found(prepared(new_text, tmp_path / "reference"))
    opens(data_dir)


def test_dataset_prepared_again_under_a_run_is_one_line(tmp_path, texts):
    old_text, new_text = texts
    data_dir = prepared(old_text, tmp_path / "data")
    run = opens(data_dir)
    run.sampler.next()
    for split in ("train", "val"):
        run.splits[split].batch(run.eval_offsets[split][0], "cpu")
    prepared(new_text, data_dir)  # shorter: the run's windows near the end now lie past it
    folder = data_dir / "tiny"
    with pytest.raises(UserError) as e:
        run.sampler.next()
    assert str(e.value) == (f"{folder / 'train.bin'} changed under this run (the dataset was prepared again or "
                            "edited since the run opened it); start the run again to train on the new data")
    with pytest.raises(UserError, match=r"val\.bin changed under this run"):
        run.splits["val"].batch(run.eval_offsets["val"][0], "cpu")
    opens(data_dir).sampler.next()  # a run started now reads the new dataset


def test_split_file_rewritten_or_removed_under_a_run_is_one_line(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(np.arange(1000, dtype=np.uint16).tobytes())
    split = Split(tmp_path, "train", {"dtype": "uint16", "vocab_size": 1000}, 8)
    last = torch.tensor([1000 - 9])
    assert split.batch(last, "cpu")[1][0, -1].item() == 999
    with open(path, "r+b") as f:  # the same file, cut short in place
        f.truncate(600)
    with pytest.raises(UserError, match=r"train\.bin changed under this run"):
        split.batch(last, "cpu")
    path.unlink()
    with pytest.raises(UserError, match=r"train\.bin changed under this run"):
        split.batch(last, "cpu")
