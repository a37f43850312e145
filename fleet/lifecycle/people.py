"""Conversations: a continued root, a wait on a person (`ask_human`, an approval).

The person's `{type: human}` (or approval) entry is written through
`fleet.lifecycle.entries.put_collaborator`.
"""

from __future__ import annotations

from typing import Any

from fleet.lifecycle.entries import put_collaborator
from fleet.models import (
    Collaborator,
    CollaboratorStatus,
    CollaboratorType,
    Event,
    Trace,
    TracePatch,
)
from fleet.runtime import Runtime

PERSON_KEY = "waiting_on"
"""Trace metadata while a person is asked: tool_call_id, question, asked_at_ms, deadline_ms."""


def reopen_root(
    runtime: Runtime, trace: Trace, metadata: dict[str, Any], data: dict[str, Any]
) -> Trace:
    """A finished root takes a new user turn (continue/rewind): `queued`, answer cleared.

    `iteration` restarts (max_iterations counts per user turn) and the stop flag of an
    earlier `fleet stop` is lowered. `data` goes with the `trace` event (the turn number).
    """
    fields: TracePatch = {"status": "queued", "answer": None, "output": None}
    fields |= {"error": None, "finished_at_ms": None, "iteration": 0, "metadata": metadata}
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data=data)
    runtime.store.track_tree(trace.trace_id)
    runtime.store.update_trace_and_emit(trace.trace_id, trace.root_trace_id, event, **fields)
    runtime.store.clear_stop(trace.trace_id)
    return trace.model_copy(update=fields)


def wait_on_person(runtime: Runtime, trace: Trace, waiting: dict[str, Any]) -> Trace:
    """`waiting` on a person (`ask_human`): no runner, a `{human, waiting}` collaborator.

    The question goes into the trace's metadata first, then into the entry and its event,
    so whoever sees the event can reply at once.
    """
    metadata = {**trace.metadata, PERSON_KEY: waiting}
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "human"})
    runtime.store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="waiting", metadata=metadata
    )
    waited = trace.model_copy(update={"status": "waiting", "metadata": metadata})
    put_person(runtime, waited, str(waiting["tool_call_id"]), "waiting", str(waiting["question"]))
    return waited


def person_answered(
    runtime: Runtime, trace: Trace, status: CollaboratorStatus, summary: str
) -> Trace:
    """The wait ended with a tool result (a reply, a timeout): `queued` for any worker."""
    waiting = trace.metadata.get(PERSON_KEY) or {}
    runtime.store.forget_human_wait(trace.trace_id)
    metadata = {k: v for k, v in trace.metadata.items() if k != PERSON_KEY}
    put_person(runtime, trace, str(waiting.get("tool_call_id")), status, summary)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "human"})
    runtime.store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="queued", metadata=metadata
    )
    return trace.model_copy(update={"status": "queued", "metadata": metadata})


def human_id(tool_call_id: str) -> str:
    """The collaborator key of the person asked by one `ask_human` call."""
    return f"human:{tool_call_id}"


def put_person(
    runtime: Runtime, trace: Trace, tool_call_id: str, status: CollaboratorStatus, summary: str
) -> None:
    """The asked person's entry (`{type: approval}` for an approval) with its event."""
    waiting = trace.metadata.get(PERSON_KEY) or {}
    kind: CollaboratorType = "approval" if waiting.get("kind") == "approval" else "human"
    entry = Collaborator(
        name=kind,
        type=kind,
        trace_id=human_id(tool_call_id),
        status=status,
        summary=summary[:PERSON_SUMMARY_CHARS],
        mode=trace.mode,
        tool_call_id=tool_call_id,
    )
    extra: dict[str, Any] = {"type": kind}
    if status == "waiting":  # what a person needs to answer it from the event alone
        extra |= {k: waiting[k] for k in ("tool", "arguments", "tool_call_id") if k in waiting}
        extra["question"] = summary
    put_collaborator(runtime.store, trace.trace_id, trace, entry, status, extra=extra)


PERSON_SUMMARY_CHARS = 4000


def stop_person(runtime: Runtime, trace: Trace) -> None:
    """A stopped trace no longer waits on a person: the entry says so, the deadline goes."""
    waiting = trace.metadata.get(PERSON_KEY)
    if trace.status != "waiting" or not isinstance(waiting, dict):
        return
    runtime.store.forget_human_wait(trace.trace_id)
    put_person(runtime, trace, str(waiting["tool_call_id"]), "stopped", "stop requested")
