"""Helpers for integration tests of the Celery fleet: scripts, an in-process worker, clients."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from fleet.client import Fleet
from fleet.runtime import Runtime, SpawnRequest
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore


def explore_script(
    path: Path,
    branches: int,
    *,
    fail: int | None = None,
    latency_ms: int = 0,
    jitter_ms: int = 0,
    branch_turns: int = 1,
) -> str:
    """Write a scripted model for a main agent that explores `branches` tasks."""
    scripts: list[dict[str, Any]] = []
    if fail is not None:
        scripts.append({"match": f"^Branch {fail} ", "steps": [{"raise": "branch exploded"}]})
    # Each turn lists the workspace by another spelling: the same call three times in a row
    # is a doom loop, which would end a long branch before a test stops it.
    looks = [
        {"tool_calls": [{"name": "list_dir", "arguments": {"path": "/".join(["."] * turn)}}]}
        for turn in range(1, branch_turns + 1)
    ]
    scripts.append({"match": "^Branch", "steps": [*looks, {"content": "done: {task}"}]})
    tasks = [f"Branch {i} of the survey" for i in range(1, branches + 1)]
    scripts.append(
        {
            "match": ".*",
            "steps": [
                {"tool_calls": [{"name": "agent", "arguments": {"task": tasks}}]},
                {"content": "summary: {last_tool}"},
            ],
        }
    )
    script = {"latency_ms": latency_ms, "jitter_ms": jitter_ms, "scripts": scripts}
    path.write_text(yaml.safe_dump(script))
    return f"scripted:{path}"


def fleet_settings(redis_url: str, workspace: Path, **env: str) -> Settings:
    """Settings for a test fleet on this Redis."""
    return Settings.from_env(
        {
            "FLEET_REDIS_URL": redis_url,
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_ALLOW_SCRIPTED": "1",
            **env,
        }
    )


def client(settings: Settings) -> Fleet:
    """A `Fleet` client with the Celery backend."""
    from fleet.client import load_backend
    from fleet.inprocess import InProcessDispatcher

    store = RedisStore.from_url(
        settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
    )
    runtime = Runtime.build(settings, store, InProcessDispatcher())
    return Fleet(runtime, load_backend(settings))


def wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> None:
    """Poll `check` until true; fail naming `what` after `timeout_s` (and what `explain` says
    of the state then: a failure under load is read from its message alone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    said = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{said}")


@contextlib.contextmanager
def thread_worker(concurrency: int = 32) -> Iterator[Any]:
    """A real Celery worker (threads pool) in this process, on all fleet queues."""
    from celery._state import _set_task_join_will_block
    from celery.contrib.testing.worker import start_worker

    from workers.app import QUEUES, app

    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        queues=list(QUEUES),
        shutdown_timeout=30,
        loglevel="WARNING",
    ) as worker:
        # As in a real worker process: senders here never wait on results, so the Redis
        # backend must not subscribe to every task's result channel (start_worker unsets it).
        _set_task_join_will_block(True)
        yield worker


@contextlib.contextmanager
def celery_fleet(
    redis_url: str, workspace: Path, monkeypatch: Any, concurrency: int = 32, **env: str
) -> Iterator[Fleet]:
    """A client and one in-process threads worker (`thread_worker`) on this Redis.

    `monkeypatch`: the test's, so FLEET_REDIS_URL, FLEET_WORKSPACE and `env` go back
    afterwards. The client's app is configured with `env` (its Celery patches too).
    """
    from workers.app import app
    from workers.runtime import reset_runtime

    monkeypatch.setenv("FLEET_REDIS_URL", redis_url)
    monkeypatch.setenv("FLEET_WORKSPACE", str(workspace))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app.conf.broker_url = redis_url
    app.conf.result_backend = redis_url
    reset_runtime()
    with thread_worker(concurrency=concurrency):
        fleet = client(fleet_settings(redis_url, workspace, **env))
        yield fleet
    assert isinstance(fleet.store, RedisStore)
    fleet.store.close()
    reset_runtime()
    gc.collect()  # Celery's pending AsyncResults unsubscribe while their Redis still answers


class RecordingDispatcher:
    """A dispatcher that keeps every spawn it is handed and runs nothing.

    A task queue that has not run the children yet (`children_survive_restart=True`), or
    a process that would have run them itself.
    """

    def __init__(self, children_survive_restart: bool = False) -> None:
        self.children_survive_restart = children_survive_restart
        self.requests: list[SpawnRequest] = []

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Keep the request."""
        self.requests.append(request)
