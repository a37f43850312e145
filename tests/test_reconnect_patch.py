"""`consumer-reconnect` (workers/patches/reconnect.py): a lost broker retried 1-2 s apart.

Upstream first (every patch off): Celery's consumer calls kombu's `ensure_connection`
without intervals, so kombu's 2 s, then 4, 6, ... 30 s apart apply: after a Sentinel
failover a worker took no task for up to 30 s after the new master was there. Then the
patch: the same call against a port nobody listens on tries again 1 s, then 2 s later.
"""

from __future__ import annotations

import inspect
import re
import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.worker.consumer.consumer import Consumer
from kombu.connection import Connection

from workers import patches
from workers.patches.reconnect import RECONNECT_MAX_S, RECONNECT_START_S

TRIES = 3


@pytest.fixture
def upstream() -> Iterator[None]:
    """Every patch off in this process (Celery and kombu as shipped), all on again after."""
    patches.configure(["all"])
    try:
        yield
    finally:
        patches.configure(())


def dead_url() -> str:
    with socket.socket() as probe:  # a free port: nothing listens there once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def waits_between_tries(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The consumer's waits, as its log says them ("Trying again in 2.00 seconds...")."""
    app = Celery("reconnect-test", set_as_current=False)
    app.conf.broker_connection_max_retries = TRIES - 1
    consumer = SimpleNamespace(app=app, first_connection_attempt=False)
    consumer.broker_connection_retry_attempt = 0
    conn = Connection(dead_url(), connect_timeout=1)
    with caplog.at_level("ERROR"), pytest.raises(Exception):  # noqa: B017, PT011
        Consumer.ensure_connected(consumer, conn)
    conn.release()
    app.close()
    return [float(s) for s in re.findall(r"Trying again in ([0-9.]+) seconds?", caplog.text)]


def test_upstream_the_consumer_waits_kombus_growing_intervals(
    upstream: None, caplog: pytest.LogCaptureFixture
) -> None:
    defaults = inspect.signature(Connection._ensure_connection).parameters
    assert [defaults[n].default for n in ("interval_start", "interval_step", "interval_max")] == [
        2,
        2,
        30,
    ]
    assert waits_between_tries(caplog) == [2.0, 4.0]


def test_patched_the_consumer_tries_again_within_two_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    patches.configure(())
    assert "consumer-reconnect" in patches.installed()
    assert waits_between_tries(caplog) == [RECONNECT_START_S, RECONNECT_MAX_S]
