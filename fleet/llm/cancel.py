"""A model call's cancel handle: another thread closes the call's connection.

`fleet.loop.cut` runs a model call inside `cancelling(handle)` (in the run's own thread
when its client ends on a cancel, `LLMClient.ends_on_cancel`); a stop or an interrupting
message then calls `handle.cancel()` from the watcher's thread. The HTTP clients
(`fleet.llm.transport`) find the handle in the call's context: every connection the call
reads or writes is claimed by it, and `cancel()` shuts that connection down
(`shutdown(SHUT_RDWR)`): the blocked read returns at once and the provider sees the client
go (its request is cancelled, not answered and billed in full). A plain `close()` from
another thread would not do: on Linux it leaves the blocked read waiting for the answer
(measured with httpx 0.28: the call went on to its end, the server saw nothing).

A wait inside the call (a retry's backoff, the scripted model's latency) is `pause(s)`:
it ends at the cancel (`CallCancelled`), so a cancelled call neither waits nor retries.

A call that holds no connection of its own (an MCP request on a session many calls share)
registers what abandons it instead (`on_cancel`): the cut runs it, outside the lock.

A connection goes back to the pool when its call ends; a later call claims it again, so a
late cancel never shuts down a connection another call is using (claims and shutdowns
happen under one lock). A client without a handle in its context (a call outside the
loop) claims nothing and is never cut.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from fleet.errors import FleetError


class CallCancelled(FleetError):
    """Raised in a cancelled call's own thread: its connection was closed on purpose."""


class Shuttable(Protocol):
    """A connection a handle can shut down (`fleet.llm.transport`'s stream)."""

    owner: Cancel | None
    """The call using it now (set under `_LOCK`); None between calls."""

    def shut(self) -> None:
        """Shut the socket down both ways; never raises."""


_LOCK = threading.Lock()
"""Claims and shutdowns of every handle: a claim never races a late cancel."""


class Cancel:
    """One call's cancel handle: `cancel()` from any thread, once or more."""

    def __init__(self) -> None:
        """A handle not cancelled, holding no connection."""
        self._cancelled = False
        self._open = True
        self._held: list[Shuttable] = []
        self._abandons: list[Callable[[], object]] = []
        self._woken: threading.Event | None = None
        """Set by `cancel()`; made by the first `wait` (most calls never wait)."""

    @property
    def cancelled(self) -> bool:
        """`cancel()` was called."""
        return self._cancelled

    def cancel(self) -> int:
        """Shut down every connection the call still holds; later claims fail. How many."""
        with _LOCK:
            self._cancelled = True
            mine = [c for c in self._held if c.owner is self]
            for connection in mine:
                connection.shut()
            abandons, self._abandons = self._abandons, []
            woken = self._woken
        if woken is not None:
            woken.set()
        for abandon in abandons:
            abandon()
        return len(mine) + len(abandons)

    def wait(self, seconds: float) -> bool:
        """Wait `seconds`, or less if `cancel()` comes first; True: it was cancelled."""
        with _LOCK:
            if self._cancelled:
                return True
            if self._woken is None:
                self._woken = threading.Event()
            woken = self._woken
        return woken.wait(seconds)

    def on_cancel(self, abandon: Callable[[], object]) -> Callable[[], None]:
        """Run `abandon` when the call is cancelled (at once if it is); returns its removal.

        For a request on a shared connection, which a shutdown would cut for every caller:
        `abandon` ends that one request (its peer told), and never raises.
        """
        with _LOCK:
            if not self._cancelled:
                self._abandons.append(abandon)
                return lambda: self._forget(abandon)
        abandon()
        return lambda: None

    def _forget(self, abandon: Callable[[], object]) -> None:
        with _LOCK:
            if abandon in self._abandons:
                self._abandons.remove(abandon)

    def claim(self, connection: Shuttable) -> None:
        """The call is about to use `connection`: raise `CallCancelled` if it is cut."""
        with _LOCK:
            if self._cancelled:
                raise CallCancelled("the model call was cancelled")
            if connection.owner is not self and self._open:
                connection.owner = self
                self._held.append(connection)

    def release(self) -> None:
        """The call ended: its connections belong to no call until the next claims them."""
        with _LOCK:
            self._open = False
            for connection in self._held:
                if connection.owner is self:
                    connection.owner = None
            self._held.clear()
            self._abandons.clear()


def unclaimed(connection: Shuttable) -> None:
    """`connection` is used outside any cancellable call: no handle may shut it."""
    with _LOCK:
        connection.owner = None


_CURRENT: ContextVar[Cancel | None] = ContextVar("fleet_call_cancel", default=None)


def current() -> Cancel | None:
    """The handle of the call running in this context, if it may be cancelled."""
    return _CURRENT.get()


def check() -> None:
    """Raise `CallCancelled` if this context's call was cancelled (before a retry)."""
    handle = _CURRENT.get()
    if handle is not None and handle.cancelled:
        raise CallCancelled("the model call was cancelled")


def pause(seconds: float) -> None:
    """Sleep `seconds`; `CallCancelled` at once if this context's call is cancelled."""
    handle = _CURRENT.get()
    if handle is None:
        time.sleep(seconds)
    elif handle.wait(seconds):
        raise CallCancelled("the model call was cancelled")


@contextmanager
def cancelling(handle: Cancel) -> Iterator[Cancel]:
    """Run the block as the call `handle` cancels; its connections are released after."""
    token = _CURRENT.set(handle)
    try:
        yield handle
    finally:
        _CURRENT.reset(token)
        handle.release()


@contextmanager
def abandoning(abandon: Callable[[], object]) -> Iterator[None]:
    """Run the block with `abandon` as what a cut of this context's call does, if any.

    For a request on a connection other calls share (`Cancel.on_cancel`).
    """
    handle = _CURRENT.get()
    forget = handle.on_cancel(abandon) if handle is not None else None
    try:
        yield
    finally:
        if forget is not None:
            forget()


def bind(handle: Cancel) -> None:
    """Make `handle` the cancel handle of the calls made in this context from now on.

    For a context made for one call (`contextvars.copy_context()`, then `run(bind, ...)`
    and `run(call)`); the caller releases the handle when the call ends.
    """
    _CURRENT.set(handle)


def shut_socket(sock: socket.socket) -> None:
    """`shutdown(SHUT_RDWR)` as the plain socket does it, never raising.

    An `ssl.SSLSocket`'s own `shutdown` drops its SSL object first, and the reading thread
    would then fail with a `ValueError` instead of seeing the connection end.
    """
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed or never connected: nothing to cut
        pass
