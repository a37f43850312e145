"""`TraceStore.apply` and `begin_run`, against every backend: one step, same result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import pytest
import redis

from fleet import lifecycle
from fleet.errors import TraceNotFound
from fleet.inprocess import InProcessFleet
from fleet.llm.base import LLMResponse, Usage
from fleet.models import Collaborator, Event, Message, Status, Trace
from fleet.settings import Settings
from fleet.storage import keys as fleet_keys
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.inbox import INBOX
from fleet.storage.inbox_types import InboxLimits, Posted
from fleet.storage.one_by_one import apply_one_by_one
from fleet.storage.store import STARTABLE, TraceStore
from fleet.storage.writes import InboxSeen, TraceWrite
from fleet.testing import ScriptedModel, call, text


def make(store: TraceStore, trace_id: str, parent: str | None = None) -> Trace:
    trace = Trace(trace_id=trace_id, root_trace_id="root", parent_trace_id=parent, task="do")
    store.create_trace(trace)
    return trace


def a_turn(trace_id: str, parent: str) -> TraceWrite:
    """Everything a branch writes from its last model turn to its end."""
    write = TraceWrite(trace_id, "root")
    write.update(Event(kind="trace", trace_id=trace_id, status="running"), status="running")
    write.append(Message(trace_id=trace_id, role="system", content="be brief"))
    model_turn = Message(
        trace_id=trace_id,
        role="assistant",
        content=None,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "x", "arguments": ""}}],
        model="scripted",
        prompt_tokens=7,
        completion_tokens=3,
        cost_usd=0.25,
    )
    assistant = Event(kind="message", trace_id=trace_id, data={"role": "assistant"})
    write.append(model_turn, assistant, iteration=1)
    tool = Message(trace_id=trace_id, role="tool", tool_call_id="c1", content="[]")
    write.append(tool, Event(kind="message", trace_id=trace_id, data={"role": "tool"}))
    write.update(None, status="completed", answer="done", finished_at_ms=5)
    write.add_stats(duration_ms=12)
    entry = Collaborator(name="b", trace_id=trace_id, status="completed", summary="done")
    collaborator = Event(kind="collaborator", trace_id=trace_id, status="completed")
    write.put_collaborator(parent, entry, collaborator)
    write.emit(Event(kind="finish", trace_id=trace_id, status="completed"))
    return write


def state(store: TraceStore, trace_id: str, parent: str) -> dict[str, Any]:
    """Everything the write touched, with the parts that differ by time or id left out."""
    varying = {"trace_id", "created_at_ms", "updated_at_ms"}
    trace = store.get_trace(trace_id).model_dump(exclude=varying)
    messages = [
        m.model_dump(exclude={"trace_id", "created_at_ms"}) for m in store.messages(trace_id)
    ]
    events = [
        (e.kind, e.status, e.data) for _, e in store.read_events("root") if e.trace_id == trace_id
    ]
    entries = [
        c.model_dump(exclude={"trace_id", "updated_at_ms"})
        for c in store.collaborators(parent)
        if c.trace_id == trace_id
    ]
    return {"trace": trace, "messages": messages, "events": events, "collaborators": entries}


def test_apply_leaves_what_the_single_writes_leave(store: TraceStore) -> None:
    make(store, "root")
    make(store, "one", parent="root")
    make(store, "two", parent="root")
    result = store.apply(a_turn("one", "root"))
    apply_one_by_one(store, a_turn("two", "root"))
    assert state(store, "one", "root") == state(store, "two", "root")
    assert [m.sequence for m in result.messages] == [1, 2, 3]
    assert [m.parent_sequence for m in result.messages] == [None, 1, 2]
    assert result.messages == store.messages("one")
    trace = store.get_trace("one")
    assert (trace.iteration, trace.head_sequence, trace.status) == (1, 3, "completed")
    assert trace.stats.model_dump() == {
        "messages": 1,
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "cost_usd": 0.25,
        "duration_ms": 12,
        "cached_tokens": 0,
        "cache_write_tokens": 0,
    }
    events = [e for _, e in store.read_events("root") if e.trace_id == "one"]
    assert [e.kind for e in events] == ["trace", "message", "message", "collaborator", "finish"]
    assert [e.data.get("sequence") for e in events[1:3]] == [2, 3]


def test_apply_reports_a_stop_and_releases_only_its_own_lease(store: TraceStore) -> None:
    make(store, "t")
    assert store.acquire_lease("t", "me", 10_000)
    assert (
        store.apply(TraceWrite("t", "root").release_lease("someone else")).stop_requested is False
    )
    assert not store.acquire_lease("t", "other", 10_000), "a stranger's release freed the lease"
    store.request_stop("t")
    assert store.apply(TraceWrite("t", "root").release_lease("me")).stop_requested is True
    assert store.acquire_lease("t", "other", 10_000)
    assert store.expired_leases(10**15) == ["t"]


def test_apply_to_a_missing_trace_writes_nothing(store: TraceStore) -> None:
    write = TraceWrite("ghost", "root").append(Message(trace_id="ghost", role="user", content="x"))
    with pytest.raises(TraceNotFound):
        store.apply(write)
    assert store.messages("ghost") == []


def test_begin_run_takes_the_lease_and_reads_the_trace(store: TraceStore) -> None:
    make(store, "t")
    store.append_message(Message(trace_id="t", role="user", content="hi"))
    snapshot = store.begin_run("t", "me", 10_000)
    assert snapshot is not None
    assert snapshot.trace.trace_id == "t" and snapshot.trace.head_sequence == 1
    assert [m.content for m in snapshot.messages] == ["hi"] and not snapshot.stop_requested
    assert store.begin_run("t", "other", 10_000) is None
    assert store.begin_run("t", "me", 10_000) is not None, "the holder may begin again"


def test_begin_run_and_a_write_read_the_inbox_in_the_same_step(store: TraceStore) -> None:
    # Every store, the memory twin too: the run's first call then reads no inbox of its own.
    make(store, "t")
    began = store.begin_run("t", "me", 10_000)
    assert began is not None and began.inbox == InboxSeen(None)
    limits = InboxLimits(per_minute=10, max_messages=10, sends_per_minute=10)
    entry = store.capability(INBOX).post(
        "t", Posted(sender="ops", content="hi"), limits, sender_trace_id=None
    )
    again = store.begin_run("t", "me", 10_000)
    assert again is not None and again.inbox == InboxSeen(entry)
    written = store.apply(TraceWrite("t", "t").update(None, status="running").read_inbox())
    assert written.inbox == InboxSeen(entry), "a write that asks reads it in its step too"
    assert store.apply(TraceWrite("t", "t").update(None, status="running")).inbox is None


def test_begin_run_of_a_missing_trace_takes_no_lease(store: TraceStore) -> None:
    with pytest.raises(TraceNotFound):
        store.begin_run("ghost", "me", 10_000)
    assert store.expired_leases(10**15) == []


def test_a_write_mixes_no_parents() -> None:
    write = TraceWrite("t", "root").put_collaborator("p1", Collaborator(name="a", trace_id="t"))
    with pytest.raises(ValueError, match="one parent"):
        write.put_collaborator("p2", Collaborator(name="a", trace_id="t"))


def test_every_key_a_run_leaves_expires(redis_db: redis.Redis, tmp_path: Path) -> None:
    """The per-turn writes refresh TTLs only on status changes: nothing is left without one."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        answered = any(m["role"] == "tool" for m in messages)
        if answered:
            return text(f"done: {task}")
        if task.startswith("branch"):
            return call("list_dir", path=".")
        return call("agent", task=["branch 1", "branch 2"])

    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}),
        store=RedisStore(redis_db),
        clients={"test": ScriptedModel(function=respond)},
    )
    trace = local.run("survey", model="test")
    assert trace.status == "completed"
    assert len(local.store.collaborators(trace.trace_id)) == 2
    keys = [str(k) for k in redis_db.scan_iter(f"{fleet_keys.PREFIX}:trace:*")]
    assert len(keys) >= 8  # 3 traces (messages inside), events, entries, order, children, mark
    assert {k: redis_db.ttl(k) for k in keys if redis_db.ttl(k) < 0} == {}


def test_create_traces_creates_what_is_new(store: TraceStore) -> None:
    make(store, "root")
    make(store, "taken", parent="root")
    batch = [
        Trace(trace_id=i, root_trace_id="root", parent_trace_id="root", task="t")
        for i in ("new-1", "taken", "new-2")
    ]
    assert store.create_traces(batch) == [True, False, True]
    assert sorted(store.children("root")) == ["new-1", "new-2", "taken"]
    assert store.get_trace("taken").task == "do", "an existing trace was overwritten"


def test_one_write_of_many_entries_lists_each_new_child_once(store: TraceStore) -> None:
    """A spawn's entries, some new and one written twice, next to an existing one."""
    make(store, "p")
    store.put_collaborator("p", Collaborator(name="a", trace_id="p@a"))
    write = TraceWrite("p", "root")
    for child, summary in [("p@b", "one"), ("p@a", "again"), ("p@c", ""), ("p@b", "two")]:
        write.put_collaborator("p", Collaborator(name=child, trace_id=child, summary=summary))
    store.apply(write)
    entries = store.collaborators("p")
    assert [(c.trace_id, c.summary) for c in entries] == [
        ("p@a", "again"),
        ("p@b", "two"),
        ("p@c", ""),
    ]


def test_a_collect_leaves_the_entries_a_finish_wrote(store: TraceStore, tmp_path: Path) -> None:
    """Each branch's finish wrote its entry (costs summed as floats): the collect adds none."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        if task.startswith("branch"):
            if any(m["role"] == "tool" for m in messages):
                return replace(text("done"), usage=Usage(7, 3, cost_usd=0.2))
            return replace(call("list_dir", path="."), usage=Usage(7, 3, cost_usd=0.1))
        if any(m["role"] == "tool" for m in messages):
            return text("summary")
        return call("agent", task=["branch 1", "branch 2", "branch 3"])

    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}),
        store=store,
        clients={"test": ScriptedModel(function=respond)},
    )
    trace = local.run("survey", model="test")
    assert trace.status == "completed"
    entries = local.store.collaborators(trace.trace_id)
    assert [round(c.stats.cost_usd, 9) for c in entries] == [0.3] * 3
    assert all(c.stats.duration_ms >= 0 and c.status == "completed" for c in entries)
    events = [e for _, e in local.store.read_events(trace.trace_id)]
    announced = [(e.trace_id, e.status) for e in events if e.kind == "collaborator"]
    assert [status for _, status in announced] == ["queued"] * 3, "the collect rewrote entries"


@pytest.mark.parametrize("trace_id", ["t", "root@child", "@odd", "odd@"])
def test_begin_run_starts_a_trace_of_the_root_its_id_names(
    store: TraceStore, trace_id: str
) -> None:
    """Queued -> running with its event in the lease's step; another root's trace is left."""
    root = trace_id.split("@")[0] or trace_id
    store.create_trace(Trace(trace_id=trace_id, root_trace_id=root, task="do"))
    store.create_trace(Trace(trace_id="x@y", root_trace_id="elsewhere", task="do"))
    for tid in (trace_id, "x@y"):
        snapshot = store.begin_run(tid, "me", 10_000, lifecycle.starting(tid))
        assert snapshot is not None
    assert store.get_trace(trace_id).status == "running"
    assert store.get_trace("x@y").status == "queued", "a guess that missed wrote nothing"
    events = [(e.kind, e.status) for _, e in store.read_events(root)]
    assert events == [("trace", "running")]
    assert store.read_events("x") == [] and store.read_events("elsewhere") == []


def test_a_write_puts_collaborators_into_one_parent_only() -> None:
    entry = Collaborator(name="a", trace_id="c1")
    write = TraceWrite("c1", "root").put_collaborator("p", entry).put_collaborator("p", entry)
    with pytest.raises(ValueError, match="one parent only"):
        write.put_collaborator("q", entry)
    assert len(write.ops) == 2


@pytest.mark.parametrize("status", get_args(Status))
def test_begin_run_starts_exactly_the_startable_statuses_on_every_store(
    store: TraceStore, status: Status
) -> None:
    """`STARTABLE` is the one rule: the Lua (generated from it) and the memory store agree."""
    store.create_trace(Trace(trace_id="r", root_trace_id="r", task="do", status=status))
    snapshot = store.begin_run("r", "me", 10_000, lifecycle.starting("r"))
    assert snapshot is not None
    started = status in STARTABLE
    expected = "running" if started else status
    assert snapshot.trace.status == expected and store.get_trace("r").status == expected
    events = [(e.kind, e.status) for _, e in store.read_events("r")]
    assert events == ([("trace", "running")] if started else [])
