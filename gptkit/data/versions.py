"""
A dataset folder's layout on disk, so that a dataset is replaced as a whole.

Its files (meta.json and the split's token files: train.bin and val.bin, or shards train_000.bin, ...) are links
through `.current`, itself a link to one folder under `.versions/`: prepare writes the new dataset into a folder
of its own there and then renames a new `.current` over the old one, so a prepare killed at any moment leaves
the old dataset or the new one, complete, and never a mix. `.prepare.lock` keeps a second prepare of the same
dataset out meanwhile. A prepare that was stopped keeps its work in `.versions/work-<settings>`, found again by
the same command.
"""

import os
import re
import secrets
import shutil

from gptkit.base.errors import UserError
from gptkit.base.locks import exclusive
from gptkit.data.sources import shown

OUTPUTS = ("train.bin", "val.bin", "meta.json")  # a dataset that fits in one shard per split
DATASET_FILE = re.compile(r"(meta\.json|(train|val)(_\d+)?\.bin)")
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


def dataset_lock(out_dir):
    """Hold the dataset folder's lock for the whole prepare: a second prepare of the same dataset stops at once
    with one line instead of writing over the first one's files."""
    return exclusive(out_dir / LOCK, f"cannot write the dataset to {shown(out_dir)}",
                     lambda holder: f"{shown(out_dir)} is being prepared by another data/prepare.py{holder}; "
                                    "wait for it to end or pick another --name")


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
        if DATASET_FILE.fullmatch(name) and name not in names and os.path.islink(out_dir / name):
            os.unlink(out_dir / name)
    sync([out_dir])  # a prepare that returned stays done after a power cut


def link_names(out_dir, names):
    """Make each of `names` a link through .current without changing what a reader finds at any moment. Dataset
    files found as plain files (from a prepare before versions, or a copy that followed the links) are first
    kept, by hard links, as a version of their own that .current points to."""
    current = out_dir / CURRENT
    plain = [n for n in os.listdir(out_dir) if DATASET_FILE.fullmatch(n) and not os.path.islink(out_dir / n)]
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


def remove_leftovers(out_dir, keep=None):
    """Delete every version but the one readers find (older datasets, and what failed or killed prepares left)
    and `keep` (a stopped prepare's work, to continue), and any half-made link."""
    if not (out_dir / VERSIONS).is_dir():
        return
    current = os.path.realpath(out_dir / CURRENT)
    for version in (out_dir / VERSIONS).iterdir():
        if os.path.realpath(version) != current and version != keep:
            shutil.rmtree(version)
    for name in os.listdir(out_dir):
        if name.endswith(".tmp") and (name[:-4] == CURRENT or DATASET_FILE.fullmatch(name[:-4])):
            os.unlink(out_dir / name)


def sync(paths):
    """Flush files or folders to disk (fsync)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
