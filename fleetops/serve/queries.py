"""What the trace API answers, as JSON-ready values read from the store (no HTTP here)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from fleet import ids
from fleet.control import subtree
from fleet.errors import FleetError, InvalidTraceId
from fleet.models import Message, Status, Trace
from fleet.storage.store import TraceStore

EVENT_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
"""A Redis stream entry id, as SSE `id:` lines carry it and `Last-Event-ID` returns it."""
MAX_LIMIT = 1000
STATUSES: tuple[str, ...] = get_args(Status)
DEFAULT_LIMIT = 100


class BadRequest(FleetError):
    """A request the API cannot answer as asked: the message says what and where."""


def check_trace_id(trace_id: str) -> str:
    """The id if it can be a trace id (`fleet.ids`), else `BadRequest`: nothing is read."""
    try:
        return ids.check_trace_id(trace_id)
    except InvalidTraceId as exc:
        raise BadRequest(str(exc)) from None


def check_event_id(event_id: str) -> str:
    """A stream position to resume after (`0` is the start)."""
    if event_id != "0" and not EVENT_ID.match(event_id):
        raise BadRequest(f"Last-Event-ID {event_id[:40]!r} is not a stream id like 1700000000-0")
    return event_id


@dataclass(frozen=True)
class TraceFilter:
    """The `GET /api/traces` query: every field optional."""

    status: str | None = None
    root: str | None = None
    """A root trace id: that tree only, parents first."""
    waiting: bool = False
    """Only traces waiting on a person (a `human` collaborator in status `waiting`)."""
    limit: int = DEFAULT_LIMIT

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> TraceFilter:
        """From query arguments; `BadRequest` names the bad one."""
        unknown = sorted(set(query) - {"status", "root", "waiting", "limit"})
        if unknown:
            raise BadRequest(f"unknown query argument(s) {unknown!r}")
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            raise BadRequest(f"status {status[:40]!r} is not one of {', '.join(STATUSES)}")
        root = query.get("root") or None
        waiting = query.get("waiting", "").lower()
        if waiting not in ("", "0", "1", "true", "false"):
            raise BadRequest(f"waiting {waiting[:20]!r} must be 1/true or 0/false")
        limit_text = query.get("limit", str(DEFAULT_LIMIT))
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
            raise BadRequest(f"limit {limit_text[:20]!r} must be an integer 1..{MAX_LIMIT}")
        return cls(
            status=status,
            root=check_trace_id(root) if root else None,
            waiting=waiting in ("1", "true"),
            limit=int(limit_text),
        )


def list_traces(store: TraceStore, query: TraceFilter) -> list[dict[str, Any]]:
    """Newest first (a tree: parents first), filtered, at most `limit`."""
    if query.root is not None:
        traces = [store.get_trace(t) for t in subtree(store, query.root)]
    else:
        # Filters drop entries, so read a wider window than the limit asks for.
        window = query.limit if query.status is None and not query.waiting else MAX_LIMIT
        traces = store.list_traces(limit=window)
    if query.status is not None:
        traces = [t for t in traces if t.status == query.status]
    if query.waiting:
        traces = [t for t in traces if waits_on_human(store, t)]
    return [summary(t) for t in traces[: query.limit]]


def waits_on_human(store: TraceStore, trace: Trace) -> bool:
    """Whether a waiting trace waits on a person rather than on sub-agents."""
    if trace.status != "waiting":
        return False
    return any(
        c.type == "human" and c.status == "waiting" for c in store.collaborators(trace.trace_id)
    )


def trace_detail(store: TraceStore, trace_id: str) -> dict[str, Any]:
    """The trace, its children (summaries) and its collaborators."""
    trace = store.get_trace(trace_id)
    children = [store.get_trace(c) for c in store.children(trace_id)]
    messages = store.messages(trace_id)
    return {
        "trace": {**trace.model_dump(mode="json"), "last_tool": last_tool(messages)},
        "children": [summary(c) for c in children],
        "collaborators": [c.model_dump(mode="json") for c in store.collaborators(trace_id)],
    }


def trace_messages(store: TraceStore, trace_id: str) -> list[dict[str, Any]]:
    """Every message of the trace (all branches), by sequence."""
    store.get_trace(trace_id)  # TraceNotFound for an unknown id, not an empty list
    return [m.model_dump(mode="json") for m in store.messages(trace_id)]


def summary(trace: Trace) -> dict[str, Any]:
    """What a list shows of a trace: no task text beyond a line, no messages."""
    return {
        "trace_id": trace.trace_id,
        "root_trace_id": trace.root_trace_id,
        "parent_trace_id": trace.parent_trace_id,
        "name": trace.name,
        "mode": trace.mode,
        "status": trace.status,
        "task": trace.task[:200],
        "model": trace.model,
        "iteration": trace.iteration,
        "stats": trace.stats.model_dump(mode="json"),
        "stop_reason": trace.metadata.get("stop_reason"),
        "created_at_ms": trace.created_at_ms,
        "updated_at_ms": trace.updated_at_ms,
        "finished_at_ms": trace.finished_at_ms,
    }


def last_tool(messages: list[Message]) -> str | None:
    """The name of the last tool the trace's model called."""
    for message in reversed(messages):
        if message.tool_calls:
            return str(message.tool_calls[-1].get("function", {}).get("name") or "") or None
    return None
