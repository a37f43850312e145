"""No tree is left without an owner: worker processes heal or end what nothing would move.

Each case builds a tree whose messages are gone (a chord the broker accepted and lost, a
root whose task never went out, the stuck tree of issue 23: a stop during the root's model
call, its branches born after it and their tasks discarded) and waits for the owner check
of a real worker to find it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.client import Fleet
from fleet.conversation.roots import TaskSpec, create_root
from fleet.loop.runner import Runner
from fleet.runtime import Runtime
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import RecordingDispatcher, fleet_settings, wait_until
from tests.procs import WorkerProcess, start_worker, wait_for_workers
from tests.test_fleet_recovery import (
    FAST_RECOVERY,
    assert_collected_once,
    database_url,
    fleet_client,
    survey_script,
)

pytestmark = pytest.mark.integration

OWNERS_DB = 6
"""A database of its own: no other module's worker sweeps here."""
STUCK_AFTER_S = 1.0
HEALED_WITHIN_S = 30.0
"""Issue 23: an unowned trace is healed or failed within 30 s at defaults; here the check
runs with a 1 s quiet period, so this bound is generous."""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, OWNERS_DB)


@pytest.fixture(scope="module")
def worker(url: str, workspace: Path) -> Iterator[WorkerProcess]:
    env = {
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_STUCK_AFTER_S": str(STUCK_AFTER_S),
        "FLEET_OWNER_CHECK_INTERVAL_S": "0.5",
        **FAST_RECOVERY,
    }
    with start_worker(url, concurrency=8, env_extra=env) as process:
        wait_for_workers(url, [process.name], timeout_s=60)
        yield process


@pytest.fixture
def fleet(url: str, workspace: Path, worker: WorkerProcess) -> Iterator[Fleet]:
    with fleet_client(url, url, workspace) as client:
        yield client


def losing_runtime(url: str, workspace: Path) -> Runtime:
    """A runtime whose broker takes every chord and loses it."""
    store = RedisStore.from_url(url)
    dispatcher = RecordingDispatcher(children_survive_restart=True)
    return Runtime.build(fleet_settings(url, workspace), store, dispatcher)


def stuck_count(url: str) -> int:
    with redis.Redis.from_url(url, decode_responses=True) as conn:
        return int(conn.hget(keys.COUNTERS, "stuck_traces") or 0)


def spawn_and_lose(fleet: Fleet, url: str, workspace: Path, model: str) -> str:
    root = create_root(fleet.runtime, TaskSpec(task="survey", model=model))
    spawner = losing_runtime(url, workspace)
    try:
        assert Runner(spawner).run(root.trace_id).outcome == "waiting"
    finally:
        assert isinstance(spawner.store, RedisStore)
        spawner.store.close()
    children = fleet.store.children(root.trace_id)
    assert children and {fleet.trace(c).status for c in children} == {"queued"}
    return root.trace_id


def test_a_lost_chord_is_resent_and_the_tree_completes_once(
    fleet: Fleet, url: str, workspace: Path, tmp_path: Path
) -> None:
    before = stuck_count(url)
    root_id = spawn_and_lose(fleet, url, workspace, survey_script(tmp_path / "m.yaml", 4, 50))
    trace = fleet.wait(root_id, timeout_s=HEALED_WITHIN_S)
    assert_collected_once(fleet, trace.trace_id, 4)
    assert stuck_count(url) >= before + 4, "each lost branch counted once at least"


def test_a_root_whose_task_never_went_out_runs(fleet: Fleet, url: str, tmp_path: Path) -> None:
    model = survey_script(tmp_path / "m.yaml", 2, 50)
    root = create_root(fleet.runtime, TaskSpec(task="survey", model=model))  # never enqueued
    trace = fleet.wait(root.trace_id, timeout_s=HEALED_WITHIN_S)
    assert_collected_once(fleet, trace.trace_id, 2)


@pytest.mark.parametrize(
    "branches_were",
    [
        "queued",  # issue 23: a stop during the root's call, the branches' tasks discarded
        "running",  # their runners died and a Redis SIGKILL took their leases with it
    ],
)
def test_a_stopped_tree_nothing_runs_ends_stopped(
    fleet: Fleet, url: str, workspace: Path, tmp_path: Path, branches_were: str
) -> None:
    root_id = spawn_and_lose(fleet, url, workspace, survey_script(tmp_path / "m.yaml", 6, 50))
    for child in fleet.store.children(root_id):
        fleet.store.update_trace(
            child, status="running" if branches_were == "running" else "queued"
        )
    for trace_id in [root_id, *fleet.store.children(root_id)]:
        fleet.store.request_stop(trace_id)  # the flags a stop leaves; their tasks discarded
    trace = fleet.wait(root_id, timeout_s=HEALED_WITHIN_S)
    assert trace.status == "stopped"
    children = [fleet.trace(c) for c in fleet.store.children(root_id)]
    assert {c.status for c in children} == {"stopped"}
    assert all(c.iteration == 0 for c in children), "none ran"
    entries = fleet.store.collaborators(root_id)
    assert {e.status for e in entries} == {"stopped"}


def test_an_ended_tree_leaves_the_index(fleet: Fleet, url: str, tmp_path: Path) -> None:
    model = survey_script(tmp_path / "m.yaml", 1, 50)
    root = create_root(fleet.runtime, TaskSpec(task="survey", model=model))
    fleet.wait(root.trace_id, timeout_s=HEALED_WITHIN_S)
    with redis.Redis.from_url(url, decode_responses=True) as conn:
        wait_until(
            lambda: conn.zscore(keys.OPEN_TREES, root.trace_id) is None,
            HEALED_WITHIN_S,
            "the ended tree to leave the open-trees index",
        )
