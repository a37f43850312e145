"""Two releases in one fleet: the previous one (`tests/previous.py`) and this checkout.

As during a rolling upgrade (or a rollback): workers of both serve the same queues and
Redis, trees are submitted by either release's client, branches run on either worker, and
a worker of one release killed mid-tree leaves its branches to the other. Every tree
completes and each branch is collected once. On Redis as broker and on RabbitMQ.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.client import Fleet
from fleet.storage import keys
from fleet.storage.backends.redis.compact import compact_tree
from fleet.storage.compaction import PACKED_FIELD
from tests.fleetkit import explore_script, wait_until
from tests.previous import Release, previous_release
from tests.procs import WorkerProcess, start_worker, wait_for_workers
from tests.test_fleet_rabbitmq import RABBITMQ_URL, purge_fleet_queues, rabbitmq_answers
from tests.test_fleet_recovery import (
    FAST_RECOVERY,
    RUN_TIMEOUT_S,
    Running,
    assert_collected_once,
    begin_shutdown,
    database_url,
    fleet_client,
    running_branches,
)

pytestmark = pytest.mark.integration

MIXED_DB = 4
BRANCHES = 8
RETENTION_S = 3600


@pytest.fixture(scope="module")
def previous() -> Release:
    release = previous_release()
    if release is None:
        missing = "the previous release's commit is not in this checkout (a shallow clone?)"
        if os.environ.get("CI"):  # CI must fetch it (actions/checkout: fetch-depth: 0)
            pytest.fail(missing)
        pytest.skip(missing)
    return release


@pytest.fixture(params=["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def broker(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """The broker's URL: the test's Redis, or the shared RabbitMQ (held for this test)."""
    if request.param == "redis":
        yield database_url(redis_url, MIXED_DB)
        return
    request.getfixturevalue("rabbitmq_to_itself")
    if not rabbitmq_answers(RABBITMQ_URL):
        pytest.skip(f"no RabbitMQ answers at {RABBITMQ_URL}")
    purge_fleet_queues(RABBITMQ_URL)
    yield RABBITMQ_URL


@pytest.fixture
def url(redis_url: str, broker: str) -> str:
    return database_url(redis_url, MIXED_DB)


@pytest.fixture
def conn(url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(url, decode_responses=True) as c:
        yield c


def both_workers(
    stack: contextlib.ExitStack, previous: Release, url: str, broker: str, workspace: Path
) -> tuple[WorkerProcess, WorkerProcess]:
    """One worker of each release on the same queues, Redis and broker."""
    env = {"FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1", **FAST_RECOVERY}
    old = stack.enter_context(
        start_worker(
            url,
            broker_url=broker,
            concurrency=4,
            env_extra={**env, **previous.env()},
            python=str(previous.python),
            cwd=workspace,
            name=f"previous@{previous.sha[:8]}",
        )
    )
    new = stack.enter_context(
        start_worker(url, broker_url=broker, concurrency=4, env_extra=env, name="current@here")
    )
    stack.callback(begin_shutdown, [old, new])
    wait_for_workers(broker, [old.name, new.name], timeout_s=60)
    return old, new


def previous_client(
    previous: Release, url: str, broker: str, workspace: Path, model: str
) -> subprocess.Popen[str]:
    """`fleet run --json` of the previous release: submits a tree and waits for its end."""
    env = {
        "FLEET_REDIS_URL": url,
        "FLEET_BROKER_URL": broker,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
        "PATH": "/usr/bin:/bin",
        **previous.env(),
    }
    argv = [str(previous.python), "-m", "fleetops.cli.main", "run", "--json", "--model", model]
    argv += ["--timeout-s", str(int(RUN_TIMEOUT_S)), "survey by the previous client"]
    return subprocess.Popen(
        argv, env=env, cwd=workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def ended_root(process: subprocess.Popen[str]) -> str:
    """The root id the previous client printed, once it exited 0."""
    out, err = process.communicate(timeout=RUN_TIMEOUT_S + 10)
    assert process.returncode == 0, (process.returncode, out[-2000:], err[-2000:])
    return str(json.loads(out)["trace_id"])


def test_trees_of_both_clients_run_on_workers_of_both_releases(
    previous: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", BRANCHES, latency_ms=200, branch_turns=2)
    with contextlib.ExitStack() as stack:
        old, new = both_workers(stack, previous, url, broker, tmp_path)
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        theirs = previous_client(previous, url, broker, tmp_path, model)
        mine = fleet.submit("survey by the current client", model=model)
        ran_on: set[str] = set()

        def note_runners() -> bool:
            ran_on.update(r.worker for r in running_branches(fleet, conn, [old, new]))
            return ran_on == {old.name, new.name}

        wait_until(note_runners, RUN_TIMEOUT_S, "branches running on both releases' workers")
        root = mine.wait(timeout_s=RUN_TIMEOUT_S)
        assert_collected_once(fleet, root.trace_id, BRANCHES)
        their_root = ended_root(theirs)
        assert_collected_once(fleet, their_root, BRANCHES)
        # Packed trees: each release compacts one; both read both.
        assert compact_tree(conn, root.trace_id, RETENTION_S).packed == BRANCHES + 1
        previous_compacts(previous, url, their_root)
        for tree in (root.trace_id, their_root):
            assert conn.hexists(keys.trace(tree), PACKED_FIELD)
            assert_collected_once(fleet, tree, BRANCHES)
            assert '"completed"' in previous_shows(previous, url, tree, tmp_path)


def previous_compacts(previous: Release, url: str, root_id: str) -> None:
    """The previous release packs a finished tree (what its owner check does)."""
    code = (
        "import sys, redis; from fleet.storage.redis_compact import compact_tree;"
        "c = redis.Redis.from_url(sys.argv[1], decode_responses=True);"
        f"print(compact_tree(c, sys.argv[2], {RETENTION_S}))"
    )
    subprocess.run([str(previous.python), "-c", code, url, root_id], check=True, cwd="/")


def previous_shows(previous: Release, url: str, trace_id: str, workspace: Path) -> str:
    """`fleet trace show --json` of the previous release (its exit status checked)."""
    env = {"FLEET_REDIS_URL": url, "PATH": "/usr/bin:/bin", **previous.env()}
    argv = [str(previous.python), "-m", "fleetops.cli.main", "trace", "show", "--json", trace_id]
    shown = subprocess.run(argv, env=env, cwd=workspace, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-2000:]
    return shown.stdout


@pytest.mark.parametrize("victim", ["previous", "current"])
def test_a_release_killed_mid_tree_leaves_its_branches_to_the_other(
    previous: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path, victim: str
) -> None:
    model = explore_script(tmp_path / "m.yaml", BRANCHES, latency_ms=300, branch_turns=3)
    with contextlib.ExitStack() as stack:
        old, new = both_workers(stack, previous, url, broker, tmp_path)
        killed = old if victim == "previous" else new
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        theirs = previous_client(previous, url, broker, tmp_path, model)
        mine = fleet.submit("survey by the current client", model=model)
        victims: list[Running] = []

        def killed_runs_branches() -> bool:
            running = running_branches(fleet, conn, [old, new])
            victims[:] = [r for r in running if r.worker == killed.name]
            return bool(victims)

        wait_until(killed_runs_branches, RUN_TIMEOUT_S, f"branches on the {victim} worker")
        killed.kill()
        root = mine.wait(timeout_s=RUN_TIMEOUT_S)
        assert_collected_once(fleet, root.trace_id, BRANCHES)
        assert_collected_once(fleet, ended_root(theirs), BRANCHES)


def test_what_only_a_newer_release_reads_goes_back_to_the_queue_in_one_line(
    url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    # A task message whose header names a newer schema, and a run whose trace hash does:
    # this release's worker runs neither, fails neither, and says so once each.
    from fleet.models import Trace
    from fleet.storage.backends.redis.store import RedisStore
    from tests.fleetkit import fleet_settings
    from workers.app import SCHEMA_HEADER, create_app

    env = {"FLEET_WORKSPACE": str(tmp_path), "FLEET_ALLOW_SCRIPTED": "1", **FAST_RECOVERY}
    store = RedisStore.from_url(url)
    settings = fleet_settings(url, tmp_path, FLEET_BROKER_URL=broker)
    sender = create_app(settings, set_as_current=False)  # the fleet's queues (priorities)
    for trace_id in ("by-message", "by-record"):
        store.create_trace(Trace(trace_id=trace_id, root_trace_id=trace_id, task="x"))
    conn.hset(keys.trace("by-record"), "schema_version", "99")
    with start_worker(url, broker_url=broker, concurrency=2, env_extra=env) as worker:
        wait_for_workers(broker, [worker.name], timeout_s=60)
        sender.send_task(
            "fleet.run_agent", ["by-message"], queue="fleet.main", headers={SCHEMA_HEADER: 99}
        )
        sender.send_task("fleet.run_agent", ["by-record"], queue="fleet.main")
        wait_until(
            lambda: (
                "run of 'by-record' handed back" in worker.log()
                and "handed back: its schema 99" in worker.log()
            ),
            30,
            "both handed back",
        )
        log = worker.log()
        assert "'by-record' is for a newer release than this one" in log
    sender.close()
    for trace_id in ("by-message", "by-record"):
        assert conn.hget(keys.trace(trace_id), "status") == '"queued"', "not run, not failed"
    store.close()


def test_a_tree_bound_to_memory_is_refused_by_the_previous_release_alone(
    previous: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    # What docs/operations.md says release 0.1.0 refuses of 0.2.0: a tree bound to memory
    # (its trace carries `memory` and `schema_version: 2`). Only a previous worker runs here.
    model = explore_script(tmp_path / "m.yaml", 2, latency_ms=50)
    env = {"FLEET_WORKSPACE": str(tmp_path), "FLEET_ALLOW_SCRIPTED": "1", **FAST_RECOVERY}
    with contextlib.ExitStack() as stack:
        old = stack.enter_context(
            start_worker(
                url,
                broker_url=broker,
                concurrency=2,
                env_extra={**env, **previous.env()},
                python=str(previous.python),
                cwd=tmp_path,
            )
        )
        wait_for_workers(broker, [old.name], timeout_s=60)
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        bound = fleet.submit("survey", model=model, memory=["user:alice"])
        plain = fleet.submit("survey", model=model)
        assert plain.wait(timeout_s=RUN_TIMEOUT_S).status == "completed"
        refused = bound.wait(timeout_s=RUN_TIMEOUT_S)
        assert refused.status == "failed" and "memory" in (refused.error or "")
        assert "Extra inputs are not permitted" in old.log()
