"""Fleet-wide control that needs no task queue: stop a subtree, find dead runners, collect."""

from __future__ import annotations

from typing import Literal

from fleet.collect import collect, update_collaborator
from fleet.human import on_stop, waiting_on
from fleet.models import Event, Trace, now_ms
from fleet.settings import Settings
from fleet.store import TraceStore

SUMMARY_CHARS = Settings.summary_chars


def subtree(store: TraceStore, trace_id: str) -> list[str]:
    """The trace and all its descendants, parents first."""
    out, frontier = [], [trace_id]
    while frontier:
        current = frontier.pop(0)
        out.append(current)
        frontier.extend(store.children(current))
    return out


def stop_tree(store: TraceStore, trace_id: str) -> list[str]:
    """Raise the stop flag on a trace and every descendant.

    Traces that no runner holds (queued, waiting) are finalised here, because a revoked chord
    never runs its body; running ones stop themselves between turns.

    Returns:
        Every trace id in the subtree.
    """
    ids = subtree(store, trace_id)
    for tid in ids:
        store.request_stop(tid)
    for tid in ids:
        trace = store.get_trace(tid)
        if trace.status in ("queued", "waiting"):
            fields = {"status": "stopped", "error": "stop requested", "finished_at_ms": now_ms()}
            store.update_trace(tid, **fields)
            data = {"reason": "stop", "name": trace.name or trace.mode}
            store.emit(
                trace.root_trace_id,
                Event(kind="finish", trace_id=tid, status="stopped", data=data),
            )
            on_stop(store, trace)
            if trace.parent_trace_id:
                stopped = trace.model_copy(update=fields)
                update_collaborator(store, trace.parent_trace_id, stopped, SUMMARY_CHARS)
    return ids


def waiting_traces(store: TraceStore, limit: int = 50, scan: int = 1000) -> list[Trace]:
    """Traces waiting on a person (`ask_human`), newest first, among the last `scan`."""
    found = [t for t in store.list_traces(scan) if waiting_on(t) is not None]
    return found[:limit]


def claim_dead_runs(store: TraceStore, at_ms: int | None = None) -> list[str]:
    """Running traces whose lease expired, each claimed by exactly one caller to re-enqueue."""
    claimed = []
    for trace_id in store.expired_leases(now_ms() if at_ms is None else at_ms):
        if store.forget_running(trace_id):
            if not store.get_trace(trace_id).is_terminal:
                claimed.append(trace_id)
    return claimed


Collection = Literal["waiting", "resume", "done"]


def collect_if_done(store: TraceStore, child_id: str, summary_chars: int) -> Collection:
    """For a recovered child: collect its tool call once the child and every sibling ended.

    The chord of a lost worker never runs its body, and the sibling that ends last may be one
    whose chord header succeeded, so the caller must ask again while this says `waiting`.

    Returns:
        `waiting` while the child or a sibling still runs; `resume` when this call completed
        the parent's turn, so the parent should now be resumed; `done` when nothing is left
        to do (no parent, or the tool call was collected already).
    """
    child = store.get_trace(child_id)
    if child.parent_trace_id is None or child.parent_tool_call_id is None:
        return "done"
    siblings = [store.get_trace(c) for c in store.children(child.parent_trace_id)]
    group = [s for s in siblings if s.parent_tool_call_id == child.parent_tool_call_id]
    if not all(s.is_terminal for s in group):
        return "waiting"
    ids = [s.trace_id for s in group]
    parent, call_id = child.parent_trace_id, child.parent_tool_call_id
    return "resume" if collect(store, parent, call_id, ids, summary_chars) else "done"
