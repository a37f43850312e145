"""Operator hooks (`FLEET_HOOKS`) on a real worker process and a real Redis."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from tests import hookkit
from tests.procs import WorkerProcess, start_worker
from tests.security.attacker import shell_writable
from tests.test_fleet_recovery import database_url, fleet_client, start_workers

pytestmark = pytest.mark.integration

HOOKS_DB = 8
TIMEOUT_S = 60.0
ALL_HOOKS = ("RECORDER", "BASH_BLOCKER", "CONTEXT", "RAISER", "HANGER")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shell_writable(tmp_path_factory.mktemp("hooks") / "workspace")


@pytest.fixture(scope="module")
def hook_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hooklog") / "hooks.jsonl"
    path.touch()
    return path


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, HOOKS_DB)


@pytest.fixture(scope="module")
def workers(url: str, workspace: Path, hook_log: Path) -> Iterator[list[WorkerProcess]]:
    """One worker loading every test hook: recording, blocking, context, broken, hanging."""
    env = {
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_ALLOW_SHELL": "1",
        "FLEET_HOOKS": ",".join(f"tests.hookkit:{name}" for name in ALL_HOOKS),
        "FLEET_HOOK_TIMEOUT_S": "0.3",
        hookkit.LOG_ENV: str(hook_log),
    }
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 1, concurrency=4, env_extra=env)


@pytest.fixture
def fleet(url: str, workspace: Path, workers: list[WorkerProcess]) -> Iterator[Fleet]:
    with fleet_client(url, url, workspace) as client:
        yield client


def script(path: Path, steps: list[dict[str, Any]]) -> str:
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    return f"scripted:{path}"


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def test_worker_hooks_see_events_block_bash_add_context_and_survive_broken_hooks(
    fleet: Fleet, workspace: Path, hook_log: Path, tmp_path: Path
) -> None:
    precious = workspace / "precious.txt"
    precious.write_text("keep me")
    steps = [
        tool("goal", action="add", description="tidy the workspace"),
        tool("goal", action="done", goal_id="1", summary="tidied"),
        tool("bash", command="rm precious.txt"),
        # Seven more turns: the periodic injection comes before the eleventh model call.
        *(tool("list_files", path=f"d{i}") for i in range(7)),
        {"content": "finished"},
    ]
    done = fleet.submit("tidy up", model=script(tmp_path / "m.yaml", steps))
    trace = done.wait(timeout_s=TIMEOUT_S)
    assert trace.status == "completed", trace.error
    assert precious.read_text() == "keep me", "the hook blocked bash: nothing ran"
    messages = fleet.store.messages(trace.trace_id)
    (refusal,) = [m for m in messages if m.role == "tool" and m.name == "bash"]
    assert refusal.content == "blocked by the operator's policy: no shell on this fleet today"
    (injected,) = [m for m in messages if m.metadata.get("injected")]
    assert hookkit.CONTEXT_LINE in (injected.content or ""), injected.content
    seen = [json.loads(line) for line in hook_log.read_text().splitlines()]
    mine = [e for e in seen if e["trace_id"] == trace.trace_id]
    kinds = [e["event"] for e in mine]
    assert kinds.count("turn_started") == 11 and kinds.count("turn_ended") == 10
    tools = [e["tool"] for e in mine if e["event"] == "tool_finished"]
    assert tools[:3] == ["goal", "goal", "bash"] and len(tools) == 10
    assert [e["goal"] for e in mine if e["event"] == "goal_completed"] == ["tidy the workspace"]


@pytest.mark.parametrize(
    ("hooks", "part"),
    [
        ("tests.hookkit:NOT_A_HOOK", "is a object, not a fleet.Hooks instance"),
        ("tests.hookkit:MISSING", "does not load: AttributeError"),
        ("no_such_hooks_module:HOOK", "no module 'no_such_hooks_module'"),
    ],
)
def test_a_worker_refuses_to_start_on_a_bad_hook_name(url: str, hooks: str, part: str) -> None:
    with start_worker(url, env_extra={"FLEET_HOOKS": hooks}) as worker:
        assert worker.process.wait(TIMEOUT_S) == 2
        log = worker.log()
    lines = [line for line in log.splitlines() if line.startswith("fleet worker:")]
    assert len(lines) == 1 and part in lines[0], log
    assert "Traceback" not in log


def test_fleet_up_refuses_a_bad_hook_name_before_starting_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_HOOKS": "tests.hookkit:NOT_A_HOOK", "FLEET_STATE_DIR": str(tmp_path / "s")}
    up = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "up"],
        env=env | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert up.returncode == 2, up.stdout + up.stderr
    assert up.stderr.strip().splitlines() == [
        "fleet: error: FLEET_HOOKS: 'tests.hookkit:NOT_A_HOOK' is a object,"
        " not a fleet.Hooks instance"
    ]
    assert not (tmp_path / "s").exists(), "no state folder, no Redis: nothing started"
