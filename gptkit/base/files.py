"""Writing the files a tool keeps in a folder the user owns (a run's, a dataset's, an export's, the wisdom cache):
whole or not at all, and never through a link, which would send the write to the file it points at, wherever that
is. written_whole is the one way the tools write such a file; what they write as they go (records appended, token
shards streamed, a log) opens its file with no_links."""

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
    if not folder.is_dir():
        raise UserError(f"cannot write {path}: {folder} is a file where a folder goes; move it out of the way")
    if not os.access(folder, os.W_OK | os.X_OK) or path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"cannot write {path} (permission denied); make {folder} writable or pick another path")


@contextmanager
def written_whole(path, mode="w", encoding="utf-8", previous=None, shared=False, failed=None):
    """Open a temporary file beside `path` for writing; when the block ends, it is synced and renamed over
    `path`, so a crash leaves the old file or the new, never half of one. Every file the tools write whole goes
    through here, so that none of them loses those guarantees.

    previous: where the file being replaced is kept (the state to fall back on) instead of deleted; a failure
    after it moved there leaves no file at `path`, which failed then says.
    shared: other processes may write the same file at the same time (no lock keeps them out), so the temporary
    file is this process's own. failed(path, error): the exception to raise for an OSError, in the caller's
    words; by default one line saying the file is as it was. Any error removes the temporary file."""
    path = Path(path)
    refuse_link(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp" if shared else f"{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, mode, encoding=None if "b" in mode else encoding, opener=no_links) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise (failed or not_written)(path, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def not_written(path, e):
    reason = "disk full" if e.errno == errno.ENOSPC else e.strerror or str(e)
    return UserError(f"could not write {path} ({reason}); it is as it was")


def write_whole(path, data, **how):
    """`data` (text or bytes) as the whole of `path`, written aside and renamed over it (how: written_whole's
    options)."""
    with written_whole(path, "wb" if isinstance(data, bytes) else "w", **how) as f:
        f.write(data)
