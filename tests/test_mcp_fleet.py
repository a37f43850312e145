"""MCP tools on a real worker process: one session per server, reused across traces;
the read-only ceiling where the tool runs; a killed server started again by the next call.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fleet.client import Fleet
from fleet.models import Message
from tests.fleetkit import client, fleet_settings, wait_until
from tests.mcpkit import server_entry, write_config
from tests.procs import pid_alive, start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

pytestmark = pytest.mark.integration

MCP_DB = 15
TIMEOUT_S = 60.0


def calls(name: str, **arguments: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def rule(match: str, *steps: dict[str, object], answer: str) -> dict[str, object]:
    return {"match": match, "steps": [*steps, {"content": answer}]}


def script(workspace: Path) -> dict[str, object]:
    note, go = workspace / "note.txt", workspace / "go"
    pid = calls("mcp__test__pid")
    write = calls("mcp__test__write_note", path=str(note), text="x")
    return {
        "scripts": [
            rule("^Echo child", calls("mcp__test__echo", text="hi"), answer="child: {last_tool}"),
            rule("^Main delegates", calls("agent", task="Echo child"), answer="main: {last_tool}"),
            rule("^Branch writes", write, answer="{last_tool}"),
            rule("^Main explores", calls("agent", task=["Branch writes"]), answer="{last_tool}"),
            rule("^Which pid", pid, answer="pid {last_tool}"),
            rule(
                "^Survive a kill",
                pid,
                calls("mcp__test__wait_file", path=str(go)),
                pid,
                answer="pid {last_tool}",
            ),
        ]
    }


@dataclass
class Setup:
    fleet: Fleet
    workspace: Path
    model: str


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    url = database_url(redis_url, MCP_DB)
    outside = tmp_path_factory.mktemp("operator")
    workspace = tmp_path_factory.mktemp("workspace")
    config = write_config(outside / "fleet.yaml", {"test": server_entry()})
    model_file = outside / "script.yaml"
    model_file.write_text(yaml.safe_dump(script(workspace)))
    env = {
        "FLEET_CONFIG": str(config),
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
    }
    with start_worker(url, concurrency=8, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=60)
        fleet = client(fleet_settings(url, workspace, **env))
        yield Setup(fleet, workspace, f"scripted:{model_file}")
        fleet.store.close()


def tool_messages(fleet: Fleet, trace_id: str) -> list[Message]:
    return [m for m in fleet.store.messages(trace_id) if m.role == "tool"]


def test_a_delegate_calls_an_mcp_tool_and_its_output_reaches_the_answer(setup: Setup) -> None:
    trace = setup.fleet.submit("Main delegates", model=setup.model).wait(TIMEOUT_S)

    assert trace.status == "completed", trace.error
    assert trace.answer is not None and "child: echo: hi" in trace.answer


def test_an_explore_branch_calling_a_writing_tool_is_refused(setup: Setup) -> None:
    trace = setup.fleet.submit("Main explores", model=setup.model).wait(TIMEOUT_S)

    assert trace.status == "completed", trace.error
    (branch,) = setup.fleet.store.children(trace.trace_id)
    (result,) = tool_messages(setup.fleet, branch)
    assert result.metadata["is_error"] is True
    assert "read-only" in str(result.content)
    assert not (setup.workspace / "note.txt").exists()


def answered_pid(fleet: Fleet, model: str, task: str) -> int:
    trace = fleet.submit(task, model=model).wait(TIMEOUT_S)
    assert trace.status == "completed", trace.error
    assert trace.answer is not None
    return int(trace.answer.removeprefix("pid "))


def test_one_session_per_server_is_reused_across_traces(setup: Setup) -> None:
    first = answered_pid(setup.fleet, setup.model, "Which pid")
    second = answered_pid(setup.fleet, setup.model, "Which pid")

    assert first == second
    assert pid_alive(first)


def test_a_server_killed_mid_run_is_started_again_by_the_next_call(setup: Setup) -> None:
    handle = setup.fleet.submit("Survive a kill", model=setup.model)
    wait_until(lambda: len(tool_messages(setup.fleet, handle.trace_id)) >= 1, TIMEOUT_S, "pid")
    killed = int(str(tool_messages(setup.fleet, handle.trace_id)[0].content))
    os.kill(killed, signal.SIGKILL)  # while the next call (wait_file) is in flight
    wait_until(lambda: not pid_alive(killed), TIMEOUT_S, "the server to die")
    (setup.workspace / "go").touch()

    trace = handle.wait(TIMEOUT_S)

    assert trace.status == "completed", trace.error
    assert trace.answer is not None
    restarted = int(trace.answer.removeprefix("pid "))
    assert restarted != killed and pid_alive(restarted)
