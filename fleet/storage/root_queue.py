"""A new root's writes one by one: where `TraceStore.queue_root` cannot make them one step.

The in-memory store, a Redis Cluster (the serving check, the indexes and the tree are in
different slots) and a fenced view (each write checks the runner's lease) take this path.
The tree is tracked before the root exists, so a crash in between leaves an id the owner
check drops; the root is listed once stored (a crash before leaves it off the list only).
"""

from __future__ import annotations

from fleet.models import Event, Trace
from fleet.storage.root_index import ROOTS
from fleet.storage.store import Serving, TraceStore
from fleet.storage.watchdog import check_served


def queue_in_steps(
    store: TraceStore, trace: Trace, event: Event, serving: Serving | None, listed: bool
) -> None:
    """`queue_root`'s serving check and writes, each on its own."""
    if serving is not None:
        check_served(store, serving.queue, serving.workspace)
    store.track_tree(trace.root_trace_id)
    store.create_trace(trace)
    store.emit(trace.root_trace_id, event)
    if listed:
        store.capability(ROOTS).add(trace.trace_id, trace.created_at_ms)
