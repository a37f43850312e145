"""Orphaned children are dispatched; `fleet run` gives up (exit 2) when no worker is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.loop.runner import Runner
from fleet.models import Trace
from fleet.runtime import Runtime, SpawnRequest
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from tests.fleetkit import fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers
from tests.test_cli_ops import FLEET, clean_env
from tests.test_fleet_recovery import (
    FAST_RECOVERY,
    assert_collected_once,
    database_url,
    fleet_client,
    survey_script,
)

pytestmark = pytest.mark.integration

OUTBOX_DB = 2
"""A database of its own: no other module's worker sweeps or answers here."""
RUN_TIMEOUT_S = 60.0


class RefusingDispatcher:
    """A broker that refuses every chord (or, with `die`, a worker killed right there)."""

    children_survive_restart = True

    def __init__(self, die: bool = False) -> None:
        self.die = die

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        if self.die:
            os._exit(9)  # the children exist; the chord never goes out
        raise ConnectionError("broker refused the chord")


SPAWN_AND_DIE = """
import sys
from pathlib import Path
from fleet.storage.backends.redis.store import RedisStore
from fleet.loop.runner import Runner
from fleet.runtime import Runtime
from fleet.storage.store import TraceStore
from tests.fleetkit import fleet_settings
from tests.test_outbox_watchdog import RefusingDispatcher

url, workspace, trace_id = sys.argv[1:]
store = RedisStore.from_url(url)
runtime = Runtime.build(fleet_settings(url, Path(workspace)), store, RefusingDispatcher(die=True))
Runner(runtime).run(trace_id)
"""


@pytest.fixture
def url(redis_url: str) -> str:
    return database_url(redis_url, OUTBOX_DB)


def orphaning_runtime(url: str, workspace: Path) -> Runtime:
    store = RedisStore.from_url(url)
    return Runtime.build(fleet_settings(url, workspace), store, RefusingDispatcher())


@pytest.mark.parametrize("how", ["broker refused the chord", "spawner died before the chord"])
def test_orphaned_children_are_dispatched_and_the_parent_completes(
    url: str, tmp_path: Path, how: str
) -> None:
    model = survey_script(tmp_path / "m.yaml", 4, latency_ms=50)
    env = {"FLEET_WORKSPACE": str(tmp_path), **FAST_RECOVERY}
    with fleet_client(url, url, tmp_path) as fleet:
        # The spawn goes wrong before a worker is up: a worker's owner check would send the
        # never-enqueued root again itself while a loaded machine starts the spawner.
        root = fleet.runtime.store.get_trace(_create_root(fleet.runtime, model))
        if how.startswith("broker"):
            spawner = orphaning_runtime(url, tmp_path)
            assert Runner(spawner).run(root.trace_id).outcome == "waiting"
        else:
            argv = [sys.executable, "-c", SPAWN_AND_DIE, url, str(tmp_path), root.trace_id]
            died = subprocess.run(argv, cwd=Path.cwd(), capture_output=True, timeout=60)
            assert died.returncode == 9, died.stderr.decode()
        children = fleet.store.children(root.trace_id)
        assert len(children) == 4
        assert {fleet.trace(c).status for c in children} == {"queued"}, "never dispatched"
        with start_worker(url, concurrency=8, env_extra=env) as worker:
            wait_for_workers(url, [worker.name], timeout_s=60)
            trace = fleet.wait(root.trace_id, timeout_s=RUN_TIMEOUT_S)
            assert_collected_once(fleet, trace.trace_id, 4)
            for child in children:  # each ran once: two looks and an answer
                messages = fleet.store.messages(child)
                assert sum(m.role == "assistant" for m in messages) == 3
            log = worker.log()
    assert "for outbox entry 'spawn " in log


def _create_root(runtime: Runtime, model: str) -> str:
    from fleet.conversation.roots import TaskSpec, create_root

    trace: Trace = create_root(runtime, TaskSpec(task="survey", model=model))
    return trace.trace_id


def test_fleet_run_exits_2_when_no_live_worker_is_left_and_the_trace_resumes_later(
    url: str, tmp_path: Path
) -> None:
    model = survey_script(tmp_path / "m.yaml", 4, latency_ms=500, turns=6)
    env = {"FLEET_WORKSPACE": str(tmp_path), **FAST_RECOVERY}
    with start_worker(url, concurrency=8, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=60)
        run = subprocess.Popen(
            [*FLEET, "run", "--model", model, "survey"],
            env=clean_env(
                FLEET_REDIS_URL=url, FLEET_NO_WORKER_TIMEOUT_S="2", FLEET_ALLOW_SCRIPTED="1", **env
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with fleet_client(url, url, tmp_path) as fleet:
                store = fleet.store
                wait_until(lambda: _branches_running(store), RUN_TIMEOUT_S, "branches under way")
                worker.kill()
                _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                run.send_signal(signal.SIGKILL)
    assert run.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    root_id = lines[0].removeprefix("submitted ")
    error = lines[-1]
    assert error.startswith("fleet: error: no live worker has consumed queue 'fleet.")
    assert root_id in error and "Traceback" not in stderr
    with fleet_client(url, url, tmp_path) as fleet:
        assert not fleet.trace(root_id).is_terminal, "left as it was, resumable"
        with start_worker(url, concurrency=8, env_extra=env) as again:
            wait_for_workers(url, [again.name], timeout_s=60)
            trace = fleet.wait(root_id, timeout_s=RUN_TIMEOUT_S)
        assert_collected_once(fleet, trace.trace_id, 4)


def _branches_running(store: TraceStore) -> bool:
    running = [t for t in store.list_traces(20) if t.parent_trace_id and t.iteration >= 1]
    return len(running) >= 2
