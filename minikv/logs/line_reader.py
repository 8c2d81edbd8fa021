"""A log's bytes as lines: a file or stdin, plain or gzip, with bounded memory and honest breaks
(`TruncatedLog`, `OverlongLine`; docs/logs.md)."""

import gzip
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 1 << 16
MAX_LINE_BYTES = 16 << 20  # a gateway record is a few KiB; 16 MiB is no record


class LogReadError(OSError):
    """The log as a whole cannot be read (missing, a directory, not readable)."""


class TruncatedLog(LogReadError):
    """The log breaks off part way; raised only after every line before the break was given out."""


@dataclass(frozen=True)
class OverlongLine:
    """A line longer than MAX_LINE_BYTES: skipped, only its length is kept."""
    length: int


def source_name(path: str | Path) -> str:
    """How messages name the log: its path, or 'stdin' for '-'."""
    return "stdin" if str(path) == "-" else str(path)


@contextmanager
def open_log(path: str | Path) -> Iterator[BinaryIO]:
    """Open a log (a path, or '-' for stdin) for reading bytes; gzip is recognised by its magic bytes."""
    try:
        raw = sys.stdin.buffer if str(path) == "-" else open(path, "rb")
    except OSError as e:
        why = {FileNotFoundError: "no such file", IsADirectoryError: "is a directory, not a log file"}
        raise LogReadError(f"{path}: {why.get(type(e), f'cannot open ({e.strerror})')}") from None
    try:
        try:
            is_gzip = raw.peek(2)[:2] == GZIP_MAGIC  # peek, not read: a pipe cannot seek back
        except OSError as e:
            raise LogReadError(f"{source_name(path)}: cannot read ({e.strerror or e})") from None
        yield gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw  # type: ignore[misc]
    finally:
        if raw is not sys.stdin.buffer:
            raw.close()


def read_lines(stream: BinaryIO, source: str, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes | OverlongLine]:
    """The stream's lines without their newline, chunk by chunk (`read1`: a gzip block at a time); at a
    break, the partial line as it is, then TruncatedLog."""
    pending, length, lines_read = bytearray(), 0, 0  # length: the current line's bytes, kept or not
    error: BaseException | None = None
    while True:
        try:
            chunk = stream.read1(CHUNK_BYTES)
        except (OSError, EOFError, zlib.error) as e:
            chunk, error = b"", e
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            lines_read, length = lines_read + 1, length + len(piece)
            yield OverlongLine(length) if length > max_line_bytes else bytes(pending + piece)
            pending.clear()
            length = 0
        length += len(rest)
        if length > max_line_bytes:
            pending.clear()  # too long to be a record: count it, keep nothing
        else:
            pending += rest
        if not chunk:
            break
    if length:
        lines_read += 1
        yield OverlongLine(length) if length > max_line_bytes else bytes(pending)
    if error is not None:
        raise TruncatedLog(f"{source}: the log breaks off after line {lines_read:,} ({error})")
