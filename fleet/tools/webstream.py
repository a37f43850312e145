"""Bounded HTTP streams for `web_fetch`: a byte cap after decoding, and one deadline.

httpx decodes a `Content-Encoding` chain one network chunk at a time, but each layer
inflates its whole input at once: 590 bytes of `gzip, gzip` become 512 MB in one call,
before any cap is checked. Here every layer inflates at most `STEP_BYTES` at a time and is
pulled by the next, so a stopped reader leaves nothing but one step per layer in memory.

httpx's timeouts are per operation (a server sending its headers one byte a second never
trips the read timeout). `Deadline` is one wall-clock limit over connect, headers and body:
when it passes, every socket it saw connect is shut down, which ends any blocked read at
once and tells the server the connection is gone.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from fleet.errors import ToolError

STEP_BYTES = 64 * 1024
"""Most output one decoding layer produces per call."""
ACCEPT_ENCODING = "gzip, deflate"
"""What web_fetch asks for: the encodings decoded here."""
_GZIP_WBITS = zlib.MAX_WBITS | 32  # a gzip or zlib header, detected
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS


def decode_chain(raw: Iterable[bytes], content_encoding: str) -> Iterator[bytes]:
    """The body with every `Content-Encoding` layer undone, lazily, in steps.

    Raises:
        ToolError: an encoding this module does not decode (br, zstd, compress, ...).
    """
    names = [n.strip().lower() for n in content_encoding.split(",") if n.strip()]
    chunks: Iterator[bytes] = iter(raw)
    for name in reversed(names):  # the last encoding applied is the first undone
        if name in ("gzip", "x-gzip", "deflate"):
            chunks = _inflate(chunks, deflate=name == "deflate")
        elif name != "identity":
            raise ToolError(f"the response uses Content-Encoding {name!r}, which is not decoded")
    return chunks


def _inflate(chunks: Iterator[bytes], *, deflate: bool) -> Iterator[bytes]:
    """One layer: at most `STEP_BYTES` out per step, more input only once drained."""
    inflater: Any = None
    for chunk in chunks:
        data = chunk
        while data:
            inflater = inflater or zlib.decompressobj(_wbits(data, deflate=deflate))
            yield from _steps(inflater, data, deflate=deflate)
            # gzip allows several members one after another; deflate is one stream
            data = inflater.unused_data if inflater.eof and not deflate else b""
            inflater = None if inflater.eof else inflater


def _steps(inflater: Any, data: bytes, *, deflate: bool) -> Iterator[bytes]:
    """Feed `data` in, a step out at a time, until it is used up (or the stream ends)."""
    while True:
        try:
            out = inflater.decompress(data, STEP_BYTES)
        except zlib.error as exc:
            name = "deflate" if deflate else "gzip"
            raise ToolError(f"the response body is not valid {name}: {exc}") from None
        if out:
            yield out
        data = inflater.unconsumed_tail
        # a full step may leave output pending inside zlib: ask again, even with no input
        if inflater.eof or (not data and len(out) < STEP_BYTES):
            return


def _wbits(first: bytes, *, deflate: bool) -> int:
    """`deflate` is meant to be zlib-wrapped (RFC 9110) but some servers send it raw."""
    if deflate and len(first) >= 2 and (first[0] & 0x0F != 8 or int.from_bytes(first[:2]) % 31):
        return _RAW_DEFLATE_WBITS
    return _GZIP_WBITS


def capped(chunks: Iterable[bytes], max_bytes: int) -> tuple[bytes, bool]:
    """At most `max_bytes` of `chunks`, and whether there was more; reading stops there."""
    parts: list[bytes] = []
    size = 0
    for chunk in chunks:
        parts.append(chunk[: max_bytes - size])
        size += len(chunk)
        if size > max_bytes:
            return b"".join(parts), True
    return b"".join(parts), False


class Deadline:
    """One wall-clock limit over every connection made under it.

    Pass `trace` as the httpx request extension `"trace"`; it sees each TCP connection as
    httpcore makes it. Use as a context manager: the timer stops on exit.
    """

    def __init__(self, timeout_s: float) -> None:
        """`timeout_s`: seconds from now."""
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._passed = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True

    @property
    def passed(self) -> bool:
        """Whether the deadline fired (every connection was cut)."""
        return self._passed

    def remaining_s(self) -> float:
        """Seconds left, never below a millisecond (httpx reads 0 as "no timeout")."""
        return max(self.at - time.monotonic(), 0.001)

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """The httpcore trace hook: remember each socket as soon as it is connected."""
        if event != "connection.connect_tcp.complete":
            return
        sock = info["return_value"].get_extra_info("socket")
        with self._lock:
            self._sockets.append(sock)
            late = self._passed
        if late:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self._passed = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    """Wake any read blocked on `sock` and send the server a FIN; closing is httpx's job."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already: nothing left to cut
