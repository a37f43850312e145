"""Two releases in one fleet: the previous one (`tests/previous.py`) and this checkout.

The previous release is 0.1.0 (8e0d467). It predates the rules between releases and the
run state (`fleet/runstate.py`, `r:{name}` fields of the trace hash), and refuses any field
it does not know: so 0.1.0 -> 0.2.0 is a stop-the-world upgrade (docs/operations.md,
"Upgrading"), and what is tested across that boundary is what must hold there: trees 0.1.0
finished (packed by its compaction or not) and trees its client queued while the workers
were stopped are, after `fleet migrate`, read and run to the end by this release's workers,
each branch collected once; a 0.1.0 worker left running beside 0.2.0 data refuses every
tree 0.2.0 writes (it fails it, one validation line) rather than running it wrongly; and
this release hands back, untouched, what only a newer release reads. The same machinery runs
both releases side by side from 0.2.0 on (`FLEET_PREVIOUS_REF` names the release before).
On Redis as broker and on RabbitMQ.
"""

from __future__ import annotations

import contextlib
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
from fleet.storage.compaction import PACKED_FIELD
from tests.fleetkit import explore_script, wait_until
from tests.previous import Release, previous_release
from tests.procs import WorkerProcess, start_worker, wait_for_workers
from tests.test_fleet_rabbitmq import RABBITMQ_URL, purge_fleet_queues, rabbitmq_answers
from tests.test_fleet_recovery import (
    FAST_RECOVERY,
    RUN_TIMEOUT_S,
    assert_collected_once,
    begin_shutdown,
    database_url,
    fleet_client,
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


def old_worker(
    stack: contextlib.ExitStack, previous: Release, url: str, broker: str, workspace: Path
) -> WorkerProcess:
    """A worker of the previous release alone on the fleet's queues, Redis and broker."""
    env = {"FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1", **FAST_RECOVERY}
    worker = stack.enter_context(
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
    wait_for_workers(broker, [worker.name], timeout_s=60)
    return worker


def previous_env(previous: Release, url: str, broker: str, workspace: Path) -> dict[str, str]:
    return {
        "FLEET_REDIS_URL": url,
        "FLEET_BROKER_URL": broker,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
        "PATH": "/usr/bin:/bin",
        **previous.env(),
    }


def previous_client(
    previous: Release, url: str, broker: str, workspace: Path, model: str
) -> subprocess.Popen[str]:
    """`fleet run --json` of the previous release: submits a tree and waits for its end."""
    argv = [str(previous.python), "-m", "fleetops.cli.main", "run", "--json", "--model", model]
    argv += ["--timeout-s", str(int(RUN_TIMEOUT_S)), "survey by the previous client"]
    return subprocess.Popen(
        argv,
        env=previous_env(previous, url, broker, workspace),
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def previous_submits(previous: Release, url: str, broker: str, workspace: Path, model: str) -> str:
    """The previous release's client queues a tree (no worker needed) and prints its id."""
    code = (
        "import sys; from fleet.client import Fleet; f = Fleet.from_env();"
        "print(f.submit('queued by the previous client', model=sys.argv[1]).trace_id)"
    )
    done = subprocess.run(
        [str(previous.python), "-c", code, model],
        env=previous_env(previous, url, broker, workspace),
        cwd=workspace,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def ended_root(process: subprocess.Popen[str]) -> str:
    """The root id the previous client printed, once it exited 0."""
    out, err = process.communicate(timeout=RUN_TIMEOUT_S + 10)
    assert process.returncode == 0, (process.returncode, out[-2000:], err[-2000:])
    return str(json.loads(out)["trace_id"])


def previous_compacts(previous: Release, url: str, root_id: str) -> None:
    """The previous release packs a finished tree (what its owner check does)."""
    code = (
        "import sys, redis; from fleet.storage.redis_compact import compact_tree;"
        "c = redis.Redis.from_url(sys.argv[1], decode_responses=True);"
        f"print(compact_tree(c, sys.argv[2], {RETENTION_S}))"
    )
    subprocess.run([str(previous.python), "-c", code, url, root_id], check=True, cwd="/")


def current_migrates(url: str, workspace: Path) -> str:
    """`fleet migrate` of this release (its exit status checked), as the operator runs it."""
    env = {**os.environ, "FLEET_REDIS_URL": url}
    argv = [sys.executable, "-m", "fleetops.cli.main", "migrate"]
    done = subprocess.run(argv, env=env, cwd=workspace, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_stop_the_world_upgrade_from_0_1_0_finishes_every_tree_it_left(
    previous: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    model = explore_script(tmp_path / "m.yaml", BRANCHES, latency_ms=100, branch_turns=2)
    with contextlib.ExitStack() as stack:
        old = old_worker(stack, previous, url, broker, tmp_path)
        finished = [ended_root(previous_client(previous, url, broker, tmp_path, model))]
        finished.append(ended_root(previous_client(previous, url, broker, tmp_path, model)))
        previous_compacts(previous, url, finished[0])
        old.stop()
    # The workers are stopped: what the previous client queues now waits in the broker.
    queued = previous_submits(previous, url, broker, tmp_path, model)
    assert "lifted the run state of" in current_migrates(url, tmp_path)
    with contextlib.ExitStack() as stack:
        env = {"FLEET_WORKSPACE": str(tmp_path), "FLEET_ALLOW_SCRIPTED": "1", **FAST_RECOVERY}
        new = stack.enter_context(start_worker(url, broker_url=broker, env_extra=env))
        stack.callback(begin_shutdown, [new])
        wait_for_workers(broker, [new.name], timeout_s=60)
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        assert fleet.wait(queued, timeout_s=RUN_TIMEOUT_S).status == "completed"
        assert conn.hexists(keys.trace(finished[0]), PACKED_FIELD), "0.1.0 packed it"
        for tree in (*finished, queued):
            assert_collected_once(fleet, tree, BRANCHES)


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


def test_a_0_1_0_worker_left_running_refuses_every_tree_0_2_0_writes(
    previous: Release, url: str, broker: str, conn: redis.Redis, tmp_path: Path
) -> None:
    # Why 0.1.0 -> 0.2.0 stops the world: every trace 0.2.0 creates carries its run state
    # (`r:schema_version` at least), a field 0.1.0 does not know. A 0.1.0 worker that takes
    # such a run fails that trace in one validation line; it never runs it half-understood.
    model = explore_script(tmp_path / "m.yaml", 2, latency_ms=50)
    with contextlib.ExitStack() as stack:
        old = old_worker(stack, previous, url, broker, tmp_path)
        fleet: Fleet = stack.enter_context(fleet_client(broker, url, tmp_path))
        plain = fleet.submit("survey", model=model)
        refused = plain.wait(timeout_s=RUN_TIMEOUT_S)
        assert refused.status == "failed" and "r:schema_version" in (refused.error or "")
        assert refused.answer is None and not fleet.trace(plain.trace_id).run.stop_reason
        assert "Extra inputs are not permitted" in old.log()
