"""Writing the files a tool keeps in a folder the user owns (a run's, a dataset's): whole or not at all, and
never through a link, which would send the write to the file it points at, wherever that is."""

import errno
import os
from contextlib import contextmanager
from pathlib import Path

from gptkit.base.errors import UserError


def no_links(path, flags):
    """open()'s opener for a file a tool keeps in its folder: a link at its name is the user's error."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise UserError(link_in_place(path)) from None
        raise


def link_in_place(path):
    return f"{path} is a link, and the tool writes this file itself, never through a link; remove it"


def refuse_link(path):
    """A link where a file is about to be replaced is refused: replacing it would drop what the user put there."""
    if os.path.islink(path):
        raise UserError(link_in_place(path))


def writable(path):
    """Raise one line unless `path` can be written now: no link at its name, the nearest folder that exists
    takes files, and a file already there may be replaced. Checked before a command does work (and prints
    results) that it would then fail to keep."""
    path = Path(path)
    refuse_link(path)
    folder = next((p for p in path.parents if p.exists()), Path("."))
    if not os.access(folder, os.W_OK | os.X_OK) or path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"cannot write {path} (permission denied); make {folder} writable or pick another path")


@contextmanager
def written_whole(path, mode="w", encoding="utf-8"):
    """Open a temporary file beside `path` for writing; when the block ends, it is synced and renamed over
    `path`, so a crash leaves the old file or the new, never half of one. An error removes it and says so."""
    path = Path(path)
    refuse_link(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, mode, encoding=None if "b" in mode else encoding, opener=no_links) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        reason = "disk full" if e.errno == errno.ENOSPC else e.strerror or str(e)
        raise UserError(f"could not write {path} ({reason}); it is as it was") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_whole(path, data):
    """`data` (text or bytes) as the whole of `path`, written aside and renamed over it."""
    with written_whole(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
