"""
A dataset folder's layout on disk, so that a dataset is replaced as a whole.

Its files (meta.json, a trained BPE's tokenizer.json and the split's token files: train.bin and val.bin, or shards
train_000.bin, ...) are links through `.current`, itself a link to one folder under `.versions/`: prepare writes
the new dataset into a folder of its own there and then renames a new `.current` over the old one, so a prepare
killed at any moment leaves the old dataset or the new one, complete, and never a mix. `.prepare.lock` keeps a
second prepare of the same dataset out meanwhile. A prepare that was stopped keeps its work in
`.versions/work-<settings>`, found again by the same command. Those links are the project's own: a link the user
put at one of these names, or at `.versions` or the lock, is refused rather than written through or replaced.
"""

import errno
import os
import re
import secrets
import shutil

from gptkit.base.errors import UserError
from gptkit.base.files import link_in_place, no_links
from gptkit.base.locks import exclusive
from gptkit.data.sources import shown

OUTPUTS = ("train.bin", "val.bin", "meta.json")  # a dataset that fits in one shard per split
DATASET_FILE = re.compile(r"(meta\.json|(train|val)(_[0-9]+)?\.bin)")
# every name that is a link through .current: a chat dataset's roles, held-out problems and mixed val text too
LINKED = re.compile(rf"{DATASET_FILE.pattern}|tokenizer\.json|(train|val)_roles\.bin|heldout\.jsonl|mixed_val\.txt")
CURRENT, VERSIONS, LOCK = ".current", ".versions", ".prepare.lock"


def check_room(out_dir):
    """out_dir is a folder (or can become one) and no folder stands where the dataset's files go; checked before
    anything is written there."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"cannot write the dataset to {shown(out_dir)} (a file of that name is in the way)")
    for name in OUTPUTS:
        if (out_dir / name).is_dir():
            raise UserError(f"{shown(out_dir / name)} is a folder where the dataset's {name} goes; "
                            "move it out of the way")
    refuse_links(out_dir)


def refuse_links(out_dir):
    """A link at a name the dataset's own links take, that is not one of them, is the user's: replacing it would
    drop it, and writing through it (the lock) or deleting under it (.versions) would reach what it points at."""
    if not out_dir.is_dir():
        return
    for name in os.listdir(out_dir):
        path = out_dir / name
        if not os.path.islink(path):
            continue
        if LINKED.fullmatch(name):
            theirs = os.readlink(path) != f"{CURRENT}/{name}"
        elif name == CURRENT:
            target = os.readlink(path)
            theirs = not (target.startswith(f"{VERSIONS}/") and "/" not in target[len(VERSIONS) + 1:])
        else:
            theirs = name in (VERSIONS, LOCK)
        if theirs:
            raise UserError(link_in_place(shown(path)))


def dataset_lock(out_dir):
    """Hold the dataset folder's lock for the whole prepare: a second prepare of the same dataset stops at once
    with one line instead of writing over the first one's files."""
    return exclusive(out_dir / LOCK, f"cannot write the dataset to {shown(out_dir)}",
                     lambda holder: f"{shown(out_dir)} is being prepared by another data/prepare.py{holder}; "
                                    "wait for it to end or pick another --name", opener=no_links)


def new_version(out_dir, name=None):
    """A new, empty folder under out_dir/.versions to hold one whole dataset."""
    path = out_dir / VERSIONS / (name or secrets.token_hex(8))
    path.mkdir(parents=True)
    return path


def work_folder(out_dir, key):
    """Where a prepare with these settings (key) writes until it is done: found again by a prepare that runs the
    same command after this one was stopped."""
    return out_dir / VERSIONS / f"work-{key}"


def commit(out_dir, work):
    """Make the finished `work` folder the dataset readers find, in one step: with the dataset's files links
    through .current, renaming a new .current into place swaps all of them at once. Links to files the new
    dataset lacks (shards of a bigger one before) go after the swap."""
    version = out_dir / VERSIONS / secrets.token_hex(8)
    os.rename(work, version)  # a prepare with the same settings must not take the dataset for its work
    names = sorted(os.listdir(version))
    link_names(out_dir, names)
    point(out_dir / CURRENT, f"{VERSIONS}/{version.name}")
    for name in os.listdir(out_dir):
        if LINKED.fullmatch(name) and name not in names and os.path.islink(out_dir / name):
            os.unlink(out_dir / name)
    sync([out_dir])  # a prepare that returned stays done after a power cut


def link_names(out_dir, names):
    """Make each of `names` a link through .current without changing what a reader finds at any moment. Dataset
    files found as plain files (from a prepare before versions, or a copy that followed the links) are first
    kept, by hard links, as a version of their own that .current points to."""
    current = out_dir / CURRENT
    plain = [n for n in os.listdir(out_dir) if LINKED.fullmatch(n) and not os.path.islink(out_dir / n)]
    if plain or (current.is_dir() and not current.is_symlink()):
        kept = new_version(out_dir)
        for name in plain:
            os.link(out_dir / name, kept / name)
        if current.is_dir() and not current.is_symlink():  # a copy made it a folder; the names above are kept
            shutil.rmtree(current)
        point(current, f"{VERSIONS}/{kept.name}")
        for name in plain:
            point(out_dir / name, f"{CURRENT}/{name}")
    for name in names:
        if not (os.path.islink(out_dir / name) and os.readlink(out_dir / name) == f"{CURRENT}/{name}"):
            point(out_dir / name, f"{CURRENT}/{name}")


def point(link, target):
    """Make `link` a symbolic link to `target` in one step: a new link renamed over the name."""
    tmp = link.with_name(f"{link.name}.tmp")
    tmp.unlink(missing_ok=True)  # left by a prepare killed here
    os.symlink(target, tmp)
    os.replace(tmp, link)


def bare(out_dir):
    """Whether out_dir is missing, or holds only what a prepare that made nothing leaves: its lock and an empty
    .versions."""
    try:
        names = set(os.listdir(out_dir))
    except OSError:  # missing, or not a folder (which taking the lock says), or unreadable: none of this prepare's
        return not out_dir.exists()
    return LOCK in names and names <= {LOCK, VERSIONS} and not (VERSIONS in names and os.listdir(out_dir / VERSIONS))


def remove_bare(out_dir, folder_too):
    """Clear a bare dataset folder, so that nothing says a dataset is there (train.py's hint is then the command
    that makes one): its lock and .versions, and with folder_too the folder. Called holding the lock: where
    another prepare has opened a new lock file by now, the folder is its, and stays."""
    if (out_dir / VERSIONS).is_dir():
        os.rmdir(out_dir / VERSIONS)
    os.unlink(out_dir / LOCK)
    try:
        if folder_too:
            os.rmdir(out_dir)
    except OSError as e:
        if e.errno != errno.ENOTEMPTY:
            raise


def stopped_work(out_dir, keep):
    """The work folders of stopped prepares other than `keep`, which remove_leftovers(out_dir, keep) deletes."""
    versions = out_dir / VERSIONS
    return [v for v in versions.glob("work-*") if v != keep] if versions.is_dir() else []


def remove_leftovers(out_dir, keep=None):
    """Delete every version but the one readers find (older datasets, and what failed or killed prepares left)
    and `keep` (a stopped prepare's work, to continue), and any half-made link."""
    if not (out_dir / VERSIONS).is_dir():
        return
    current = os.path.realpath(out_dir / CURRENT)
    for version in (out_dir / VERSIONS).iterdir():
        if os.path.realpath(version) == current or version == keep:
            continue
        if version.is_symlink():  # a link put there: removed itself, as rmtree refuses to, never what it points at
            os.unlink(version)
        else:
            shutil.rmtree(version)
    for name in os.listdir(out_dir):
        if name.endswith(".tmp") and (name[:-4] == CURRENT or LINKED.fullmatch(name[:-4])):
            os.unlink(out_dir / name)


def sync(paths):
    """Flush files or folders to disk (fsync)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
