"""Remote sub-agents on a real worker process, Redis and agents built with a2a-sdk's server.

The Done-when rows of issue 43's first part: a delegate to an A2A agent completes with its
artifact in the parent's collaborators and answer, `fleet trace show` shows its
`agent://reviewer/<task id>`, `continue_from` that id reaches the same remote context, a
stop cancels the remote task, a remote agent killed mid-task fails the child in one line
while the tree goes on, an input-required task waits on a person whose reply goes to it,
and a worker of ONE slot runs another tree while a remote child waits (no slot held).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.models import Trace
from tests.a2a_agent import RunningAgent, serve_reviewer
from tests.fleetkit import client, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = {
    "FLEET_REMOTE_POLL_S": "0.2",
    "FLEET_SWEEP_INTERVAL_S": "0.2",
    "FLEET_ALLOW_SCRIPTED": "1",
    "REVIEW_TOKEN": "tok-123",
}


@dataclass
class Setup:
    fleet: Fleet
    reviewer: RunningAgent
    fresh: RunningAgent
    doomed: RunningAgent
    scripts: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from tests.conftest import flush

    flush(redis_url)
    conf = tmp_path_factory.mktemp("conf")
    workspace = tmp_path_factory.mktemp("ws")
    with contextlib.ExitStack() as stack:
        reviewer = stack.enter_context(serve_reviewer(token="tok-123"))
        fresh = stack.enter_context(serve_reviewer())
        doomed = stack.enter_context(serve_reviewer())
        entry = {"token_env": "REVIEW_TOKEN", "private": True, "timeout_s": 120}
        agents = {
            "reviewer": {"url": reviewer.url, **entry},
            "fresh": {"url": fresh.url, "private": True},
            "doomed": {"url": doomed.url, "private": True},
        }
        (conf / "fleet.yaml").write_text(yaml.safe_dump({"remote_agents": agents}))
        env = {**FAST, "FLEET_CONFIG": str(conf / "fleet.yaml"), "FLEET_WORKSPACE": str(workspace)}
        env["FLEET_WORKSPACE_ROOTS"] = str(workspace)  # the operator's fleet.yaml is outside
        worker = stack.enter_context(start_worker(redis_url, concurrency=1, env_extra=env))
        wait_for_workers(redis_url, [worker.name], timeout_s=30)
        fleet = client(fleet_settings(redis_url, workspace, **env))
        yield Setup(fleet, reviewer, fresh, doomed, conf, {**env, "FLEET_REDIS_URL": redis_url})
        if os.environ.get("FLEET_TEST_SHOW_WORKER_LOG"):
            print(worker.log()[-5000:])


def script(setup: Setup, name: str, steps: list[dict[str, Any]]) -> str:
    path = setup.scripts / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    return f"scripted:{path}"


def delegate(task: str, agent: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "agent", "arguments": {"task": task, "agent": agent}}]}


def children(fleet: Fleet, root: str) -> list[Trace]:
    return [fleet.trace(c) for c in fleet.store.children(root)]


def test_a_delegate_to_a_remote_agent_completes_and_shows_its_agent_id(setup: Setup) -> None:
    model = script(
        setup, "one", [delegate("check the diff", "reviewer"), {"content": "{last_tool}"}]
    )
    root = setup.fleet.submit("review the diff", model=model).wait(60)
    assert root.status == "completed", root.error
    task_id, _, text = setup.reviewer.record.messages[-1]
    remote_id = f"agent://reviewer/{task_id}"
    assert text == "check the diff" and remote_id in str(root.answer)
    assert "reviewed: check the diff" in str(root.answer)
    (entry,) = setup.fleet.store.collaborators(root.trace_id)
    assert entry.remote_id == remote_id and entry.status == "completed"
    assert "reviewed: check the diff" in entry.summary
    shown = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "trace", "show", root.trace_id],
        env={**os.environ, **setup.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"remote {remote_id} [completed]" in shown.stdout
    assert set(setup.reviewer.record.auth) == {"Bearer tok-123"}


def test_continue_from_reaches_the_same_remote_context(setup: Setup) -> None:
    again = {"task": "now the tests", "continue_from": "agent://fresh/task-1"}
    steps = [
        delegate("first look", "fresh"),
        {"tool_calls": [{"name": "agent", "arguments": again}]},
        {"content": "{last_tool}"},
    ]
    root = setup.fleet.submit("review twice", model=script(setup, "two", steps)).wait(60)
    assert root.status == "completed", root.error
    (t1, c1, _), (t2, c2, text) = setup.fresh.record.messages
    assert (t1, t2, text) == ("task-1", "task-2", "now the tests") and c1 == c2
    assert "agent://fresh/task-2" in str(root.answer) and f"(context {c1})" in str(root.answer)
    assert len(children(setup.fleet, root.trace_id)) == 1


def test_no_slot_is_held_while_a_remote_child_waits(setup: Setup) -> None:
    slow = setup.fleet.submit(
        "slow review",
        model=script(setup, "slow", [delegate("slow 6", "reviewer"), {"content": "x"}]),
    )
    wait_until(
        lambda: any(c.status == "waiting" for c in children(setup.fleet, slow.trace_id)),
        30,
        "the remote child parked",
    )
    quick = setup.fleet.submit("quick", model=script(setup, "quick", [{"content": "quick done"}]))
    assert quick.wait(30).status == "completed"  # the worker's one slot was free
    (child,) = children(setup.fleet, slow.trace_id)
    assert child.status == "waiting"  # still: the remote task works on
    assert slow.wait(60).status == "completed"
    told = [  # the remote task's status note (6 s of "reading the diff") became an event
        e.data.get("type")
        for _, e in setup.fleet.store.read_events(slow.trace_id)
        if e.kind == "collaborator" and e.status == "running"
    ]
    assert "remote" in told
    assert setup.reviewer.record.methods["SubscribeToTask"] >= 1  # followed by its stream


def test_a_stop_cancels_the_remote_task(setup: Setup) -> None:
    handle = setup.fleet.submit(
        "long review",
        model=script(setup, "long", [delegate("slow 60", "reviewer"), {"content": "x"}]),
    )
    wait_until(
        lambda: any(c.status == "waiting" for c in children(setup.fleet, handle.trace_id)),
        30,
        "the remote child parked",
    )
    task_id = setup.reviewer.record.messages[-1][0]
    setup.fleet.stop(handle.trace_id)
    assert handle.wait(30).status == "stopped"
    wait_until(lambda: task_id in setup.reviewer.record.canceled, 20, "the remote task cancelled")


def test_a_remote_agent_killed_mid_task_fails_the_child_and_the_tree_goes_on(
    setup: Setup,
) -> None:
    handle = setup.fleet.submit(
        "doomed review",
        model=script(setup, "doomed", [delegate("slow 60", "doomed"), {"content": "went on"}]),
    )
    wait_until(
        lambda: any(c.status == "waiting" for c in children(setup.fleet, handle.trace_id)),
        30,
        "the remote child parked",
    )
    setup.doomed.kill()
    root = handle.wait(60)
    assert root.status == "completed" and root.answer == "went on"
    (child,) = children(setup.fleet, handle.trace_id)
    assert child.status == "failed" and "remote agent 'doomed' unreachable" in str(child.error)
    assert "\n" not in str(child.error)


def test_input_required_waits_on_a_person_whose_reply_goes_to_the_remote_task(
    setup: Setup,
) -> None:
    handle = setup.fleet.submit(
        "ask review",
        model=script(setup, "ask", [delegate("ask first", "reviewer"), {"content": "{last_tool}"}]),
    )

    def asked() -> bool:
        found = children(setup.fleet, handle.trace_id)
        return bool(found) and found[0].run.waiting_on is not None

    wait_until(asked, 30, "the remote task's question reached a person")
    (child,) = children(setup.fleet, handle.trace_id)
    assert child.run.waiting_on is not None
    assert child.run.waiting_on["question"] == "Which module first?"
    assert child.run.remote_call is not None and child.run.remote_call.state == "input"
    task_id = setup.reviewer.record.messages[-1][0]
    setup.fleet.reply(child.trace_id, "the auth module")
    root = handle.wait(60)
    assert root.status == "completed", root.error
    assert setup.reviewer.record.messages[-1][0] == task_id  # the reply went to the same task
    assert "reviewed: the auth module" in str(root.answer)


def test_a_stop_while_the_remote_task_asks_a_person_cancels_it(setup: Setup) -> None:
    handle = setup.fleet.submit(
        "ask, then stop",
        model=script(setup, "askstop", [delegate("ask again", "reviewer"), {"content": "x"}]),
    )

    def asked() -> bool:
        found = children(setup.fleet, handle.trace_id)
        return bool(found) and found[0].run.waiting_on is not None

    wait_until(asked, 30, "the remote task's question reached a person")
    task_id = setup.reviewer.record.messages[-1][0]
    setup.fleet.stop(handle.trace_id)
    assert handle.wait(30).status == "stopped"
    wait_until(lambda: task_id in setup.reviewer.record.canceled, 20, "the remote task cancelled")


def test_the_trees_wall_s_ends_a_remote_child_and_cancels_its_task(setup: Setup) -> None:
    from fleet.limits.budget import Budget

    model = script(setup, "walled", [delegate("slow 60", "fresh"), {"content": "out of time"}])
    started = time.monotonic()
    handle = setup.fleet.submit("walled review", model=model, budget=Budget(wall_s=3))
    root = handle.wait(60)
    assert root.is_terminal and time.monotonic() - started < 30
    (child,) = children(setup.fleet, handle.trace_id)
    assert child.status == "failed" and "no answer in time" in str(child.error)
    assert child.run.remote_call is not None
    task_id = child.run.remote_call.task_id
    wait_until(lambda: task_id in setup.fresh.record.canceled, 20, "the remote task cancelled")
