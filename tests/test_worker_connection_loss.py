"""A connection loss in Celery's parts of a worker: cancels only where the pool can, one line.

Found by bench/chaos.py (a Redis broker restarted under a threads worker): Celery's cancel
of each acks-late run in flight raised NotImplementedError from the threads pool, and the
worker logged a traceback per run per loss. A thread cannot be ended; the run goes on
under its lease, and its redelivered message finds the lease held and returns.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import redis
from amqp.exceptions import RecoverableConnectionError  # type: ignore[import-untyped]
from kombu.message import Message

from workers import patches
from workers.app import app
from workers.patches import chord_join
from workers.patches.result_backend import SendOnlyRedisBackend
from workers.signals import _no_cancel_where_the_pool_cannot

SETTING = "worker_cancel_long_running_tasks_on_connection_loss"
CONNECTION_ERRORS = (RecoverableConnectionError, redis.ConnectionError, OSError)
"""What a Celery request's `connection_errors` holds (pyamqp's and Redis's)."""
BACKEND = SendOnlyRedisBackend.__new__(SendOnlyRedisBackend)
"""No connection made: the part's script is replaced in these tests."""


@pytest.mark.parametrize(("pool", "cancels"), [("threads", False), ("prefork", True)])
def test_runs_are_cancelled_on_a_connection_loss_only_by_a_pool_that_can(
    pool: str, cancels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.conf, SETTING, True)
    _no_cancel_where_the_pool_cannot(sender=SimpleNamespace(pool_cls=pool, app=app))
    assert app.conf[SETTING] is cancels


def test_a_chord_part_the_store_could_not_count_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by bench/chaos.py on a Sentinel failover: the join's script met the store away,
    # and Celery logged the traceback "outside body" (then went on, as it does here).
    def away(*args: object) -> None:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    monkeypatch.setattr(chord_join, "is_fleet_join", lambda chord: True)
    monkeypatch.setattr(chord_join, "part_returned", away)
    request = SimpleNamespace(id="task-1", chord={"task": "fleet.collect"})
    BACKEND.on_chord_part_return(request, "SUCCESS", None)
    (record,) = caplog.records
    assert record.getMessage().startswith("chord part task-1 not counted (store or broker away")
    assert record.exc_info is None


def test_any_other_failure_of_a_chord_part_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise KeyError("group")

    monkeypatch.setattr(chord_join, "is_fleet_join", lambda chord: True)
    monkeypatch.setattr(chord_join, "part_returned", broken)
    request = SimpleNamespace(id="task-1", chord={"task": "fleet.collect"})
    with pytest.raises(KeyError):
        BACKEND.on_chord_part_return(request, "SUCCESS", None)


class _ClosedChannel:
    """An AMQP channel of a connection the broker's restart closed."""

    no_ack_consumers = None

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        raise RecoverableConnectionError("connection already closed")


@pytest.mark.parametrize("patched", [True, False])
def test_an_ack_after_a_broker_restart_is_one_line_not_a_critical_traceback(
    patched: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by bench/chaos.py: after a broker restart Celery's acks-late ack met the closed
    # connection and kombu logged CRITICAL "Couldn't ack ..." with its traceback.
    patches.configure([] if patched else ["kombu-broker-loss"])
    try:
        message = Message(body="{}", delivery_tag="tag-7", channel=_ClosedChannel())
        message.ack_log_error(logging.getLogger("celery.worker.request"), CONNECTION_ERRORS)
    finally:
        patches.configure(())
    (record,) = caplog.records
    if not patched:  # kombu as it is: what the harness counted
        assert record.levelname == "CRITICAL" and record.exc_info is not None
        return
    assert record.levelname == "WARNING" and record.exc_info is None
    assert record.getMessage().startswith("broker connection lost: ack of 'tag-7' skipped")
    assert "RecoverableConnectionError: connection already closed" in record.getMessage()
