"""Lists of waits on a person read the index of waits, not the newest traces.

`fleet trace list --waiting` and `Fleet.waiting` (`human.waiting_traces`), the page's
`GET /api/traces?waiting=` and `GET /api/approvals` each found a wait only among the newest
1,000 / 2,000 / `limit` traces: past that many newer ones, a person's question or an
approval was not listed at all. Every store: memory, fakeredis, a real Redis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.conversation import approval, human
from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import ToolCall
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleetops.serve import listing
from fleetops.serve.api_approvals import waiting_approvals

NEWER = 1_001
"""Traces created after the waits: more than the oldest limit (1,000) read."""


def runtime_on(store: TraceStore, tmp_path: Path) -> Runtime:
    return Runtime.build(Settings(workspace=tmp_path, env={}), store, InProcessDispatcher())


def trace(store: TraceStore, trace_id: str, created_ms: int) -> Trace:
    made = Trace(trace_id=trace_id, root_trace_id=trace_id, task="t", created_at_ms=created_ms)
    store.create_trace(made)
    return made


def asks(runtime: Runtime, trace_id: str, created_ms: int) -> None:
    waiting = {"kind": "question", "tool_call_id": f"c-{trace_id}", "question": "colour?"}
    human.wait_for_person(runtime, trace(runtime.store, trace_id, created_ms), waiting)


def awaits_approval(runtime: Runtime, trace_id: str, created_ms: int) -> None:
    call = ToolCall(id=f"w-{trace_id}", name="write_file", arguments='{"path": "x"}')
    approval.request(runtime, trace(runtime.store, trace_id, created_ms), call)


def newer(store: TraceStore, count: int, after_ms: int) -> None:
    for n in range(count):
        trace(store, f"later-{n:05d}", after_ms + n)


def test_a_wait_older_than_a_thousand_traces_is_listed(store: TraceStore, tmp_path: Path) -> None:
    runtime = runtime_on(store, tmp_path)
    asks(runtime, "asked-first", 1_000)
    awaits_approval(runtime, "approve-first", 1_001)
    trace(store, "gone", 1_002)
    store.index_human_wait("gone-long-ago", 10**13)  # its trace expired: skipped
    store.index_human_wait("gone", 10**13)  # no longer waits (never did): skipped
    newer(store, NEWER, 2_000)

    found = [t.trace_id for t in human.waiting_traces(store, limit=10)]

    assert found == ["approve-first", "asked-first"]
    assert [t.trace_id for t in human.waiting_traces(store, limit=1)] == ["approve-first"]


def test_the_page_lists_a_wait_older_than_its_scan(
    store: TraceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "SCAN_TRACES", 5)  # the old bound, made small
    runtime = runtime_on(store, tmp_path)
    asks(runtime, "asked-first", 1_000)
    awaits_approval(runtime, "approve-first", 1_001)
    newer(store, 10, 2_000)

    def ids(**query: str) -> list[str]:
        page = listing.list_traces(store, listing.TraceFilter.parse(query))
        return [row["trace_id"] for row in page["traces"]]

    assert ids(waiting="any") == ["approve-first", "asked-first"]
    assert ids(waiting="person") == ["asked-first"]
    assert ids(waiting="approval") == ["approve-first"]
    assert ids(waiting="any", limit="1") == ["approve-first"]
    first = listing.list_traces(store, listing.TraceFilter.parse({"waiting": "any", "limit": "1"}))
    cursor = {"waiting": "any", "limit": "1", "cursor": str(first["next"])}
    assert ids(**cursor) == ["asked-first"]


class Waits:
    """What `waiting_approvals` asks of a `Fleet`."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store

    def waiting(self, limit: int) -> list[Trace]:
        return human.waiting_traces(self.store, limit)


def test_approvals_are_listed_past_newer_questions(store: TraceStore, tmp_path: Path) -> None:
    runtime = runtime_on(store, tmp_path)
    awaits_approval(runtime, "approve-first", 1_000)
    for n in range(5):  # newer waits, each a question
        asks(runtime, f"asked-{n}", 2_000 + n)

    fleet: Any = Waits(store)
    found = waiting_approvals(fleet, 2)

    assert [a["trace_id"] for a in found] == ["approve-first"]
    assert found[0]["tool"] == "write_file"
