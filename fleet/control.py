"""Fleet-wide queries that need no task queue: a subtree, the runs whose runner died."""

from __future__ import annotations

from fleet.models import now_ms
from fleet.storage.store import TraceRecords, TraceStore


def subtree(store: TraceRecords, trace_id: str) -> list[str]:
    """The trace and all its descendants, parents first."""
    out, frontier = [], [trace_id]
    while frontier:
        current = frontier.pop(0)
        out.append(current)
        frontier.extend(store.children(current))
    return out


def claim_dead_runs(store: TraceStore, at_ms: int | None = None) -> list[str]:
    """Running traces whose lease expired, each claimed by exactly one caller to re-enqueue."""
    claimed = []
    for trace_id in store.expired_leases(now_ms() if at_ms is None else at_ms):
        if store.forget_running(trace_id):
            if not store.get_trace(trace_id).is_terminal:
                claimed.append(trace_id)
    return claimed
