"""A workspace no live worker accepts is refused before submission, not failed on a worker."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import redis

from fleet.errors import ConfigError
from fleet.models import WorkerPresence
from fleet.storage import keys
from fleet.storage.store import TraceStore
from fleet.storage.watchdog import check_served
from tests.procs import start_worker, wait_for_workers
from tests.test_cli_ops import assert_one_line_error, clean_env, fleet
from tests.test_fleet_recovery import database_url

SERVED_DB = 7


def announce(store: TraceStore, node: str, roots: list[str]) -> None:
    presence = WorkerPresence(node=node, queues=["fleet.main"], roots=roots)
    store.beat([], 60_000, presence)


def test_a_workspace_under_some_workers_roots_is_served(store: TraceStore, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    announce(store, "w1", [str(tmp_path / "b")])
    announce(store, "w2", [str(tmp_path / "a")])
    check_served(store, "fleet.main", tmp_path / "a")


def test_a_workspace_outside_every_workers_roots_is_refused(
    store: TraceStore, tmp_path: Path
) -> None:
    announce(store, "w1", [str(tmp_path / "b")])
    with pytest.raises(ConfigError, match=r"outside the workspace roots of every live worker"):
        check_served(store, "fleet.main", tmp_path / "a")


def test_no_announced_roots_says_nothing(store: TraceStore, tmp_path: Path) -> None:
    check_served(store, "fleet.main", tmp_path)  # no worker: the queue watch speaks
    announce(store, "old", [])  # a worker from before roots were announced
    check_served(store, "fleet.main", tmp_path)
    check_served(store, None, tmp_path)  # in-process: no queue


@pytest.fixture
def url(redis_url: str) -> str:
    return database_url(redis_url, SERVED_DB)


@pytest.mark.integration
def test_fleet_run_refuses_a_workspace_its_workers_would_refuse(url: str, tmp_path: Path) -> None:
    served, outside = tmp_path / "served", tmp_path / "outside"
    served.mkdir()
    outside.mkdir()
    env = {"FLEET_WORKSPACE": str(served), "FLEET_WORKSPACE_ROOTS": str(served)}
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(start_worker(url, env_extra=env))
        wait_for_workers(url, [worker.name], timeout_s=60)
        client_env = clean_env(
            FLEET_REDIS_URL=url,
            FLEET_WORKSPACE_ROOTS=f"{served}:{outside}",
            FLEET_ALLOW_SCRIPTED="1",
        )
        result = fleet(["run", "--workspace", str(outside), "hello"], client_env, tmp_path)
    line = assert_one_line_error(result)
    assert str(outside) in line and str(served) in line and "fleet.main" in line
    with redis.Redis.from_url(url) as conn:
        assert conn.zcard(keys.TRACES) == 0, "nothing was written"
