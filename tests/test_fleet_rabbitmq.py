"""The flows of `test_fleet_recovery` with RabbitMQ as broker; traces and results in Redis.

Skipped when no RabbitMQ answers, unless `CI` is set: there a missing broker fails.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from kombu.connection import Connection

from fleet.client import Fleet
from tests.fleetkit import explore_script, wait_until
from tests.procs import WorkerProcess
from tests.test_fleet_recovery import (
    FAST_RECOVERY,
    RUN_TIMEOUT_S,
    Running,
    TaskEvents,
    assert_collected_once,
    database_url,
    fleet_client,
    running_branches,
    start_workers,
)
from workers.app import QUEUES

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq]

RABBITMQ_URL = os.environ.get("FLEET_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
RABBITMQ_DB = 2
CONNECT_TIMEOUT_S = 2.0


def rabbitmq_answers(url: str) -> bool:
    """Whether an AMQP broker accepts a connection (and our credentials) at `url`."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 5672), CONNECT_TIMEOUT_S).close()
        with Connection(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.connect()
    except OSError:
        return False
    return True


PURGE_WAIT_S = 30.0
"""How long a purge waits for the workers of the module before (they held the broker until
its fixtures ended, and a worker stopping on a loaded machine takes seconds to leave)."""


def purge_fleet_queues(url: str) -> None:
    """Delete the fleet's queues: the vhost outlives test runs, and the workers declare them
    afresh (priority queues: an older declaration without `x-max-priority` would clash).

    Fails if others still consume them after PURGE_WAIT_S."""
    deadline = time.monotonic() + PURGE_WAIT_S
    while True:
        try:
            _delete_fleet_queues(url)
            return
        except Exception as exc:  # py-amqp's PreconditionFailed: a worker still consumes one
            if "PRECONDITION_FAILED" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _delete_fleet_queues(url: str) -> None:
    with Connection(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        channel = conn.channel()
        for name in QUEUES:
            # if_unused: the broker refuses (PRECONDITION_FAILED) while a stray worker consumes it
            channel.queue_delete(name, if_unused=True)
        channel.close()


@pytest.fixture(scope="module")
def broker_url(rabbitmq_to_itself: None) -> str:
    if not rabbitmq_answers(RABBITMQ_URL):
        if os.environ.get("CI"):
            pytest.fail(f"no RabbitMQ answers at {RABBITMQ_URL} (and CI is set)")
        pytest.skip(f"no RabbitMQ answers at {RABBITMQ_URL}")
    purge_fleet_queues(RABBITMQ_URL)
    return RABBITMQ_URL


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, RABBITMQ_DB)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture
def task_events(broker_url: str) -> Iterator[TaskEvents]:
    """Recording from before the test's workers start (their events go through RabbitMQ)."""
    recorder = TaskEvents(broker_url)
    yield recorder
    recorder.close()


def test_a_killed_worker_is_redelivered_by_rabbitmq_and_collected_once(
    broker_url: str, url: str, workspace: Path, tmp_path: Path, task_events: TaskEvents
) -> None:
    # RabbitMQ hands a dead consumer's unacked headers to the survivor at once; they find
    # the dead runner's lease still held and return, and the sweeper's recovery collects.
    model = explore_script(tmp_path / "m.yaml", 20, latency_ms=300, branch_turns=2)
    env = {"FLEET_WORKSPACE": str(workspace), **FAST_RECOVERY}
    with contextlib.ExitStack() as stack:
        mine = start_workers(stack, url, 2, broker_url=broker_url, concurrency=4, env_extra=env)
        conn = stack.enter_context(redis.Redis.from_url(url, decode_responses=True))
        fleet = stack.enter_context(fleet_client(broker_url, url, workspace))
        handle = fleet.submit("survey", model=model)
        victims: list[Running] = []

        def a_worker_runs_branches() -> bool:
            running = running_branches(fleet, conn, mine)
            victims[:] = [r for r in running if r.worker == mine[0].name]
            return bool(victims)

        wait_until(a_worker_runs_branches, RUN_TIMEOUT_S, "branches running on a worker")
        mine[0].kill()
        killed_at = time.monotonic()
        root = handle.wait(timeout_s=RUN_TIMEOUT_S)
        print(
            f"rabbitmq, whole worker killed: root done {time.monotonic() - killed_at:.1f} s later"
        )
        assert_collected_once(fleet, root.trace_id, 20)
        wait_until(
            lambda: all(r.succeeded for r in task_events.runs()), 10, "every run's success event"
        )
        # The chord's header tasks, not the sweepers' recovered runs of the same traces.
        redelivered = {r.trace_id: r for r in task_events.runs() if not r.recovered}
        for victim in victims:  # redelivered at once: the lost lease was still held
            assert redelivered[victim.trace_id].worker not in ("", mine[0].name)
            assert redelivered[victim.trace_id].outcome == "busy"


@pytest.fixture(scope="module")
def workers(broker_url: str, url: str, workspace: Path) -> Iterator[list[WorkerProcess]]:
    env = {"FLEET_WORKSPACE": str(workspace), **FAST_RECOVERY}
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 2, broker_url=broker_url, concurrency=4, env_extra=env)


@pytest.fixture
def fleet(
    broker_url: str, url: str, workspace: Path, workers: list[WorkerProcess]
) -> Iterator[Fleet]:
    with fleet_client(broker_url, url, workspace) as client:
        yield client


def test_an_explore_through_rabbitmq_spreads_over_two_workers(
    fleet: Fleet, workers: list[WorkerProcess], task_events: TaskEvents, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 20, latency_ms=100)
    trace = fleet.submit("survey", model=model).wait(timeout_s=RUN_TIMEOUT_S)
    assert_collected_once(fleet, trace.trace_id, 20)
    branches = set(fleet.store.children(trace.trace_id))
    wait_until(
        lambda: all(r.succeeded for r in task_events.runs()), 10, "every run's success event"
    )
    ran_on = {r.trace_id: r.worker for r in task_events.runs() if r.trace_id in branches}
    assert set(ran_on) == branches
    assert set(ran_on.values()) == {w.name for w in workers}


def test_a_raising_branch_through_rabbitmq_leaves_its_siblings(
    fleet: Fleet, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", 20, fail=7)
    trace = fleet.submit("survey", model=model).wait(timeout_s=RUN_TIMEOUT_S)
    assert trace.status == "completed", trace.error
    collaborators = fleet.store.collaborators(trace.trace_id)
    statuses = [c.status for c in collaborators]
    assert statuses.count("completed") == 19 and statuses.count("failed") == 1
    (failed,) = [c for c in collaborators if c.status == "failed"]
    assert failed.name and "branch exploded" in failed.summary
    assert len([m for m in fleet.store.messages(trace.trace_id) if m.role == "tool"]) == 1
