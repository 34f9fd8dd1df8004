"""Errors a user can cause, and the entry-point wrapper that prints them as one line."""

import sys


class UserError(Exception):
    """A mistake in input, config or environment: shown as one line, never a traceback."""

    exit_code = 1


class RunStopped(UserError):
    """The run was asked to stop (Ctrl-C) and saved its state: exit status 130 (128 + SIGINT), as shells report it."""

    exit_code = 130


def first_line(e):
    """The first line (and sentence) of an exception's message, or its type when it has none:
    library errors can run to paragraphs, and a user error is one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0].split(". ")[0].rstrip(".") if lines else type(e).__name__


def run_main(main):
    """Run an entry script's main(), turning a UserError into `error: ...` and its exit status
    (1, or 130 for a stopped run), and Ctrl-C outside a training loop into status 130."""
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
