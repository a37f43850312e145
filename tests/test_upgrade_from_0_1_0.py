"""From 0.1.0 to 0.2.0: the one stop-the-world upgrade (docs/operations.md, "Upgrading").

Release 0.1.0 (`tests.previous.RELEASE_0_1_0`) predates the rules between releases and the
run state (`fleet/runstate.py`, `r:{name}` fields of the trace hash), and refuses any field
it does not know. What must hold across that boundary: trees 0.1.0 finished (packed by its
compaction or not) and trees its client queued while the workers were stopped are, after
`fleet migrate`, read and run to the end by this checkout's workers, each branch collected
once; and a 0.1.0 worker left running beside newer data refuses every tree the newer
release writes (it fails it, one validation line) rather than running it wrongly. On Redis
as broker and on RabbitMQ. (Releases from 0.2.0 on roll: tests/test_mixed_versions.py.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.client import Fleet
from fleet.storage import keys
from fleet.storage.compaction import PACKED_FIELD
from tests.fleetkit import explore_script
from tests.previous import RELEASE_0_1_0, Release
from tests.procs import start_worker, wait_for_workers
from tests.releasekit import (
    BROKERS,
    broker_url,
    current_migrates,
    ended_root,
    installed,
    release_compacts,
    release_runs,
    release_submits,
    release_worker,
    store_url,
    worker_env,
)
from tests.test_fleet_recovery import (
    RUN_TIMEOUT_S,
    assert_collected_once,
    begin_shutdown,
    fleet_client,
)

# Several CLI, worker and fleet processes a test: minutes, not seconds, on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BRANCHES = 8


@pytest.fixture(scope="module")
def first() -> Release:
    return installed(RELEASE_0_1_0)


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    yield from broker_url(request, redis_url)


@pytest.fixture
def url(redis_url: str, broker: str) -> str:
    return store_url(redis_url)


@pytest.fixture
def conn(url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(url, decode_responses=True) as c:
        yield c


def test_a_stop_the_world_upgrade_from_0_1_0_finishes_every_tree_it_left(
    first: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", BRANCHES, latency_ms=100, branch_turns=2)
    with contextlib.ExitStack() as stack:
        old = release_worker(stack, first, url, broker, tmp_path)
        wait_for_workers(broker, [old.name], timeout_s=60)
        finished = [ended_root(release_runs(first, url, broker, tmp_path, model))]
        finished.append(ended_root(release_runs(first, url, broker, tmp_path, model)))
        release_compacts(first, url, finished[0], "fleet.storage.redis_compact")
        old.stop()
    # The workers are stopped: what the 0.1.0 client queues now waits in the broker.
    queued = release_submits(first, url, broker, tmp_path, model)
    assert "lifted the run state of" in current_migrates(url, tmp_path)
    with contextlib.ExitStack() as stack:
        new = stack.enter_context(
            start_worker(url, broker_url=broker, env_extra=worker_env(tmp_path))
        )
        stack.callback(begin_shutdown, [new])
        wait_for_workers(broker, [new.name], timeout_s=60)
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        assert fleet.wait(queued, timeout_s=RUN_TIMEOUT_S).status == "completed"
        assert conn.hexists(keys.trace(finished[0]), PACKED_FIELD), "0.1.0 packed it"
        for tree in (*finished, queued):
            assert_collected_once(fleet, tree, BRANCHES)


def test_a_0_1_0_worker_left_running_refuses_every_tree_0_2_0_writes(
    first: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    # Why 0.1.0 -> 0.2.0 stops the world: every trace 0.2.0 creates carries its run state
    # (`r:schema_version` at least), a field 0.1.0 does not know. A 0.1.0 worker that takes
    # such a run fails that trace in one validation line; it never runs it half-understood.
    model = explore_script(tmp_path / "m.yaml", 2, latency_ms=50)
    with contextlib.ExitStack() as stack:
        old = release_worker(stack, first, url, broker, tmp_path)
        wait_for_workers(broker, [old.name], timeout_s=60)
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        plain = fleet.submit("survey", model=model)
        refused = plain.wait(timeout_s=RUN_TIMEOUT_S)
        assert refused.status == "failed" and "r:schema_version" in (refused.error or "")
        assert refused.answer is None and not fleet.trace(plain.trace_id).run.stop_reason
        assert "Extra inputs are not permitted" in old.log()
