"""A stop of an in-process tree whose remote child waits on a person cancels the remote task.

`fleet run --inline` / `InProcessFleet` follows a remote task on the child's run only; once
the task asks a person (input-required) the run ends and nothing follows it. A stop then,
through `InProcessFleet.stop` or `Fleet.stop` (`fleet stop` from another terminal), cancels
the task at the a2a-sdk agent, as a worker's watcher does (tests/test_remote_fleet.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.client import Fleet
from fleet.inprocess import InProcessFleet
from fleet.models import Mode
from fleet.runtime import Runtime
from fleet.testing import ScriptedModel, call, text
from tests.a2a_agent import serve_reviewer
from tests.test_remote_agents import build, only_child

pytestmark = pytest.mark.timeout(90)


class NoQueue:
    """A backend for `Fleet` with nothing queued: `fleet stop` on a tree that ran inline."""

    def enqueue(self, trace: object, priority: str = "interactive") -> None:
        raise AssertionError("nothing is enqueued here")

    def revoke(self, stamps: list[str]) -> None:
        pass

    def queue(self, mode: Mode) -> str | None:
        return None


def asked(tmp_path: Path, url: str, env: dict[str, str]) -> tuple[InProcessFleet, Runtime, str]:
    """An inline tree whose remote child's task asks a person: (fleet, runtime, root id)."""
    model = ScriptedModel([call("agent", task="ask first", agent="reviewer"), text("x")])
    entry = {"url": url, "private": True, "token_env": "REVIEW_TOKEN"}
    fleet, runtime = build(tmp_path, {"reviewer": entry}, model, env=env)
    root = fleet.run("review it", model="m")
    child = only_child(runtime, root)
    assert child.status == "waiting" and child.run.waiting_on is not None
    assert child.run.remote_call is not None and child.run.remote_call.state == "input"
    return fleet, runtime, root.trace_id


@pytest.mark.parametrize("stopper", ["InProcessFleet.stop", "Fleet.stop"])
def test_a_stop_while_an_inline_remote_task_asks_a_person_cancels_it(
    tmp_path: Path, stopper: str
) -> None:
    with serve_reviewer(token="s3cret-tok") as agent:
        fleet, runtime, root_id = asked(tmp_path, agent.url, {"REVIEW_TOKEN": "s3cret-tok"})
        ((task_id, _, _),) = agent.record.messages
        assert agent.record.canceled == []
        if stopper == "Fleet.stop":
            ids = Fleet(runtime, NoQueue()).stop(root_id)
        else:
            ids = fleet.stop(root_id)
        assert agent.record.canceled == [task_id]  # at once: nothing else follows it
    child = runtime.store.get_trace(ids[1])
    assert child.status == "stopped" and runtime.store.get_trace(root_id).status == "stopped"


def test_a_stopper_without_the_agents_token_stops_the_tree_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with serve_reviewer(token="s3cret-tok") as agent:
        _, runtime, root_id = asked(tmp_path, agent.url, {"REVIEW_TOKEN": "s3cret-tok"})
        elsewhere = replace(runtime.settings, env={})  # another terminal's environment
        stopper = Runtime.build(elsewhere, runtime.store, runtime.dispatcher)
        with caplog.at_level(logging.WARNING, "fleet.remote.run"):
            ids = Fleet(stopper, NoQueue()).stop(root_id)
        assert agent.record.canceled == []
    assert all(runtime.store.get_trace(i).status == "stopped" for i in ids)
    assert "variable REVIEW_TOKEN is not set" in caplog.text and "s3cret-tok" not in caplog.text
