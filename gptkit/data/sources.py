"""
The documents of a corpus, read from what a user points data/prepare.py at: a text file, a JSON Lines file
(.jsonl, .jsonl.gz, .jsonl.zst: one document per line, in a text field), a Parquet file (one document per
row, read by row groups), or a folder holding any mix of them.

Every reader yields Pieces, each carrying the position just after it, so a prepare that was stopped starts
reading again exactly where its last saved state left off. A record that cannot be read is one line naming
the file and the line or row; with skip_bad it is counted and passed over instead.
"""

import codecs
import gzip
import hashlib
import json
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

from gptkit.base.errors import UserError

CHUNK_BYTES = 1 << 20
LONG_RECORD = 4 << 20  # a record longer than this (a book in one line) is tokenized in pieces, as a text file is
JSONL = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET = ".parquet"


def shown(path):
    """A path as text that prints and stores anywhere: bytes of the name that are not UTF-8 appear escaped (\\xff),
    where str() would hold lone surrogates that no UTF-8 file or terminal takes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def source_identity(path):
    """A file's size and modification time, which tell at a glance whether it is a file a dataset was made of
    (gptkit.data.dataset.file_identity tells a token file from its replacement under a running run)."""
    stat = path.stat()
    return {"bytes": stat.st_size, "mtime": stat.st_mtime}


def source_record(path):
    """What a dataset's meta.json keeps of a file it was made of, to tell it again: its size and modification
    time, and the sha256 of its bytes, which tells the same text copied again (a new time) from other text."""
    return {"path": shown(path), **source_identity(path), "sha256": sha256_of(path)}


def same_source(was, path):
    """Whether the file at path is the one meta.json recorded as `was` (source_record's): of the same size and
    time, or of the same bytes where the record keeps their sha256 (read only then)."""
    if not isinstance(was, dict):
        return False
    now = source_identity(path)
    if was.get("bytes") != now["bytes"]:
        return False
    return was.get("mtime") == now["mtime"] or \
        "sha256" in was and sha256_of(path) == was["sha256"]


def kind_of(path):
    """'jsonl', 'parquet' or 'text', from the file's name."""
    name = path.name.lower()
    if name.endswith(JSONL):
        return "jsonl"
    return "parquet" if name.endswith(PARQUET) else "text"


@dataclass
class Piece:
    text: object  # text to encode; of a record, what holds it: a JSON line (bytes) or a Parquet value (see read_record)
    ends_document: bool  # the last piece of its document (a text file comes in many pieces)
    position: int  # where to start reading again after this piece: a byte offset, line or row number
    val: bool = False  # of a text file split by document: its hash puts it in the val split
    record: bool = False  # a JSON line or Parquet row, whole, whose text read_record finds
    where: str = ""  # the file and line or row, for a message about it
    of_record: bool = False  # a piece of a record's text (a long one's): it ends with a record's separator
    resumable: bool = True  # a place a stopped prepare may continue from (not inside a long record)


@dataclass
class Tally:
    """What a prepare passed over, to report at its end."""
    empty: int = 0  # documents with no text
    bad: int = 0  # records that could not be read, skipped with skip_bad


def source_files(path):
    """The files to read: the file itself, or every file under a folder in sorted order. Only regular files:
    prepare reads its input more than once (vocabulary, tokens), which a pipe cannot give."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not hidden(p, path))
        if not files:
            raise UserError(f"input folder {shown(path)} holds no files")
        return files
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"input file not found: {shown(path)}") from None
    except OSError as e:
        raise UserError(f"could not read {shown(path)} ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        kind = "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise UserError(f"input {shown(path)} is {kind}, not a regular file: prepare reads its input more than "
                        "once; save the text to a file and pass that")
    return [path]


def hidden(file, folder):
    """Whether a file under folder is left out: a name on its way from the folder starting with '.', or on the
    way to what it links to there. A dataset prepared into its own input folder is links into .versions/, which
    would otherwise be read as the input the next time."""
    parts = file.relative_to(folder).parts
    try:
        parts += file.resolve().relative_to(folder.resolve()).parts
    except ValueError:  # a link leading out of the folder: its own name decides
        pass
    return any(part.startswith(".") for part in parts)


def in_val(data, val_fraction):
    """Whether a document belongs to the val split: decided by its own bytes alone, so adding or reordering
    files never moves a document from one split to the other, and copies of a document stay together."""
    return hashed_in_val(hashlib.blake2b(data, digest_size=8), val_fraction)


def hashed_in_val(h, val_fraction):
    return int.from_bytes(h.digest(), "little") < val_fraction * 2 ** 64


def hashed(path, h):
    """The hash h (a hashlib object), updated with the file's bytes, read in blocks."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return h


def sha256_of(path):
    return hashed(path, hashlib.sha256()).hexdigest()


def file_in_val(path, val_fraction):
    """in_val for a whole text file: the hash of its bytes is the hash of its text."""
    try:
        return hashed_in_val(hashed(path, hashlib.blake2b(digest_size=8)), val_fraction)
    except OSError as e:
        raise UserError(f"could not read {shown(path)} ({e.strerror or e})") from None


class Reader:
    """One corpus's documents: reads each file by its kind and counts what it passes over."""

    def __init__(self, text_field="text", skip_bad=False, val_fraction=None, cut=len, tally=None):
        self.text_field, self.skip_bad = text_field, skip_bad
        self.val_fraction = val_fraction  # None: no split by document (a corpus of text files only)
        self.cut = cut  # where a piece of a long text may end (see corpus.bpe_cut)
        self.tally = tally or Tally()

    def pieces(self, path, start, progress):
        """The Pieces of one file from position `start` (0: its beginning)."""
        kind = kind_of(path)
        if kind == "jsonl":
            return self.jsonl(path, start, progress)
        if kind == "parquet":
            return self.parquet(path, start, progress)
        return self.text(path, start, progress)

    def passed_over(self, piece, problem):
        """A record with no document: counted as empty, or, bad, one line (counted with skip_bad)."""
        if problem is None:
            self.tally.empty += 1
        elif problem is CONVERSATION:  # a chat file among others, or in a folder: skipping them would leave nothing
            raise UserError(f"{piece.where}: {problem}; a chat dataset is prepared from one .jsonl file of "
                            "conversations, given alone as --input")
        elif self.skip_bad:
            self.tally.bad += 1
        else:
            raise UserError(f"{piece.where}: {problem} (pass --skip_bad to skip such records)")

    def text(self, path, start, progress):
        """A text file as one document, in pieces of about CHUNK_BYTES."""
        val = False
        if self.val_fraction is not None:  # the side of a whole file is known before its first piece is written
            val = file_in_val(path, self.val_fraction)
        if os.path.getsize(path) == 0:
            self.tally.empty += 1
            return
        pieces = read_text(path, start, progress, self.cut)
        for text, position, last in pieces:
            yield Piece(text, last, position, val)

    def jsonl(self, path, start, progress):
        """Each line as it is, for read_record to parse where it is tokenized (another process)."""
        with LinesOf(path) as (f, raw):
            line_no, told = 0, raw.tell()
            for line in f:
                line_no += 1
                if line_no % 64 == 0:  # often enough for the bar, rarely enough to cost nothing
                    progress.update(raw.tell() - told)
                    told = raw.tell()
                if line_no > start and line.strip():
                    where = f"{shown(path)}:{line_no}"
                    if len(line) <= LONG_RECORD:
                        yield Piece(line, True, line_no, record=True, where=where)
                        continue
                    found, line = read_record(line, self.text_field, self.val_fraction), None  # the text alone
                    yield from self.long_record(*found, line_no, where)
            progress.update(raw.tell() - told)

    def long_record(self, text, val, problem, number, where):
        """A record's text too long to send whole to a tokenizing process, in pieces of about CHUNK_BYTES that
        end where cut says, as a text file's do: the tokens of the whole, in bounded memory. A stopped prepare
        continues from the record's start (number - 1), never from inside it."""
        if not text:
            self.passed_over(Piece(None, True, number, where=where), problem)
            return
        at = 0
        while at < len(text):
            window = text[at:at + CHUNK_BYTES]
            last = at + len(window) == len(text)
            end = len(window) if last else self.cut(window) or len(window)
            yield Piece(window[:end], last, number if last else number - 1, val, where=where, of_record=True,
                        resumable=last)
            at += end

    def parquet(self, path, start, progress):
        pf, column = open_parquet(path, self.text_field)
        row = 0
        for group in range(pf.num_row_groups):
            rows = pf.metadata.row_group(group).num_rows
            if row + rows <= start:
                row += rows
                continue
            try:
                texts = pf.read_row_group(group, columns=[column]).column(0).to_pylist()
            except Exception as e:  # pyarrow's errors for a damaged file are many kinds
                raise UserError(f"could not read row group {group} of {shown(path)} ({first_words(e)})") from None
            for text in texts:
                row += 1
                if row > start and isinstance(text, str) and len(text) > LONG_RECORD:
                    yield from self.long_record(*read_record(text, self.text_field, self.val_fraction), row,
                                                f"{shown(path)}: row {row}")
                elif row > start:
                    yield Piece(text, True, row, record=True, where=f"{shown(path)}: row {row}")
            progress.update(os.path.getsize(path) / pf.num_row_groups)


CONVERSATION = 'a conversation ({"messages": [...]}), not a record of text'


def read_record(held, field, val_fraction):
    """A record's document: (text, whether its hash puts it in val, what is wrong with it or None). `held` is a
    JSON line (bytes) or a Parquet column's value; an empty text is '' with nothing wrong."""
    if isinstance(held, bytes):
        try:  # decoded here, as UTF-8: json.loads would take a UTF-16 line's bytes, and name the wrong byte
            record = json.loads(held.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            return None, False, f"not UTF-8 text (byte 0x{e.object[e.start]:02x})"
        except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deeply
            return None, False, f"not valid JSON ({str(e).splitlines()[0][:80]})"
        if not isinstance(record, dict):
            return None, False, "the line is not a JSON object"
        held = record.get(field)
        if held is None and "messages" in record:
            return None, False, CONVERSATION
    if not isinstance(held, str):
        return None, False, (f"no text in field {field!r}" if held is None else
                             f"field {field!r} holds {type(held).__name__}, not text")
    try:
        data = held.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \\ud800 escapes can spell
        return None, False, "the text is not valid Unicode (a lone surrogate)"
    return held, bool(held) and val_fraction is not None and in_val(data, val_fraction), None


def first_words(e):
    lines = str(e).strip().splitlines()
    return lines[0][:120] if lines else type(e).__name__


class LinesOf:
    """A JSON Lines file's lines as bytes, decompressed where its name says so, and the raw file beneath (whose
    position measures progress). Damaged compressed data becomes one line naming the file."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        try:
            self.raw = open(self.path, "rb")
        except OSError as e:
            raise UserError(f"could not read {shown(self.path)} ({e.strerror or e})") from None
        name = self.path.name.lower()
        if name.endswith(".gz"):
            stream = gzip.GzipFile(fileobj=self.raw)
        elif name.endswith(".zst"):
            stream = lines_of(zstd_blocks(self.raw))
        else:
            stream = self.raw
        return stream, self.raw

    def __exit__(self, kind, e, tb):
        self.raw.close()
        if isinstance(e, (OSError, EOFError, zlib.error)) or type(e).__name__ == "ZstdError":
            raise UserError(f"could not read {shown(self.path)}: damaged or cut short ({first_words(e)})") from None
        return False


def zstd_blocks(raw):
    """A Zstandard file's data, frame after frame. zstandard's own stream reader ends a frame cut short without
    a word; this says so (an EOFError, one line above)."""
    import zstandard

    frame, started = zstandard.ZstdDecompressor().decompressobj(), False
    for block in iter(lambda: raw.read(CHUNK_BYTES), b""):
        while block:
            started = True
            yield frame.decompress(block)
            block = b""
            if frame.eof:  # what is left starts the next frame
                block, frame, started = frame.unused_data, zstandard.ZstdDecompressor().decompressobj(), False
    if started:
        raise EOFError("the last Zstandard frame is cut short")


def lines_of(blocks):
    """The lines of a stream of data blocks, each ending in its newline (the last one maybe not)."""
    carry = b""
    for block in blocks:
        *lines, carry = (carry + block).split(b"\n")
        for line in lines:
            yield line + b"\n"
    if carry:
        yield carry


def open_parquet(path, field):
    """The Parquet file and the name of its text column, checked: readable, holding that column, as text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # not Parquet at all, or cut short
        raise UserError(f"could not read {shown(path)} as Parquet ({first_words(e)})") from None
    schema = pf.schema_arrow
    if field not in schema.names:
        raise UserError(f"{shown(path)} has no column {field!r} (its columns: {', '.join(schema.names)}); "
                        "name the text column with --text_field")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserError(f"column {field!r} of {shown(path)} holds {kind}, not text")
    return pf, field


def read_text(path, start, progress, cut=len):
    """Yield (text, position after it, whether it is the last) for the file's text from byte `start`, in
    pieces of about CHUNK_BYTES, checking that it is UTF-8. Each piece ends where cut(text) says, the rest
    carried to the next; where cut finds no place (0) the piece is cut at its end anyway, so memory stays
    bounded however long the lines are."""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    carry, offset = "", start
    try:
        with open(path, "rb") as f:
            f.seek(start)
            size = os.fstat(f.fileno()).st_size
            for block in iter(lambda: f.read(CHUNK_BYTES), b""):
                text = carry + decoded(utf8, block, path, offset)
                offset += len(block)
                progress.update(len(block))
                at = cut(text) or len(text)
                carry = text[at:]
                # where the next piece starts: what was read, less what is carried or half a character
                position = offset - len(carry.encode("utf-8")) - len(utf8.getstate()[0])
                if text[:at]:
                    yield text[:at], position, position == size
    except OSError as e:
        raise UserError(f"could not read {shown(path)} ({e.strerror or e})") from None
    try:
        carry += utf8.decode(b"", final=True)
    except UnicodeDecodeError:
        raise UserError(f"{shown(path)} is not UTF-8 text: it ends in the middle of a character") from None
    if carry:
        yield carry, offset, True


def decoded(utf8, block, path, offset):
    if b"\x00" in block:
        raise UserError(f"{shown(path)} looks like a binary file (NUL byte at offset "
                        f"{offset + block.index(0)}), not UTF-8 text")
    try:
        return utf8.decode(block)
    except UnicodeDecodeError as e:
        raise UserError(f"{shown(path)} is not UTF-8 text: byte 0x{block[e.start]:02x} at offset "
                        f"{offset + e.start}") from None
