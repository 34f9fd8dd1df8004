"""Prompt text from the command line: escapes typed in a shell, or a file to read. Either must be UTF-8 text: bytes
that are not would reach a tokenizer as other text (a byte-level BPE would encode U+FFFD in their place)."""

import re

from gptkit.base.errors import UserError
from gptkit.data.sources import shown

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text, what="the text"):
    """Turn the escapes \\n, \\t, \\r and \\\\ into the characters they stand for; leave the rest.
    Typed on a command line, "\\n" is a backslash and an n: this reads it as the newline it means."""
    return re.sub(r"\\([ntr\\])", lambda m: ESCAPES[m.group(1)], utf8(text, what))


def read_prompt(start):
    """The prompt a --start option names: FILE:path is read from that file (as it is), other text unescaped."""
    if not start.startswith("FILE:"):
        return unescape(start, "the prompt")
    path = shown(start[5:])
    try:
        with open(start[5:], encoding="utf-8") as f:
            # decoded whole, so an error's offset is the file's; a byte-order mark (Windows editors write one) is
            # the file's encoding, not its text
            return f.read().removeprefix("\ufeff")
    except OSError as e:
        raise UserError(f"could not read prompt file {path} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"prompt file {path} is not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset "
                        f"{e.start}") from None


def utf8(text, what):
    """Text typed or given on the command line, where it is UTF-8. Python hands a program the bytes of an argument
    (or of a line read in the C locale) that are not UTF-8 as lone surrogates, U+DC80-U+DCFF, one a byte."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code, offset = ord(text[e.start]), len(text[:e.start].encode("utf-8"))
        found = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate (U+{code:04X})"
        raise UserError(f"{what} is not UTF-8 text: {found} at offset {offset}; give UTF-8 text") from None
    return text
