"""The HTTP client of the model clients: pooled, and cut by a call's cancel handle.

`cuttable_client(timeout_s)` is the `httpx.Client(timeout=timeout_s)` httpx builds (the
environment's proxies included), whose connection pools open every connection through
`CutBackend`: each read and write claims the connection for the call running in that
context (`fleet.llm.cancel`), so the call's `Cancel.cancel()` can shut it down from
another thread; a new connection's DNS lookup and connect, which no shutdown reaches, run
in a thread the cancel abandons (`_connecting`). Keep-alive is kept: a connection goes back
to the pool after its call.
HTTP/1.1 only (httpx's default): a connection carries one request at a time, so shutting
it down cuts that call alone (an HTTP/2 connection would carry other calls' streams too).

httpx has no public seam for this. It relies on httpx 0.28 / httpcore 1.0 internals:
`Client._transport` and `Client._mounts` (the transports), `HTTPTransport._pool` (an
`httpcore.ConnectionPool`, or its `HTTPProxy`/`SOCKSProxy` subclass) and the pool's
`_network_backend`, which the pool hands to every connection it creates.
tests/test_llm_cancel.py asserts each of them on httpx itself, so an upgrade that changes
one fails there first; at run time a transport without them is left as built (a cut then
abandons the call, as before this module) and logged once.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any

import httpcore
import httpx

from fleet.llm.cancel import CallCancelled, Cancel, check, current, shut_socket, unclaimed

log = logging.getLogger(__name__)


class CutStream(httpcore.NetworkStream):
    """A connection claimed, on each use, by the call using it."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        """Wrap `inner` (a TCP or TLS stream of httpcore's own backend)."""
        self._inner = inner
        self.owner: Cancel | None = None

    def _claim(self) -> None:
        handle = current()
        if handle is not None:
            handle.claim(self)  # CallCancelled: httpcore closes the connection
        elif self.owner is not None:
            unclaimed(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Read as httpcore's stream does, once the call has claimed the connection."""
        self._claim()
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Write as httpcore's stream does, once the call has claimed the connection."""
        self._claim()
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        """Close the connection."""
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        """Itself, now over TLS: cut the same way, its handshake too.

        The same object (httpcore uses the stream returned, never the one before): the
        call's claim of it holds the TLS socket once the handshake is done.
        """
        self._claim()
        self._inner = self._inner.start_tls(ssl_context, server_hostname, timeout)
        return self

    def get_extra_info(self, info: str) -> Any:
        """As httpcore's stream answers."""
        return self._inner.get_extra_info(info)

    def shut(self) -> None:
        """Shut the socket down both ways: a blocked read returns, the peer sees EOF."""
        sock = self._inner.get_extra_info("socket")
        if sock is not None:
            shut_socket(sock)


class CutBackend(httpcore.NetworkBackend):
    """httpcore's network backend whose streams are `CutStream`s."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        """Open connections through `inner`."""
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """A new connection, unless the call is cancelled first (`_connecting`)."""
        check()
        return _connecting(
            lambda: self._inner.connect_tcp(
                host, port, timeout, local_address=local_address, socket_options=socket_options
            )
        )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """A new connection over a Unix socket, unless the call is cancelled first."""
        check()
        return _connecting(
            lambda: self._inner.connect_unix_socket(path, timeout, socket_options=socket_options)
        )

    def sleep(self, seconds: float) -> None:
        """As the inner backend sleeps."""
        self._inner.sleep(seconds)


def _connecting(connect: Callable[[], httpcore.NetworkStream]) -> CutStream:
    """`connect()`'s stream, or `CallCancelled` at once if the call is cancelled meanwhile.

    A DNS lookup or a TCP connect cannot be cut from another thread (only an open socket
    can be shut), so for a call that may be cancelled it runs in a thread of its own: once
    per new connection (a kept-alive one is reused without). An abandoned connect closes
    the stream it opens.
    """
    handle = current()
    if handle is None:
        return CutStream(connect())
    box: dict[str, Any] = {}
    lock, done = threading.Lock(), threading.Event()

    def target() -> None:
        try:
            box["stream"] = connect()
        except BaseException as exc:  # raised in the call's thread
            box["error"] = exc
        with lock:
            done.set()
            abandoned = "abandoned" in box
        if abandoned and "stream" in box:
            box["stream"].close()

    forget = handle.on_cancel(done.set)
    threading.Thread(target=target, name="fleet-connect", daemon=True).start()
    try:
        done.wait()
    finally:
        forget()
    with lock:
        if "stream" not in box and "error" not in box:
            box["abandoned"] = True
            raise CallCancelled("the model call was cancelled")
    if "error" in box:
        raise box["error"]
    return CutStream(box["stream"])


_warned: list[bool] = []


def arm(client: httpx.Client) -> int:
    """Route every pool of `client` through `CutBackend`; how many pools were armed."""
    armed = 0
    transports = [client._transport, *client._mounts.values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, CutBackend):
            armed += 1
        elif isinstance(backend, httpcore.NetworkBackend):
            pool._network_backend = CutBackend(backend)  # type: ignore[union-attr]
            armed += 1
        elif transport is not None and not _warned:
            _warned.append(True)
            log.warning(
                "httpx %s: no connection pool to cut in %r; a stopped call runs to its end",
                httpx.__version__,
                type(transport).__name__,
            )
    return armed


def is_cut(client: httpx.Client) -> bool:
    """Every connection `client` opens goes through `CutBackend`: a cancel ends its calls."""
    transports = [client._transport, *client._mounts.values()]
    return all(
        isinstance(getattr(getattr(t, "_pool", None), "_network_backend", None), CutBackend)
        for t in transports
        if t is not None
    )


def cuttable_client(timeout_s: float) -> httpx.Client:
    """`httpx.Client(timeout=timeout_s)` whose calls a `Cancel` can cut."""
    client = httpx.Client(timeout=timeout_s)
    arm(client)
    return client
