"""Fleet-wide queries that need no task queue: a subtree, the runs whose runner died."""

from __future__ import annotations

from fleet.errors import TraceNotFound
from fleet.models import Trace, now_ms
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
    """Running traces whose lease expired, each claimed by exactly one caller to re-enqueue.

    A trace gone (its record lost with a killed Cluster master's last writes, its lease
    index entry kept on another node) is skipped: raising would drop the traces claimed
    before it, already out of the index (make chaos, seed 41: a Cluster master kill).
    """
    claimed = []
    for trace_id in store.expired_leases(now_ms() if at_ms is None else at_ms):
        if store.forget_running(trace_id):
            trace = _or_none(store, trace_id)
            if trace is not None and not trace.is_terminal:
                claimed.append(trace_id)
    return claimed


def existing(store: TraceRecords, trace_ids: list[str], chunk: int = 500) -> list[Trace]:
    """The traces of `trace_ids` still stored, in order (an index entry may outlive its trace)."""
    found: list[Trace] = []
    for start in range(0, len(trace_ids), chunk):
        ids = trace_ids[start : start + chunk]
        try:
            found += store.get_traces(ids)
        except TraceNotFound:  # one expired: read these one by one
            found += [t for t in (_or_none(store, i) for i in ids) if t is not None]
    return found


def _or_none(store: TraceRecords, trace_id: str) -> Trace | None:
    try:
        return store.get_trace(trace_id)
    except TraceNotFound:
        return None
