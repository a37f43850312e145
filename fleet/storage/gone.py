"""Traces a store may have lost: read those that are there, name those that are gone.

A Redis SIGKILL loses up to a second of writes, a promoted replica what it had not
received, and a Cluster master killed its slots' last writes (a whole tree's: a tree's
keys share its root's slot). An id kept elsewhere (a chord's header results, a parent's
children) may then name a trace with no record. Whoever settles a call or walks a tree
reads through `present` rather than `TraceRecords.get_traces`, which raises
`TraceNotFound` at the first gone id: a settle that raised on a gone child did so again
at every retry (make chaos, seed 41 round 23).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.errors import TraceNotFound
from fleet.models import Trace
from fleet.storage.store import TraceRecords

GONE_ERROR = "gone: its record was lost with the store's last writes (a failover)"
"""What a gone child's entry and its parent's tool result say of it."""


def present(store: TraceRecords, trace_ids: Sequence[str]) -> tuple[list[Trace], list[str]]:
    """The traces of `trace_ids` that have a record, in order, and the ids of those gone.

    One read when none is gone (the usual case); else one read per id.
    """
    try:
        return store.get_traces(trace_ids), []
    except TraceNotFound:
        pass
    found: list[Trace] = []
    gone: list[str] = []
    for trace_id in trace_ids:
        try:
            found.append(store.get_trace(trace_id))
        except TraceNotFound:
            gone.append(trace_id)
    return found, gone


def stand_in(gone_id: str, sibling: Trace) -> Trace:
    """A gone child as its parent's call is settled with: `failed`, saying it is gone.

    Never written as a trace: only its entry and the tool result name it. `sibling` is an
    ended child of the same call (its mode, its root, its parent).
    """
    return Trace(
        trace_id=gone_id,
        root_trace_id=sibling.root_trace_id,
        parent_trace_id=sibling.parent_trace_id,
        parent_tool_call_id=sibling.parent_tool_call_id,
        mode=sibling.mode,
        status="failed",
        task="",
        error=GONE_ERROR,
    )
