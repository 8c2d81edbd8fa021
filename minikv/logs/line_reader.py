"""A log's bytes as lines: a file or stdin, plain or gzip, with bounded memory and honest breaks.

Three things a real log does that a plain `for line in open(path)` handles badly:
- it arrives on a pipe (`zcat big.gz | minikv scan-logs -`), which cannot seek back after the
  gzip check: the magic bytes are peeked, never read and rewound;
- it breaks off (a gzip cut short by a full disk, garbage appended after the last member): every
  line before the break is still given out, then `TruncatedLog` says where it stopped;
- it holds a "line" of gigabytes (a binary file, a log with no newlines): a line longer than
  MAX_LINE_BYTES is given out as an `OverlongLine` carrying only its length.
Memory stays at one chunk plus one line however long the log is.
"""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
STDIN = "-"  # the file name that means standard input
CHUNK_BYTES = 1 << 16
MAX_LINE_BYTES = 16 << 20  # a gateway record is a few KiB; 16 MiB is no record


class LogReadError(OSError):
    """The log as a whole cannot be read (missing, a directory, not readable)."""


class TruncatedLog(LogReadError):
    """The log breaks off part way (a truncated or corrupt gzip, trailing garbage, an I/O error).

    Raised only after every line before the break has been given out.
    """

    def __init__(self, message: str, lines_read: int) -> None:
        super().__init__(message)
        self.lines_read = lines_read


@dataclass(frozen=True)
class OverlongLine:
    """A line longer than MAX_LINE_BYTES: skipped, only its length is kept."""

    length: int


def source_name(path: str | Path) -> str:
    """How messages name the log: its path, or 'stdin'."""
    return "stdin" if str(path) == STDIN else str(path)


@contextmanager
def open_log(path: str | Path) -> Iterator[BinaryIO]:
    """Open a log (a path, or '-' for stdin) for reading bytes; gzip is recognised by its magic bytes."""
    if str(path) == STDIN:
        raw, owned = sys.stdin.buffer, False
    else:
        try:
            raw, owned = open(path, "rb"), True
        except FileNotFoundError:
            raise LogReadError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise LogReadError(f"{path}: is a directory, not a log file") from None
        except OSError as e:
            raise LogReadError(f"{path}: cannot open ({e.strerror})") from None
    try:
        try:
            is_gzip = raw.peek(2)[:2] == GZIP_MAGIC  # peek, not read: a pipe cannot seek back
        except OSError as e:
            raise LogReadError(f"{source_name(path)}: cannot read ({e.strerror or e})") from None
        yield gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw  # type: ignore[misc]
    finally:
        if owned:
            raw.close()


def read_lines(stream: BinaryIO, source: str, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes | OverlongLine]:
    """The stream's lines without their newline, chunk by chunk; raises TruncatedLog at a break.

    `read1` asks the gzip layer for one decompressed block at a time, so a break loses no line
    that was complete before it; the partial line at the break is given out as it is.
    """
    pending, dropped, lines_read = bytearray(), 0, 0  # dropped: bytes of an overlong line not kept
    error: BaseException | None = None

    def finish(piece: bytes) -> bytes | OverlongLine:
        nonlocal dropped
        length = dropped + len(pending) + len(piece)
        line = OverlongLine(length) if length > max_line_bytes else bytes(pending + piece)
        pending.clear()
        dropped = 0
        return line

    while True:
        try:
            chunk = stream.read1(CHUNK_BYTES)
        except (OSError, EOFError, zlib.error) as e:
            error, chunk = e, b""
        if not chunk:
            break
        *complete, rest = chunk.split(b"\n")
        if complete:
            lines_read += len(complete)
            yield finish(complete[0])  # the line that began in an earlier chunk
            for piece in complete[1:]:  # whole inside this chunk, so shorter than CHUNK_BYTES
                yield piece if len(piece) <= max_line_bytes else OverlongLine(len(piece))
        if dropped or len(pending) + len(rest) > max_line_bytes:
            dropped += len(pending) + len(rest)  # too long to be a record: count it, keep nothing
            pending.clear()
        else:
            pending += rest
    if pending or dropped:
        lines_read += 1
        yield finish(b"")
    if error is not None:
        raise TruncatedLog(f"{source}: the log breaks off after line {lines_read:,} ({error})", lines_read)
