"""Errors a user can cause, and the entry-point wrapper that prints them as one line."""

import errno
import os
import signal
import sys


class UserError(Exception):
    """A mistake in input, config or environment: shown as one line, never a traceback."""

    exit_code = 1


class RunStopped(UserError):
    """The run was asked to stop by a signal and saved its state: exit status 128 + the signal's number, as
    shells report a process the signal ended (130 for Ctrl-C's SIGINT, 143 for SIGTERM, 138 for SIGUSR1)."""

    exit_code = 128 + signal.SIGINT

    def __init__(self, message, signum=signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + signum


def no_links(path, flags):
    """open()'s opener for a file a run keeps in its folder: never through a link at its name, which would send
    the run's writes to the file it points at, wherever that is. A link there is the user's error."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise UserError(link_in_place(path)) from None
        raise


def link_in_place(path):
    return f"{path} is a link, and a run writes this file itself, never through a link; remove it"


def first_line(e):
    """The first line (and sentence) of an exception's message, or its type when it has none:
    library errors can run to paragraphs, and a user error is one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0].split(". ")[0].rstrip(".") if lines else type(e).__name__


def run_main(main):
    """Run an entry script's main(), turning a UserError into `error: ...` and its exit status
    (1, or 128 + signal for a stopped run), Ctrl-C outside a training loop into status 130, and a file
    the system refused into one line naming it."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(RunStopped.exit_code)
    except BrokenPipeError:  # e.g. `python sample.py | head`
        sys.exit(0)
    except OSError as e:  # a path no check foresaw: a full disk, a folder where a file goes, no permission
        if e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror or first_line(e)}", file=sys.stderr)
        sys.exit(1)
