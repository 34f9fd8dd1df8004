"""An exclusive lock on a folder, held from before anything is written there until the work ends."""

import fcntl
import os
from contextlib import contextmanager

from gptkit.base.errors import UserError


@contextmanager
def exclusive(path, unwritable, busy, opener=None):
    """Hold the lock file at path (its folder made if need be) for this process: a second holder stops at once
    with one line, `busy` given ' (process N)' or ''; a folder that cannot take the file is `unwritable` and its
    reason. The lock file keeps the holder's pid. The OS releases the lock when the process ends, however."""
    if os.path.lexists(path) and not path.is_symlink() and not path.is_file():  # a folder, a FIFO: named
        raise UserError(f"{path} is {'a folder' if path.is_dir() else 'no plain file'} where a lock file goes; move "
                        "it out of the way")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path, "a+", encoding="utf-8", opener=opener)
    except OSError as e:
        raise UserError(f"{unwritable} ({e.strerror or e})") from None
    with lock:  # closing the file releases the lock
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip()
            raise UserError(busy(f" (process {holder})" if holder else "")) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield
