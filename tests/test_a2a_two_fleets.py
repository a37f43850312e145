"""Two fleets, each with its own Redis and worker: a tree of A delegates to a preset of B.

The seeds' cross-device scenario end to end: fleet B runs `fleet a2a` (the real command,
its own process) with a preset marked `a2a: true`; fleet A's fleet.yaml names B's
endpoint in `remote_agents` with B's token. A's tree gets B's tree's answer through A2A,
A's trace carries `agent://teamb/<task id>`, and B ran the task as a root tree of its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleet.client import Fleet
from fleet.storage.backends.redis.store import RedisStore
from fleetops.redis_server import start_redis_server
from tests.a2a_agent import free_port
from tests.fleetkit import client, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
TOKEN = "team-b-token-0123456789"


def answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def close(fleet: Fleet) -> None:
    assert isinstance(fleet.store, RedisStore)
    fleet.store.close()


@contextlib.contextmanager
def fleet_b(tmp: Path) -> Iterator[tuple[Fleet, str]]:
    """Fleet B: its Redis, a worker, `fleet a2a` serving the `helper` preset."""
    (tmp / "b-model.yaml").write_text(
        yaml.safe_dump(
            {"scripts": [{"match": ".*", "steps": [{"content": "fleet B says: {task}"}]}]}
        )
    )
    agents = tmp / "b-agents"
    agents.mkdir()
    (agents / "helper.md").write_text("---\nname: helper\ndescription: B\na2a: true\n---\nHi\n")
    workspace = tmp / "b-ws"
    workspace.mkdir()
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(start_redis_server())
        env = {
            "FLEET_REDIS_URL": redis.url,
            "FLEET_ALLOW_SCRIPTED": "1",
            "FLEET_MODEL": f"scripted:{tmp / 'b-model.yaml'}",
            "FLEET_AGENTS_DIR": str(agents),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
        }
        worker = stack.enter_context(start_worker(redis.url, concurrency=2, env_extra=env))
        wait_for_workers(redis.url, [worker.name], timeout_s=30)
        port = free_port()
        log = stack.enter_context((tmp / "b-a2a.log").open("wb"))
        served = subprocess.Popen(
            [sys.executable, "-m", "fleetops.cli.main", "a2a", "--port", str(port)],
            env={**os.environ, **env, "FLEET_SERVE_TOKEN": TOKEN},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stack.callback(served.wait, 10)
        stack.callback(served.terminate)
        wait_until(lambda: answers(port) or served.poll() is not None, 30, "fleet a2a of B")
        assert served.poll() is None, (tmp / "b-a2a.log").read_text()
        b = client(fleet_settings(redis.url, workspace, **env))
        stack.callback(close, b)
        yield b, f"http://127.0.0.1:{port}/"


def test_a_tree_of_one_fleet_delegates_to_a_preset_of_another(
    redis_url: str, tmp_path: Path
) -> None:
    from tests.conftest import flush

    flush(redis_url)
    with fleet_b(tmp_path) as (b, b_url):
        conf = tmp_path / "a-conf"
        conf.mkdir()
        agents = {"teamb": {"url": b_url, "token_env": "TEAMB_TOKEN", "private": True}}
        (conf / "fleet.yaml").write_text(yaml.safe_dump({"remote_agents": agents}))
        call = {"name": "agent", "arguments": {"task": "summarise the logs", "agent": "teamb"}}
        steps = [{"tool_calls": [call]}, {"content": "A heard: {last_tool}"}]
        (conf / "a-model.yaml").write_text(
            yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]})
        )
        workspace = tmp_path / "a-ws"
        workspace.mkdir()
        env = {
            "FLEET_CONFIG": str(conf / "fleet.yaml"),
            "FLEET_ALLOW_SCRIPTED": "1",
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_REMOTE_POLL_S": "0.2",
            "TEAMB_TOKEN": TOKEN,
        }
        with start_worker(redis_url, concurrency=2, env_extra=env) as worker:
            wait_for_workers(redis_url, [worker.name], timeout_s=30)
            a = client(fleet_settings(redis_url, workspace, **env))
            started = time.monotonic()
            try:
                root = a.submit("ask team B", model=f"scripted:{conf / 'a-model.yaml'}").wait(90)
                (entry,) = a.store.collaborators(root.trace_id)
            finally:
                close(a)
        assert root.status == "completed", root.error
        assert "fleet B says: summarise the logs" in str(root.answer)
        assert entry.remote_id is not None and entry.remote_id.startswith("agent://teamb/")
        b_roots = [t for t in b.store.list_traces(100) if t.parent_trace_id is None]
        assert [(t.task, t.status, t.preset) for t in b_roots] == [
            ("summarise the logs", "completed", "helper")
        ]
        assert time.monotonic() - started < 90
