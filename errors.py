"""Errors a user can cause, and the entry-point wrapper that prints them as one line."""

import sys


class UserError(Exception):
    """A mistake in input, config or environment: shown as one line, never a traceback."""


def run_main(main):
    """Run an entry script's main(), turning a UserError into `error: ...` and exit status 1."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except BrokenPipeError:  # e.g. `python sample.py | head`
        sys.exit(0)
