"""Prompt text from the command line: escapes typed in a shell, or a file to read."""

import re

from gptkit.base.errors import UserError

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text):
    """Turn the escapes \\n, \\t, \\r and \\\\ into the characters they stand for; leave the rest.
    Typed on a command line, "\\n" is a backslash and an n: this reads it as the newline it means."""
    return re.sub(r"\\([ntr\\])", lambda m: ESCAPES[m.group(1)], text)


def read_prompt(start):
    """The prompt a --start option names: FILE:path is read from that file (as it is), other text unescaped."""
    if not start.startswith("FILE:"):
        return unescape(start)
    try:
        with open(start[5:], encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UserError(f"could not read prompt file {start[5:]} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"prompt file {start[5:]} is not UTF-8 text ({e.reason} at byte {e.start})") from None
