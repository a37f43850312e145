"""`fleetops.cli.interrupt`: a signal sets a flag, raises nothing, and is never lost."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from fleetops.cli.interrupt import Interrupt, interrupt_flag, keyboard_interrupt


@pytest.fixture
def handlers() -> Iterator[None]:
    """The test process's own handlers, put back whatever the test left installed."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_sets_the_flag_and_raises_nothing(
    handlers: None, signum: signal.Signals, code: int
) -> None:
    with interrupt_flag() as interrupt:
        os.kill(os.getpid(), signum)  # the handler runs before kill returns to Python code
        os.kill(os.getpid(), signal.SIGINT)  # a second one changes nothing
        assert interrupt.is_set()
    assert interrupt.exit_code == code
    # Set: later signals are ignored, so a late Ctrl-C cannot kill the exiting command.
    os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_without_a_signal_the_old_handlers_come_back(handlers: None) -> None:
    before = signal.getsignal(signal.SIGINT)
    with interrupt_flag() as interrupt:
        assert signal.getsignal(signal.SIGINT) == interrupt.handle
    assert not interrupt.is_set()
    assert signal.getsignal(signal.SIGINT) == before


def test_at_a_prompt_ctrl_c_raises_and_sets_the_flag(handlers: None) -> None:
    interrupt = Interrupt()
    with pytest.raises(KeyboardInterrupt), keyboard_interrupt(interrupt):
        os.kill(os.getpid(), signal.SIGINT)
    assert interrupt.is_set() and interrupt.exit_code == 130
