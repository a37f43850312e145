"""What the trace API answers about one trace, as JSON-ready values (no HTTP here)."""

from __future__ import annotations

import re
from typing import Any

from fleet.conversation.continuation import branches
from fleet.history import main_path
from fleet.limits.capability import budget_state
from fleet.models import Message
from fleet.storage.store import TraceStore
from fleetops.serve.listing import BadRequest, check_trace_id, summary

__all__ = [
    "BadRequest",
    "check_event_id",
    "check_mode",
    "check_trace_id",
    "trace_detail",
    "trace_messages",
]

MESSAGE_MODES = ("all", "main_path")
EVENT_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
"""A Redis stream entry id, as SSE `id:` lines carry it and `Last-Event-ID` returns it."""


def check_event_id(event_id: str) -> str:
    """A stream position to resume after (`0` is the start)."""
    if event_id != "0" and not EVENT_ID.match(event_id):
        raise BadRequest(f"Last-Event-ID {event_id[:40]!r} is not a stream id like 1700000000-0")
    return event_id


def trace_detail(store: TraceStore, trace_id: str) -> dict[str, Any]:
    """The trace, its children (summaries), its collaborators, the models that answered it.

    A root also carries its tree's `budget` (limit, used, reserved; None without one).
    """
    trace = store.get_trace(trace_id)
    children = store.get_traces(store.children(trace_id))
    messages = store.messages(trace_id)
    out: dict[str, Any] = {
        "trace": {**trace.model_dump(mode="json"), "last_tool": last_tool(messages)},
        "children": [summary(c) for c in children],
        "collaborators": [c.model_dump(mode="json") for c in store.collaborators(trace_id)],
        "models": models_answered(messages),
    }
    if trace.parent_trace_id is None:
        state = budget_state(store, trace_id)
        out["budget"] = state.to_json() if state is not None else None
    return out


def check_mode(mode: str) -> str:
    """`all` or `main_path`, the `mode=` of `GET /api/traces/{id}/messages`."""
    if mode not in MESSAGE_MODES:
        raise BadRequest(f"mode {mode[:40]!r} is not one of {', '.join(MESSAGE_MODES)}")
    return mode


def trace_messages(store: TraceStore, trace_id: str, mode: str = "all") -> dict[str, Any]:
    """The trace's messages by sequence, the head, and the branches.

    `all`: every branch; `main_path`: the root down to the head (what the model is shown
    next).
    """
    trace = store.get_trace(trace_id)  # TraceNotFound for an unknown id, not an empty list
    messages = store.messages(trace_id)
    shown = main_path(messages, trace.head_sequence) if mode == "main_path" else messages
    return {
        "mode": mode,
        "messages": [m.model_dump(mode="json") for m in shown],
        "head_sequence": trace.head_sequence,
        "branches": branches(messages, trace.head_sequence),
    }


def last_tool(messages: list[Message]) -> str | None:
    """The name of the last tool the trace's model called."""
    for message in reversed(messages):
        if message.tool_calls:
            return str(message.tool_calls[-1].get("function", {}).get("name") or "") or None
    return None


def models_answered(messages: list[Message]) -> dict[str, int]:
    """Which models wrote the trace's assistant turns, and how many each (a fallback shows)."""
    counts: dict[str, int] = {}
    for message in messages:
        if message.role == "assistant" and message.model:
            counts[message.model] = counts.get(message.model, 0) + 1
    return counts
