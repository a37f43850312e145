"""A store that is away is one log line from a worker's background loops, not a traceback.

Found by bench/chaos.py: every Sentinel failover left ~30 tracebacks of redis-py frames
(heartbeat, sweeps) in each worker's log, which hid the one traceback that is a defect.
"""

from __future__ import annotations

import logging
import time

import pytest
import redis

from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.leases import LeaseKeeper
from fleet.storage.outage import is_outage, warn_failed
from fleet.testing import MemoryStore

log = logging.getLogger("tests.outage")


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused."),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.sentinel.MasterNotFoundError("No master found for 'fleetmaster'"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
)
def test_an_outage_is_one_line_naming_it(exc: Exception, caplog: pytest.LogCaptureFixture) -> None:
    assert is_outage(exc)
    try:
        raise exc
    except Exception:
        warn_failed(log, "%s failed", "sweep_once")
    (record,) = caplog.records
    assert record.exc_info is None
    assert record.getMessage().startswith("sweep_once failed (store or broker away: ")
    assert "\n" not in record.getMessage()


def test_any_other_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not is_outage(KeyError("x"))
    try:
        raise KeyError("x")
    except KeyError:
        warn_failed(log, "heartbeat failed")
    (record,) = caplog.records
    assert record.exc_info is not None


class AwayStore(MemoryStore):
    def beat(self, *args: object, **kwargs: object) -> list[bool]:
        raise redis.ConnectionError("Connection closed by server.")


def test_the_heartbeat_logs_a_store_away_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "fleet.storage.leases")
    keeper = LeaseKeeper(AwayStore(), ttl_ms=100)  # a beat every 20 ms
    with keeper.hold("t1", "me"):
        deadline_s = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline_s:
            time.sleep(0.02)
    keeper.stop()
    assert caplog.records, "the heartbeat never beat"
    record = caplog.records[0]
    assert record.getMessage().startswith("heartbeat failed (store or broker away: ")
    assert record.exc_info is None


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
        redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.ConnectionError("Connection closed by server."),
    ],
)
def test_a_cluster_or_sentinel_failing_over_interrupts_a_run_not_fails_it(
    exc: Exception,
) -> None:
    # Found by bench/chaos.py: a Cluster master killed, a branch's write met CLUSTERDOWN
    # while its replica was promoted, and the run was failed as "crashed".
    assert RedisStore.unavailable(RedisStore.__new__(RedisStore), exc)
    assert not RedisStore.unavailable(
        RedisStore.__new__(RedisStore), redis.ResponseError("WRONGTYPE")
    )


def test_the_remote_watcher_logs_a_failover_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by bench/chaos.py (seed 39, round 0): a Sentinel failover, and the remote
    # poller's "remote poll failed" came with 40 lines of redis-py's frames.
    from workers import remote_poll

    def away(*args: object) -> list[str]:
        raise redis.sentinel.MasterNotFoundError("No master found for 'fleetmaster'")

    monkeypatch.setattr(remote_poll, "get_runtime", lambda: None)
    monkeypatch.setattr(remote_poll, "claim_due", away)
    caplog.set_level(logging.WARNING, "workers.remote_poll")
    poller = remote_poll.RemotePoller(interval_s=0.01)
    poller.start()
    deadline_s = time.monotonic() + 10
    while not caplog.records and time.monotonic() < deadline_s:
        time.sleep(0.02)
    poller.stop()
    assert caplog.records, "the watcher never looked"
    record = caplog.records[0]
    assert record.getMessage().startswith("remote watch failed (store or broker away: ")
    assert record.exc_info is None


def test_a_remote_follow_that_met_the_broker_away_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its task's exception, not the one being handled (a chaos run: a RabbitMQ restart as
    # the answered child was sent printed kombu's chained frames).
    import asyncio
    import contextlib

    import kombu.exceptions

    from workers.remote_poll import RemotePoller

    async def send() -> None:
        raise kombu.exceptions.OperationalError("[Errno 111] Connection refused")

    async def ended() -> asyncio.Task[None]:
        task = asyncio.create_task(send())
        with contextlib.suppress(kombu.exceptions.OperationalError):
            await task
        return task

    task = asyncio.run(ended())
    RemotePoller(1.0)._done("c1", task)
    (record,) = caplog.records
    assert record.exc_info is None
    assert record.getMessage().startswith(
        "follow of remote child 'c1' failed (store or broker away: OperationalError"
    )


def test_a_cluster_out_of_redirections_is_a_store_away_not_a_crash() -> None:
    # redis-py's ClusterError("TTL exhausted.") after MOVED/ASK/TRYAGAIN while slots move (a
    # chaos run's slot migration: three branches failed "crashed" on it).
    from fleet.storage.backends.redis.store import RedisStore
    from tests.conftest import fake_redis

    store = RedisStore(fake_redis())
    assert store.unavailable(redis.exceptions.ClusterError("TTL exhausted."))
    assert is_outage(redis.exceptions.ClusterError("TTL exhausted."))
    assert not store.unavailable(redis.exceptions.ClusterError("a bug of ours"))
    assert not is_outage(redis.exceptions.ClusterError("a bug of ours"))
