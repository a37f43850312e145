"""Every status change of a trace goes through `fleet.lifecycle`: its values and its writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet import lifecycle
from fleet.children import settling
from fleet.children.settling import AlreadyCollected, Settled, Waiting
from fleet.children.subagents import spawn
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessFleet
from fleet.llm.base import ToolCall
from fleet.loop.runner import Runner
from fleet.models import Message, Trace
from fleet.runtime import Runtime, SpawnRequest
from fleet.settings import Settings
from fleet.testing import ScriptedModel
from tests.fleetkit import RecordingDispatcher


def parent_with_calls(tmp_path: Path, *call_ids: str) -> tuple[Runtime, Trace, list[SpawnRequest]]:
    """A waiting root whose last turn made one `agent` call per id; children still queued."""
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}, summary_chars=12),
        clients={"test": ScriptedModel([])},
        dispatcher=RecordingDispatcher(children_survive_restart=True),
    )
    runtime = local.runtime
    root = create_root(runtime, TaskSpec(task="work", model="test"))
    agent_calls = [
        ToolCall(i, "agent", json.dumps({"task": [f"look {i}", f"read {i}"]})) for i in call_ids
    ]
    runtime.store.append_message(Message(trace_id=root.trace_id, role="user", content="work"))
    runtime.store.append_message(
        Message(
            trace_id=root.trace_id,
            role="assistant",
            tool_calls=[c.to_openai() for c in agent_calls],
        )
    )
    parent = lifecycle.start(runtime, root)
    requests = [spawn(runtime, parent, c) for c in agent_calls]
    return runtime, lifecycle.wait(runtime, parent), requests


def end_all(runtime: Runtime, request: SpawnRequest) -> None:
    for child_id in request.child_ids:
        lifecycle.finish(runtime, child_id, "completed", answer=f"answer of {child_id}", reason="x")


def test_settle_waits_while_a_child_runs_and_writes_nothing(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")

    outcome = settling.settle(runtime, parent.trace_id, "c1", request.child_ids)

    assert outcome == Waiting(pending=(second,))
    assert not [m for m in runtime.store.messages(parent.trace_id) if m.role == "tool"]
    entries = {c.trace_id: c.status for c in runtime.store.collaborators(parent.trace_id)}
    assert entries == {first: "completed", second: "running"}


def test_settle_writes_the_result_once_and_says_when_the_turn_is_complete(
    tmp_path: Path,
) -> None:
    runtime, parent, (one, two) = parent_with_calls(tmp_path, "c1", "c2")
    end_all(runtime, one)
    end_all(runtime, two)

    first = settling.settle(runtime, parent.trace_id, "c1", one.child_ids)
    again = settling.settle(runtime, parent.trace_id, "c1", one.child_ids)
    last = settling.settle(runtime, parent.trace_id, "c2", two.child_ids)

    assert first == Settled(parent.trace_id, "c1", turn_complete=False)
    assert again == AlreadyCollected()
    assert last == Settled(parent.trace_id, "c2", turn_complete=True)
    results = [m for m in runtime.store.messages(parent.trace_id) if m.role == "tool"]
    assert [m.tool_call_id for m in results] == ["c1", "c2"]
    assert settling.turn_complete(runtime.store, parent.trace_id)


def test_settle_from_a_child_finds_its_siblings(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "failed", error="boom", reason="crash")
    assert settling.settle_from_child(runtime, first) == Waiting(pending=(second,))
    lifecycle.finish(runtime, second, "completed", answer="ok", reason="final_answer")
    assert settling.settle_from_child(runtime, first) == Settled(parent.trace_id, "c1", True)
    assert settling.settle_from_child(runtime, second) == AlreadyCollected()
    assert settling.settle_from_child(runtime, parent.trace_id) == AlreadyCollected()


def test_finish_mirrors_the_child_into_its_parents_entry(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    child_id = request.child_ids[0]

    trace = lifecycle.finish(
        runtime, child_id, "completed", answer="a long answer indeed", reason="final_answer"
    )

    assert trace == runtime.store.get_trace(child_id)
    assert trace.run.stop_reason == "final_answer"
    entry = next(c for c in runtime.store.collaborators(parent.trace_id) if c.trace_id == child_id)
    assert (entry.status, entry.summary) == ("completed", "a long answe")  # summary_chars=12
    events = [e for _, e in runtime.store.read_events(parent.root_trace_id)]
    assert events[-1].kind == "finish" and events[-1].trace_id == child_id


def test_wait_is_an_event_and_hands_a_stop_to_the_new_children(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    events = [e for _, e in runtime.store.read_events(parent.root_trace_id)]
    assert [e.status for e in events if e.kind == "trace"] == ["queued", "running", "waiting"]

    running = lifecycle.start(runtime, parent)
    runtime.store.request_stop(parent.trace_id)
    lifecycle.wait(runtime, running)

    assert all(runtime.store.stop_requested(c) for c in request.child_ids)


def test_stop_subtree_finishes_what_no_runner_holds(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    held, queued = request.child_ids
    lifecycle.start(runtime, runtime.store.get_trace(held))  # a runner has it

    ids = lifecycle.stop_subtree(runtime, parent.trace_id)

    assert ids == [parent.trace_id, held, queued]
    statuses = {t: runtime.store.get_trace(t).status for t in ids}
    assert statuses == {parent.trace_id: "stopped", held: "running", queued: "stopped"}
    assert all(runtime.store.stop_requested(t) for t in ids)
    entry = {c.trace_id: c.status for c in runtime.store.collaborators(parent.trace_id)}
    assert entry == {held: "running", queued: "stopped"}


@pytest.mark.parametrize("status", ["completed", "failed", "stopped"])
def test_fail_leaves_an_ended_trace_alone(tmp_path: Path, status: str) -> None:
    runtime, parent, _ = parent_with_calls(tmp_path, "c1")
    ended = lifecycle.finish(runtime, parent.trace_id, status, reason="x")  # type: ignore[arg-type]
    assert lifecycle.fail(runtime, parent.trace_id, error="late", reason="chord_failed") is None
    assert runtime.store.get_trace(parent.trace_id) == ended


def test_reopen_queues_an_ended_child_for_a_new_call(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    child_id = request.child_ids[0]
    lifecycle.finish(runtime, child_id, "failed", error="boom", reason="crash")

    reopened = lifecycle.reopen(runtime, runtime.store.get_trace(child_id), "c9")

    stored = runtime.store.get_trace(child_id)
    assert (stored.status, stored.parent_tool_call_id, stored.error) == ("queued", "c9", None)
    assert reopened.status == stored.status


def test_queue_root_creates_the_root_queued_with_its_one_event(tmp_path: Path) -> None:
    runtime, _, _ = parent_with_calls(tmp_path, "c1")
    root = Trace(trace_id="root-1", root_trace_id="root-1", task="t", model="test")

    queued = lifecycle.queue_root(runtime, root.model_copy(update={"status": "running"}))

    assert queued.status == runtime.store.get_trace("root-1").status == "queued"
    events = [e for _, e in runtime.store.read_events("root-1")]
    assert [(e.kind, e.trace_id, e.status, e.data) for e in events] == [
        ("trace", "root-1", "queued", {})
    ]


def test_a_stop_as_a_resumed_parent_goes_back_to_waiting_ends_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bad instant: a run took the waiting parent (`running`) and finds its children
    # still running, when the stop lands. `stop_subtree` leaves a `running` trace to its
    # runner; the runner must see the flag as it goes back to `waiting`, or the parent
    # waits, stopped in name only, until the owner check (its resume is revoked).
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    for child in runtime.store.get_traces(request.child_ids):
        lifecycle.start(runtime, child)  # runners hold them: the stop leaves them too
    landed: list[list[str]] = []

    def settle_as_the_stop_lands(*args: object) -> settling.Settlement:
        if not landed:
            landed.append(lifecycle.stop_subtree(runtime, parent.trace_id))
        return real_settle(*args)  # type: ignore[arg-type]

    real_settle = settling.settle
    monkeypatch.setattr(settling, "settle", settle_as_the_stop_lands)

    result = Runner(runtime).run(parent.trace_id)

    assert landed and runtime.store.get_trace(parent.trace_id).status == "stopped"
    assert result.outcome == "stopped"
    assert all(runtime.store.stop_requested(c) for c in request.child_ids)
