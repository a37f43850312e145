"""A worker's owner check compacts a finished explore; the CLI still shows and continues it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.client import Fleet
from fleet.storage import keys
from fleet.storage.backends.redis.compact import tree_ids
from fleet.storage.compaction import PACKED_FIELD
from tests.fleetkit import wait_until
from tests.procs import WorkerProcess, start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url, fleet_client

pytestmark = pytest.mark.integration

COMPACT_DB = 12
"""A database of its own: no other module's worker compacts here."""
RETENTION_S = 3600
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, COMPACT_DB)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="module")
def worker(url: str, workspace: Path) -> Iterator[WorkerProcess]:
    env = {
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_STUCK_AFTER_S": "0.5",
        "FLEET_OWNER_CHECK_INTERVAL_S": "0.5",
        "FLEET_RETENTION_S": str(RETENTION_S),
    }
    with start_worker(url, concurrency=16, env_extra=env) as process:
        wait_for_workers(url, [process.name], timeout_s=TIMEOUT_S)
        yield process


@pytest.fixture
def fleet(url: str, workspace: Path, worker: WorkerProcess) -> Iterator[Fleet]:
    with fleet_client(url, url, workspace) as client:
        yield client


def script(path: Path, branches: int) -> str:
    """A root that explores, summarises, then answers one more turn; branches look, answer."""
    look = {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
    tasks = [f"Branch {i} of the survey" for i in range(1, branches + 1)]
    explore = {"tool_calls": [{"name": "agent", "arguments": {"task": tasks}}]}
    scripts = [
        {"match": "^Branch", "steps": [look, {"content": "done: {task}"}]},
        {
            "match": ".*",
            "steps": [explore, {"content": "summary"}, {"content": "more: {last_user}"}],
        },
    ]
    path.write_text(json.dumps({"scripts": scripts}))
    return f"scripted:{path}"


def cli(url: str, workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_REDIS_URL": url, "FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1"}
    command = [sys.executable, "-m", "fleetops.cli.main", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def compacted(conn: redis.Redis, root: str) -> bool:
    ids = tree_ids(conn, root)
    if conn.exists(keys.events(root)):
        return False  # archived last
    return all(list(conn.hkeys(keys.trace(t))) == [PACKED_FIELD] for t in ids)


def test_a_finished_explore_is_compacted_then_shown_and_continued(
    fleet: Fleet, url: str, workspace: Path, tmp_path: Path
) -> None:
    root = fleet.submit("survey", model=script(tmp_path / "m.yaml", 20)).wait(timeout_s=TIMEOUT_S)
    assert root.status == "completed"
    with redis.Redis.from_url(url, decode_responses=True) as conn:
        wait_until(lambda: compacted(conn, root.trace_id), TIMEOUT_S, "the tree compacted")
        assert len(tree_ids(conn, root.trace_id)) == 21
        assert 0 < conn.ttl(keys.trace(root.trace_id)) <= RETENTION_S
        assert not conn.exists(keys.events(root.trace_id)), "the events were archived"

        shown = cli(url, workspace, "trace", "show", root.trace_id)
        assert shown.returncode == 0, shown.stderr
        assert "summary" in shown.stdout and "done: Branch 20 of the survey" in shown.stdout
        continued = cli(url, workspace, "run", "--continue", root.trace_id, "and then?")
        assert continued.returncode == 0, continued.stderr
        assert continued.stdout.strip() == "more: and then?"
        assert fleet.trace(root.trace_id).run.turn == 1
        wait_until(lambda: compacted(conn, root.trace_id), TIMEOUT_S, "the tree compacted")
    messages = fleet.store.messages(root.trace_id)
    assert [m.content for m in messages][-2:] == ["and then?", "more: and then?"]
    assert len(fleet.store.collaborators(root.trace_id)) == 20
