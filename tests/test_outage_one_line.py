"""Outages the chaos harness met (`make chaos`, seed 38) logged in one line, not a traceback.

- Round 16 (a Redis restart): `fleet.batch_poll` raised redis-py's ConnectionError out of
  the task, and Celery logged "Task fleet.batch_poll raised unexpected" with the frames.
  The next poll goes on by itself; the task now logs one line and returns.
- Round 21 (a Sentinel failover): a spawn whose chord dispatch met the store away logged
  "dispatch of N children ... failed; a sweeper will retry" with the traceback. The
  outbox entry stays and a sweeper sends the children: one line says so.
Anything that is not an outage keeps its traceback.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from fleet.loop import spawning
from workers import batch_poll as poll_module


def _no_traceback(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings, "nothing was logged"
    assert all(r.exc_info is None for r in warnings), [r.getMessage() for r in warnings]
    return warnings


def _failing_poll(exc: Exception) -> Any:
    def poll(runtime: object) -> int:
        raise exc

    return poll


def test_a_batch_poll_that_meets_the_store_away_logs_one_line_and_returns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(poll_module, "get_runtime", lambda: object())
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:32789. Connection refused.")
    monkeypatch.setattr(poll_module, "poll_and_send", _failing_poll(refused))
    with caplog.at_level(logging.WARNING):
        assert poll_module.batch_poll() == 0
    (line,) = _no_traceback(caplog)
    assert "batch poll failed" in line.getMessage() and "Connection refused" in line.getMessage()


def test_a_batch_poll_that_fails_otherwise_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poll_module, "get_runtime", lambda: object())
    monkeypatch.setattr(poll_module, "poll_and_send", _failing_poll(KeyError("a bug")))
    with pytest.raises(KeyError):
        poll_module.batch_poll()


class _Dispatcher:
    children_survive_restart = True

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def dispatch(self, runtime: object, request: object) -> None:
        raise self.exc


def _hand_over(exc: Exception) -> None:
    runtime: Any = SimpleNamespace(dispatcher=_Dispatcher(exc))
    trace: Any = SimpleNamespace(trace_id="20261129T015549-1bdd80")
    request: Any = SimpleNamespace(children=[object()] * 13, tool_call_id="call-1")
    spawning._hand_over(runtime, trace, request)


def test_a_dispatch_that_meets_the_store_away_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        _hand_over(redis.ConnectionError("Connection closed by server."))
    (line,) = _no_traceback(caplog)
    assert "dispatch of 13 children" in line.getMessage() and "store or broker away" in (
        line.getMessage()
    )


def test_a_dispatch_that_fails_otherwise_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        _hand_over(ValueError("a bug"))
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.exc_info is not None


def test_the_batch_polls_result_is_not_stored() -> None:
    # make chaos, seed 40 round 6: Celery stored the poll's result after the body, met the
    # store away there, and logged "Exception raised outside body" with the traceback
    assert poll_module.batch_poll.ignore_result is True


def _window_fails(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> list[str]:
    from fleet.children import after
    from workers import settle, tasks

    settled: list[str] = []
    monkeypatch.setattr(tasks, "start_window", lambda *a, **k: (_ for _ in ()).throw(exc))
    monkeypatch.setattr(after, "owed_after_run", lambda *a, **k: ["end"])
    monkeypatch.setattr(after, "settle_child", lambda runtime, trace_id, by: by)
    monkeypatch.setattr(settle, "apply", settled.append)
    store = SimpleNamespace(get_trace=lambda trace_id: SimpleNamespace(root_trace_id="root"))
    result: Any = SimpleNamespace(trace_id="root@explore-001", outcome="completed")
    tasks.after_run(SimpleNamespace(store=store), result, recovered=False, windowed=True)  # type: ignore[arg-type]
    return settled


def test_a_windowed_runs_next_send_that_meets_the_broker_away_is_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # make chaos, seed 40 round 1 (a RabbitMQ restart): the run task raised kombu's
    # OperationalError out of `after_run`, a traceback, and skipped the settlements after it
    from kombu.exceptions import OperationalError

    with caplog.at_level(logging.WARNING):
        settled = _window_fails(monkeypatch, OperationalError("[Errno 111] Connection refused"))
    assert settled == ["end"]
    (line,) = _no_traceback(caplog)
    assert "window was not sent" in line.getMessage()


def test_a_windowed_runs_next_send_that_fails_otherwise_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(KeyError):
        _window_fails(monkeypatch, KeyError("a bug"))


def test_the_chord_body_retries_a_cluster_master_being_replaced() -> None:
    # make chaos, seed 42 round 34: `fleet.collect` raised ClusterDownError (a Cluster master
    # killed, its replica not promoted yet): a traceback, and the chord body failed
    from workers import tasks

    assert {redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError} <= set(
        tasks.collect.autoretry_for
    )


def test_an_errback_that_meets_the_store_away_is_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # make chaos, seed 42 round 24 (a Sentinel failover): "Errback 'fleet.collect_failed'
    # raised an exception" with the traceback; the outbox's settle entry settles it later
    from fleet.children import after
    from workers import tasks

    def away(*args: object) -> None:
        raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(tasks, "get_runtime", lambda: object())
    monkeypatch.setattr(after, "settle_from_store", away)
    with caplog.at_level(logging.WARNING):
        tasks.collect_failed("root", "call_0_0")
    (line,) = _no_traceback(caplog)
    assert "did not settle it" in line.getMessage()


def test_a_settlement_after_a_run_that_meets_the_store_away_is_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # make chaos, seed 40 round 46 (a Sentinel failover): `after_run`'s settle read the
    # store away and the run task raised ConnectionError, a traceback; the owner check
    # settles the parent of children that all ended
    from fleet.children import after
    from workers import tasks

    def away(*args: object) -> None:
        raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(after, "owed_after_run", lambda *a, **k: ["end"])
    monkeypatch.setattr(after, "settle_child", away)
    result: Any = SimpleNamespace(trace_id="root@explore-001", outcome="completed")
    with caplog.at_level(logging.WARNING):
        tasks.after_run(object(), result, recovered=False, windowed=False)  # type: ignore[arg-type]
    (line,) = _no_traceback(caplog)
    assert "settlement was not made" in line.getMessage()


def test_a_settlement_whose_parent_is_gone_is_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # make chaos, seed 41 round 62: a Cluster master kill took the parent whole; the
    # child's run raised TraceNotFound out of the task (a traceback) settling into it
    from fleet.children import after
    from fleet.errors import TraceNotFound
    from workers import tasks

    def gone(*args: object) -> None:
        raise TraceNotFound("no trace '20261129T024815-a6fc47'")

    monkeypatch.setattr(after, "owed_after_run", lambda *a, **k: ["end"])
    monkeypatch.setattr(after, "settle_child", gone)
    result: Any = SimpleNamespace(
        trace_id="20261129T024815-a6fc47@explore-001", outcome="completed"
    )
    with caplog.at_level(logging.WARNING):
        tasks.after_run(object(), result, recovered=False, windowed=False)  # type: ignore[arg-type]
    (line,) = _no_traceback(caplog)
    assert "no trace" in line.getMessage()
