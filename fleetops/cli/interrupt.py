"""Ctrl-C and SIGTERM while a command follows a trace: a flag the loop reads, no exception.

Python turns SIGINT into a KeyboardInterrupt raised in whatever bytecode runs when the
signal lands. If that is a destructor (redis-py's `Pipeline.__del__` resets its
connection), the interpreter prints "Exception ignored in ..." and drops the exception:
the command never learns it was interrupted and follows the tree to its end. A handler
that only sets a `threading.Event` cannot be lost that way; the follow loop polls it
between short blocking reads.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupt:
    """Set by the first SIGINT or SIGTERM; later ones change nothing."""

    def __init__(self) -> None:
        """Not set, no signal seen."""
        self.event = threading.Event()
        self.signum: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: remember the first signal and set the event, nothing more."""
        if self.signum is None:
            self.signum = signum
        self.event.set()

    def is_set(self) -> bool:
        """Whether a signal arrived."""
        return self.event.is_set()

    @property
    def exit_code(self) -> int:
        """The shell's convention, 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM."""
        return 128 + (self.signum or signal.SIGINT)


@contextlib.contextmanager
def interrupt_flag() -> Iterator[Interrupt]:
    """Within the block, SIGINT and SIGTERM set the returned flag.

    The old handlers come back after the block unless the flag was set. Then the command
    is on its way out with its own exit code, and both signals are ignored (SIG_IGN) from
    there on: a second Ctrl-C a moment later must not become a KeyboardInterrupt, nor,
    since Python's finalisation resets its own handlers to SIG_DFL, kill the process
    mid-exit (seen: exit -2 instead of 130). Off the main thread (where Python cannot
    install handlers) nothing changes and the flag is never set.
    """
    interrupt = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    previous = {signum: signal.signal(signum, interrupt.handle) for signum in SIGNALS}
    try:
        yield interrupt
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if interrupt.is_set() else handler)


@contextlib.contextmanager
def keyboard_interrupt(interrupt: Interrupt) -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt again inside the block, and sets `interrupt` too.

    For a blocking `input()`: a handler that returns lets the read go on (PEP 475), so the
    prompt would ignore Ctrl-C until Enter. Off the main thread, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_it(signum: int, frame: FrameType | None) -> None:
        interrupt.handle(signum, frame)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, raise_it)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
