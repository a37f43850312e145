"""A hardened worker for the attack tests: narrow workspace roots, secrets in its env."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml

from fleet import ids
from fleet.models import Trace, text_of
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import wait_until
from tests.procs import start_worker, wait_for_workers
from tests.security.attacker import SECRET_ENV, shell_writable
from workers.backend import CeleryBackend

SECURITY_DB = 13
"""A database of its own, so other modules' workers never take these tasks."""
RUN_TIMEOUT_S = 60.0
SHELL_MAX_PROCS = 64
"""The hardened worker's FLEET_SHELL_MAX_PROCS: bash's user never has more processes."""
SHELL_MAX_FILE_BYTES = 10_000_000
"""The hardened worker's FLEET_SHELL_MAX_FILE_BYTES."""
TOOL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HardenedFleet:
    """Where the hardened worker listens and what it may touch."""

    url: str
    root: Path
    """The worker's only workspace root."""
    worker_pid: int


@pytest.fixture(scope="module")
def hardened(redis_url: str) -> Iterator[HardenedFleet]:
    """One worker process holding every secret of `SECRET_ENV`, roots = one temp folder.

    Module-scoped, not session: its task events are PUBLISHes on the shared Redis server,
    and tests that count server-wide command stats must not see them.
    """
    with hardened_worker(redis_url, SECURITY_DB) as fleet:
        yield fleet


@contextmanager
def hardened_worker(redis_url: str, db: int, **env_extra: str) -> Iterator[HardenedFleet]:
    """The hardened worker on database `db` (emptied first), with `env_extra` on top."""
    url = urlsplit(redis_url)._replace(path=f"/{db}").geturl()
    # Straight under /tmp, not pytest's 0700 tmp_path: bash's user (nobody) must be able to
    # reach the workspace by its absolute path, as it can in a real deployment.
    root = shell_writable(Path(tempfile.mkdtemp(prefix="fleet-root-")).resolve())
    with redis.Redis.from_url(url) as admin:
        admin.flushdb()
    env = {
        **SECRET_ENV,
        "FLEET_WORKSPACE": str(root),
        "FLEET_WORKSPACE_ROOTS": str(root),
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET_ALLOW_SHELL": "1",
        "FLEET_TOOL_TIMEOUT_S": str(TOOL_TIMEOUT_S),
        "FLEET_SHELL_MAX_PROCS": str(SHELL_MAX_PROCS),
        "FLEET_SHELL_MAX_FILE_BYTES": str(SHELL_MAX_FILE_BYTES),
        **env_extra,
    }
    with start_worker(url, concurrency=4, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=30)
        yield HardenedFleet(url, root, worker.pid)
    shutil.rmtree(root, ignore_errors=True)


def steps_script(path: Path, steps: list[dict[str, Any]]) -> Path:
    """A scripted model answering every task with `steps`, then the last tool's output."""
    final = {"content": "{last_tool}"}
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": [*steps, final]}]}))
    return path


def tool_step(name: str, **arguments: Any) -> dict[str, Any]:
    """One scripted turn calling one tool."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def run_forged(fleet: HardenedFleet, script: Path, workspace: str, task: str = "go") -> Trace:
    """Write a root trace straight into Redis, send its task, wait for it to end.

    This is what a forger with broker access does; a normal submission does the same two
    writes after its own checks, so the worker's checks are the ones under test.
    """
    trace_id = ids.root_id()
    trace = Trace(
        trace_id=trace_id,
        root_trace_id=trace_id,
        mode="main",
        task=task,
        name="main",
        preset="default",
        model=f"scripted:{script}",
        workspace=workspace,
    )
    with RedisStore.from_url(fleet.url) as store:
        store.create_trace(trace)
        CeleryBackend(Settings.from_env({"FLEET_REDIS_URL": fleet.url})).enqueue(trace)
        done = lambda: store.get_trace(trace_id).is_terminal  # noqa: E731
        wait_until(done, RUN_TIMEOUT_S, f"{trace_id} to end")
        return store.get_trace(trace_id)


def tool_outputs(fleet: HardenedFleet, trace_id: str) -> list[str]:
    """The content of every tool message of the trace, in order."""
    with RedisStore.from_url(fleet.url) as store:
        return [text_of(m.content) for m in store.messages(trace_id) if m.role == "tool"]
