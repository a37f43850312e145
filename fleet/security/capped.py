"""Lines of a hostile byte stream, each capped while it is read (never held past the cap).

A provider's batch output file and an MCP server's stdout are newline-delimited JSON that
anyone at the other end may fill with a line of 150 MiB. `CappedLines` is fed the stream's
chunks as they arrive and hands back whole lines; a line past `max_bytes` is skipped to its
end and handed back as `Oversized`, with only its first and last bytes kept (where a JSON
message names its id), so memory stays bounded by the cap and the work stays linear.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

KEEP_BYTES = 4096
"""Of an oversized line, how much of its start (and of its end) is kept."""


@dataclass(frozen=True)
class Oversized:
    """A line longer than the cap: only its first and last `KEEP_BYTES` were kept."""

    head: bytes
    tail: bytes
    size_bytes: int


class CappedLines:
    """A line splitter with a per-line cap; feed it chunks, take lines."""

    def __init__(self, max_bytes: int) -> None:
        """Lines longer than `max_bytes` come back as `Oversized`."""
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self._head: bytes | None = None  # set while the rest of an oversized line is skipped
        self._tail = b""
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        """The lines `chunk` completes, in order."""
        lines: list[bytes | Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return lines
            lines.append(self._take())
            start = end + 1

    def end(self) -> list[bytes | Oversized]:
        """The last line, if the stream did not end with a newline."""
        return [self._take()] if self._buffer or self._head is not None else []

    def _add(self, piece: bytes) -> None:
        if self._head is None and len(self._buffer) + len(piece) <= self.max_bytes:
            self._buffer += piece
            return
        if self._head is None:  # this piece takes the line past the cap: keep its start only
            self._head = bytes((self._buffer + piece[:KEEP_BYTES])[:KEEP_BYTES])
            self._size = len(self._buffer)
            self._buffer.clear()
        self._size += len(piece)
        self._tail = (self._tail + piece[-KEEP_BYTES:])[-KEEP_BYTES:]

    def _take(self) -> bytes | Oversized:
        line: bytes | Oversized
        if self._head is not None:
            line = Oversized(self._head, self._tail, self._size)
        else:
            line = bytes(self._buffer)
        self._buffer.clear()
        self._head, self._tail, self._size = None, b"", 0
        return line


def capped_lines(chunks: Iterable[bytes], max_bytes: int) -> Iterator[bytes | Oversized]:
    """The lines of a stream of chunks, each capped at `max_bytes` (see `CappedLines`)."""
    splitter = CappedLines(max_bytes)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()
