"""Continue, rewind and ask a person, in one process: scripted models, every store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.conversation.continuation import branches
from fleet.conversation.human import human_id, time_out_waits, waiting_on
from fleet.errors import ConversationError, TraceNotFound
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.models import now_ms
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text


def local_fleet(store: TraceStore, workspace: Path, model: ScriptedModel) -> InProcessFleet:
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    return InProcessFleet(runtime)


def users(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages if m["role"] == "user"]


def echo_turns(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Answers with the user messages it sees, so each request shows its history."""
    return text(" | ".join(users(messages)))


def test_continue_twice_keeps_one_trace_with_three_user_turns(
    store: TraceStore, tmp_path: Path
) -> None:
    model = ScriptedModel(function=echo_turns)
    local = local_fleet(store, tmp_path, model)
    first = local.run("first task", model="test")
    second = local.continue_trace(first.trace_id, "second message")
    third = local.continue_trace(first.trace_id, "third message")
    assert third.trace_id == first.trace_id and third.status == "completed"
    assert second.answer == "first task | second message"
    assert third.answer == "first task | second message | third message"
    assert third.run.turn == 2 and third.iteration == 1
    assert len(store.list_traces()) == 1, "one tree, no new root"


def test_rewind_branches_off_and_both_branches_stay(store: TraceStore, tmp_path: Path) -> None:
    model = ScriptedModel(function=echo_turns)
    local = local_fleet(store, tmp_path, model)
    root = local.run("task", model="test")
    local.continue_trace(root.trace_id, "make it blue")
    messages = store.messages(root.trace_id)
    first_answer = next(m for m in messages if m.role == "assistant")
    redone = local.continue_trace(root.trace_id, "make it red", first_answer.sequence)
    assert redone.answer == "task | make it red", "the blue turn is off the main path"
    found = branches(store.messages(root.trace_id), redone.head_sequence)
    assert len(found) == 2
    main = next(b for b in found if b["main"])
    old = next(b for b in found if not b["main"])
    assert [t["content"] for t in main["user_turns"]][-1] == "make it red"
    assert [t["content"] for t in old["user_turns"]][-1] == "make it blue"
    assert old["last"]["content"] == "task | make it blue"


def test_rewind_into_a_tool_turn_keeps_its_results(store: TraceStore, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A")
    script = [call("read_file", path="a.txt"), text("read it"), text("again")]
    local = local_fleet(store, tmp_path, ScriptedModel(script))
    root = local.run("read a", model="test")
    assistant = next(m for m in store.messages(root.trace_id) if m.tool_calls)
    redone = local.continue_trace(root.trace_id, "once more", assistant.sequence)
    path_roles = [m["role"] for m in local.runtime.clients["test"].requests[-1]]  # type: ignore[attr-defined]
    assert path_roles == ["system", "user", "assistant", "tool", "user"]
    assert redone.answer == "again"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        ("running", "is running"),
        ("sub", "is a sub-trace"),
        ("sequence", "has no message 999"),
        ("empty", "the message is empty"),
    ],
)
def test_bad_continue_is_refused_and_writes_nothing(
    store: TraceStore, tmp_path: Path, mutate: str, message: str
) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=echo_turns))
    root = local.run("task", model="test")
    target, text_, after = root.trace_id, "more", None
    if mutate == "running":
        store.update_trace(root.trace_id, status="running")
    elif mutate == "sub":
        from fleet.models import Trace

        sub = Trace(
            trace_id=f"{root.trace_id}@delegate-x",
            root_trace_id=root.trace_id,
            parent_trace_id=root.trace_id,
            mode="delegate",
            status="completed",
            task="t",
        )
        store.create_trace(sub)
        target = sub.trace_id
    elif mutate == "sequence":
        after = 999
    else:
        text_ = "  "
    before = (store.get_trace(target), store.messages(target))
    with pytest.raises(ConversationError, match=message):
        local.continue_trace(target, text_, after)
    assert (store.get_trace(target), store.messages(target)) == before
    with pytest.raises(TraceNotFound):
        local.continue_trace("no-such-trace", "more")


def asker(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Asks a person first, then answers with what the person said."""
    if not any(m["role"] == "tool" for m in messages):
        return call("ask_human", question="Which colour?")
    return text(f"painted it {messages[-1]['content']}")


def test_ask_human_waits_then_reply_resumes(store: TraceStore, tmp_path: Path) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=asker))
    trace = local.run("paint the shed", model="test")
    assert trace.status == "waiting"
    assert waiting_on(trace) is not None and waiting_on(trace)["question"] == "Which colour?"  # type: ignore[index]
    (person,) = store.collaborators(trace.trace_id)
    assert (person.type, person.status, person.summary) == ("human", "waiting", "Which colour?")
    assert store.expired_leases(now_ms() + 10**9) == [], "no runner holds the trace"
    done = local.reply(trace.trace_id, "green")
    assert done.status == "completed" and done.answer == "painted it green"
    (person,) = store.collaborators(trace.trace_id)
    assert (person.status, person.summary) == ("completed", "green")
    assert waiting_on(done) is None
    with pytest.raises(ConversationError, match="not waiting on a person"):
        local.reply(trace.trace_id, "blue")


def test_a_second_reply_is_refused(store: TraceStore, tmp_path: Path) -> None:
    from fleet.conversation import human

    local = local_fleet(store, tmp_path, ScriptedModel(function=asker))
    trace = local.run("paint the shed", model="test")
    human.reply(local.runtime, trace.trace_id, "green")  # queued, not yet run
    before = store.messages(trace.trace_id)
    with pytest.raises(ConversationError, match="not waiting"):
        human.reply(local.runtime, trace.trace_id, "blue")
    assert store.messages(trace.trace_id) == before


def test_a_timeout_answers_the_question_and_the_agent_goes_on(
    store: TraceStore, tmp_path: Path
) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=asker))
    trace = local.run("paint the shed", model="test")
    assert time_out_waits(local.runtime) == [], "not due yet"
    later_ms = now_ms() + 25 * 3600 * 1000
    assert time_out_waits(local.runtime, later_ms) == [trace.trace_id]
    assert time_out_waits(local.runtime, later_ms) == [], "claimed once"
    done = local._run(trace.trace_id)
    assert done.status == "completed" and "No reply from a person" in (done.answer or "")
    person = store.collaborators(trace.trace_id)[0]
    assert person.trace_id == human_id(person.tool_call_id or "") and person.status == "failed"


def test_stop_ends_the_wait_and_continue_heals_the_question(
    store: TraceStore, tmp_path: Path
) -> None:
    from fleet.lifecycle import stop_subtree

    local = local_fleet(store, tmp_path, ScriptedModel(function=asker))
    trace = local.run("paint the shed", model="test")
    stop_subtree(local.runtime, trace.trace_id)
    stopped = store.get_trace(trace.trace_id)
    assert stopped.status == "stopped"
    assert store.collaborators(trace.trace_id)[0].status == "stopped"
    assert store.expired_human_waits(now_ms() + 10**12) == []
    again = local.continue_trace(trace.trace_id, "use red")
    assert again.status == "completed"
    assert again.answer is not None and again.answer.startswith("painted it ")


@pytest.mark.parametrize("preset", ["explore", "evaluate"])
def test_read_only_presets_cannot_ask_a_person(
    store: TraceStore, tmp_path: Path, preset: str
) -> None:
    model = ScriptedModel([call("ask_human", question="may I?"), text("VERDICT: pass")])
    local = local_fleet(store, tmp_path, model)
    trace = local.run("look around", model="test", preset=preset)
    assert trace.status == "completed", "the refusal went back to the model"
    names = {t["function"]["name"] for t in model.tools_seen[0]}
    assert "ask_human" not in names, "not even offered"
    result = next(m for m in store.messages(trace.trace_id) if m.role == "tool")
    assert result.metadata["is_error"] and "not allowed" in (result.content or "")
    assert store.collaborators(trace.trace_id) == []


def test_a_delegate_cannot_ask_a_person(store: TraceStore, tmp_path: Path) -> None:
    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = users(messages)[0]
        has_tool = any(m["role"] == "tool" for m in messages)
        if task == "sub" and not has_tool:
            assert "ask_human" not in {t["function"]["name"] for t in tools}
            return call("ask_human", question="sneaky?")
        if task == "sub":
            return text(str(messages[-1]["content"]))
        if not has_tool:
            return call("agent", task="sub")
        return text(str(messages[-1]["content"]))

    local = local_fleet(store, tmp_path, ScriptedModel(function=respond))
    trace = local.run("main", model="test")
    assert trace.status == "completed"
    assert "not allowed" in (trace.answer or "")


def test_a_batch_records_the_question_and_leaves_the_trace_resumable(tmp_path: Path) -> None:
    from fleet.batch.run import BatchEntry, BatchOptions, run_batch
    from fleet.client import Fleet
    from fleet.storage.backends.memory.store import MemoryStore
    from tests.test_batch import ThreadBackend

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if users(messages)[0].startswith("ask"):
            return asker(messages, tools)
        return text("done")

    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(
        settings,
        MemoryStore(),
        InProcessDispatcher(),
        clients={"test": ScriptedModel(function=respond)},
    )
    backend = ThreadBackend(runtime)
    fleet = Fleet(runtime, backend)
    batch = [BatchEntry(f"e{i}", f"task {i}", i, model="test") for i in range(3)]
    batch.append(BatchEntry("q", "ask first", 4, model="test"))
    try:
        results = {r.id: r for r in run_batch(fleet, batch, BatchOptions(timeout_s=30))}
        asked = results["q"]
        assert (asked.status, asked.question) == ("waiting", "Which colour?")
        assert asked.to_json()["question"] == "Which colour?"
        assert "question" not in results["e0"].to_json()
        assert {results[f"e{i}"].status for i in range(3)} == {"completed"}
        done = fleet.reply(asked.trace_id, "teal").wait(timeout_s=30)
        assert done.answer == "painted it teal"
    finally:
        backend.pool.shutdown(wait=True)
