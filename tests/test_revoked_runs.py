"""A fleet run discarded as revoked raises its trace's stop flag again (`workers.revoked`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet import lifecycle
from fleet.conversation.continuation import stamp
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessFleet
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.testing import ScriptedModel
from workers.revoked import stop_revoked


def a_root(tmp_path: Path) -> tuple[Runtime, Trace]:
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}), clients={"test": ScriptedModel([])}
    )
    runtime = local.runtime
    root = lifecycle.start(runtime, create_root(runtime, TaskSpec(task="work", model="test")))
    return runtime, root


@pytest.mark.parametrize("task", ["fleet.run_agent", "fleet.resume_agent"])
def test_a_discarded_run_of_the_stopped_turn_raises_the_flag(tmp_path: Path, task: str) -> None:
    runtime, root = a_root(tmp_path)
    stamps = {"root_trace_id": stamp(root.trace_id, 0), "parent_trace_id": ""}
    assert stop_revoked(runtime, task, [root.trace_id], stamps)
    assert runtime.store.stop_requested(root.trace_id)


def test_a_stale_run_of_an_earlier_turn_stops_nothing(tmp_path: Path) -> None:
    # The root was stopped in turn 0 and continued (turn 1): a late copy of a turn-0 task
    # discarded by a worker must not stop the turn that runs now.
    runtime, root = a_root(tmp_path)
    runtime.store.update_run(root.trace_id, turn=1)
    stale = {"root_trace_id": stamp(root.trace_id, 0)}
    assert not stop_revoked(runtime, "fleet.run_agent", [root.trace_id], stale)
    assert not runtime.store.stop_requested(root.trace_id)


@pytest.mark.parametrize(
    ("task", "args", "stamps"),
    [
        ("fleet.collect", ["ROOT"], {"root_trace_id": "ROOT"}),  # not a run
        ("fleet.run_agent", [], {"root_trace_id": "ROOT"}),  # no trace id
        ("fleet.run_agent", ["no-such-trace"], {"root_trace_id": "no-such-trace"}),
        ("fleet.run_agent", ["ROOT"], {}),  # unstamped: not revoked by a stop
        ("fleet.run_agent", ["ROOT"], {"root_trace_id": ["ROOT"]}),  # a hostile stamp
    ],
)
def test_what_is_not_a_discarded_run_of_a_live_trace_raises_nothing(
    tmp_path: Path, task: str, args: list[str], stamps: dict[str, object]
) -> None:
    runtime, root = a_root(tmp_path)
    args = [root.trace_id if a == "ROOT" else a for a in args]
    stamps = {k: root.trace_id if v == "ROOT" else v for k, v in stamps.items()}
    assert not stop_revoked(runtime, task, args, stamps)
    assert not runtime.store.stop_requested(root.trace_id)


def test_an_ended_trace_is_left_alone(tmp_path: Path) -> None:
    runtime, root = a_root(tmp_path)
    lifecycle.finish(runtime, root.trace_id, "completed", answer="done", reason="final_answer")
    stamps = {"root_trace_id": stamp(root.trace_id, 0)}
    assert not stop_revoked(runtime, "fleet.run_agent", [root.trace_id], stamps)
    assert not runtime.store.stop_requested(root.trace_id)
