"""A dataset folder's layout on disk (gptkit/data/versions.py): a dataset is replaced as a whole, by one prepare at a
time: a prepare killed at every step that changes a name on disk leaves the old dataset or the new one, a failed
prepare leaves nothing, a second prepare of the same dataset is refused while one holds its lock, and a link of the
user's where one of the dataset's own goes is refused. (A run whose dataset changes under it: see
test_dataset.py; preparing over a dataset another tokenizer or other text made: test_prepare.py.)"""

import fcntl
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, assert_one_error_line, check_ok, make_text, run_script
from gptkit.base.errors import UserError
from gptkit.data.dataset import TrainingData, load_meta
from gptkit.data.preparing import PrepareConfig, prepare
from gptkit.data.versions import LOCK, OUTPUTS

KILLED = 86  # the exit status of a prepare that the script below killed

# prepares, each in a process of its own forked from this script once its imports are done, that die at their Nth
# call changing a name on disk, by os._exit: no `finally`, no clean-up, as under SIGKILL. argv: the text, and a JSON
# list of [N, data_dir]. A prepare with N = 0 runs through and prints how many such calls it made (after what the
# prepare prints). The last line printed is {N: exit status}.
KILL_AT_STEP = """
import json, os, shutil, sys, traceback
sys.path.insert(0, {repo!r})
from gptkit.data.preparing import PrepareConfig, prepare


def prepare_dying_at(at, text, data_dir):
    calls = [0]

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
    prepare(PrepareConfig(input=text, name="tiny", data_dir=data_dir, start_over=True))
    return calls[0]


exits = {{}}
for at, data_dir in json.loads(sys.argv[2]):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            steps = prepare_dying_at(at, sys.argv[1], data_dir)
            if at == 0:
                print(steps)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(status)
    exits[at] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(exits))
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


def prepared(text, data_dir, start_over=True):
    """data_dir with `text` prepared as dataset 'tiny', replacing the one there (these tests replace datasets)."""
    prepare(PrepareConfig(input=str(text), name="tiny", data_dir=str(data_dir), start_over=start_over))
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


@pytest.mark.slow
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

    def run(*runs):
        """The prepares of (N, data_dir), each data_dir first a copy of the dataset there before: ([what the one
        with N = 0 printed], {N: exit status})."""
        for _, data_dir in runs:
            if pristine.exists():
                shutil.copytree(pristine, data_dir, symlinks=True)
        proc = check_ok(subprocess.run([sys.executable, str(script), str(new_text),
                                        json.dumps([[at, str(data_dir)] for at, data_dir in runs])],
                                       capture_output=True, text=True, timeout=300))
        *printed, exits = proc.stdout.splitlines()
        return printed, {int(at): status for at, status in json.loads(exits).items()}, proc.stderr

    printed, exits, _ = run((0, tmp_path / "whole"))
    steps = int(printed[-1])  # after the note that the dataset there is replaced
    assert exits == {0: 0} and found(tmp_path / "whole") == new
    _, exits, stderr = run(*((at, tmp_path / f"killed-{at}") for at in range(1, steps + 1)))
    seen = set()
    for at in range(1, steps + 1):
        data_dir = tmp_path / f"killed-{at}"
        assert exits[at] == KILLED, stderr
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


@pytest.mark.parametrize("what", ["a folder", "a FIFO"])
def test_a_lock_file_that_is_no_file_is_named(tmp_path, what):
    """The dataset's lock (.prepare.lock) made a folder or a FIFO: the line names it, where it said 'Is a
    directory' of the dataset folder, or 'not seekable'."""
    from gptkit.data.versions import dataset_lock

    folder = tmp_path / "tiny"
    folder.mkdir()
    os.mkfifo(folder / LOCK) if what == "a FIFO" else (folder / LOCK).mkdir()
    with pytest.raises(UserError) as e, dataset_lock(folder):
        pass
    kind = "a folder" if what == "a folder" else "no plain file"
    assert str(e.value) == f"{folder / LOCK} is {kind} where a lock file goes; move it out of the way"


@pytest.mark.slow
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
        proc = run_script("data/prepare.py", f"--input={new_text}", "--name=tiny", f"--data_dir={data_dir}",
                          "--start_over=True")
        assert proc.returncode == 1
        assert_one_error_line(proc.stderr, f"error: {folder} is being prepared by another data/prepare.py "
                                           "(process 4242); wait for it to end or pick another --name")
        assert found(data_dir) == before
        check_ok(run_script("data/prepare.py", f"--input={new_text}", "--name=other", f"--data_dir={data_dir}"))
    check_ok(run_script("data/prepare.py", f"--input={new_text}", "--name=tiny", f"--data_dir={data_dir}",
                        "--start_over=True"))
    assert found(data_dir) == found(prepared(new_text, tmp_path / "reference"))
    opens(data_dir)


@pytest.mark.parametrize("name", ["meta.json", "train.bin", "tokenizer.json", ".current", ".versions", LOCK])
def test_a_link_of_the_user_s_where_the_dataset_s_own_goes_is_refused(tmp_path, texts, outside, name):
    """The dataset's files are the project's own links, and kept working; a link the user put in one's place is
    refused in one line, never replaced (dropping it) nor written through or deleted under (reaching what it
    points at: the lock is written, .versions has old versions deleted in it)."""
    data_dir = prepared(texts[0], tmp_path / "data")
    folder, elsewhere = data_dir / "tiny", outside.parent
    (elsewhere / "old-version").mkdir()  # what a prepare would delete, were .versions a link to here
    if (folder / name).is_dir() and not (folder / name).is_symlink():
        shutil.rmtree(folder / name)
    else:
        (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(elsewhere if name in (".current", ".versions") else outside)
    with pytest.raises(UserError) as e:
        prepared(texts[0], data_dir, start_over=False)  # the same text again: nothing else stands in its way
    assert str(e.value) == (f"{folder / name} is a link, and the tool writes this file itself, never through a link; "
                            "remove it")
    assert (folder / name).is_symlink() and sorted(os.listdir(elsewhere)) == ["old-version", "precious.txt"]
    assert outside.read_text() == "precious\n"


def test_a_link_put_among_the_versions_is_removed_not_what_it_points_at(tmp_path, texts, outside):
    data_dir = prepared(texts[0], tmp_path / "data")
    (data_dir / "tiny" / ".versions" / "stray").symlink_to(outside.parent)
    prepared(texts[1], data_dir)
    assert_tidy(data_dir)
    assert outside.read_text() == "precious\n"


def test_a_bpe_dataset_replaced_by_characters_keeps_no_tokenizer_link(tmp_path, texts):
    """tokenizer.json is a link through .current like the others: it goes with the dataset it belongs to."""
    data_dir = tmp_path / "data"
    prepare(PrepareConfig(input=str(texts[0]), name="tiny", data_dir=str(data_dir), tokenizer="bpe", vocab_size=300))
    assert os.readlink(data_dir / "tiny" / "tokenizer.json") == ".current/tokenizer.json"
    prepared(texts[0], data_dir)
    assert_tidy(data_dir)
    opens(data_dir)
