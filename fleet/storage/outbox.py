"""Work that must reach the task queue even if the process that owed it dies first.

A spawn records `spawn {parent} {tool_call_id}` before it creates the children and clears
it once the dispatcher has handed them to the queue; a recovered run whose re-send failed
(broker away) records `run {trace_id}`. Every worker's sweeper claims due entries
(`TraceStore.outbox_claim`: each to one sweeper, back again later if that one dies too) and
asks `runs_for` what to send. So children created by a runner that died before its chord
went out, or whose chord the broker refused, still run, and their parent still resumes.
"""

from __future__ import annotations

from fleet.storage.gone import present
from fleet.storage.store import TraceStore

SPAWN = "spawn"
RUN = "run"
SETTLE = "settle"


def spawn_entry(parent_trace_id: str, tool_call_id: str) -> str:
    """The outbox entry of one sub-agent call's children."""
    return f"{SPAWN} {parent_trace_id} {tool_call_id}"


def run_entry(trace_id: str) -> str:
    """The outbox entry of one recovered run to re-send."""
    return f"{RUN} {trace_id}"


def settle_entry(parent_trace_id: str, tool_call_id: str) -> str:
    """The outbox entry of a tool call to settle once all its children ended.

    Kept in Redis rather than as a countdown task: a worker holding a countdown in memory
    may die or lose its broker connection, and then the countdown is gone.
    """
    return f"{SETTLE} {parent_trace_id} {tool_call_id}"


def parse(entry: str) -> tuple[str, str, str]:
    """(kind, trace id, tool call id or '')."""
    kind, _, rest = entry.partition(" ")
    trace_id, _, call_id = rest.partition(" ")
    return kind, trace_id, call_id


def runs_for(store: TraceStore, entry: str) -> list[str] | None:
    """The traces to send a recovered run for; None while the entry is not ripe yet.

    None too for a kind a newer release added: a worker of that release takes it.

    A spawn is ripe once its parent's runner let go of the lease (it died, or it went on
    waiting after the broker refused the chord). A recovered run of a child collects its
    tool call once every sibling has ended, so when all children ended already one run of
    any of them completes the parent's turn. A trace with no record (a failover lost it)
    is not sent: an entry that named one came back every sweep, each time a traceback.
    """
    kind, trace_id, call_id = parse(entry)
    if kind == RUN:  # unless it ended, or a live runner has it (its countdown came through)
        found, _ = present(store, [trace_id])  # gone (a failover lost it): nothing to run
        if not found or found[0].is_terminal or store.lease_holder(trace_id):
            return []
        return [trace_id]
    parent_id = trace_id
    if kind != SPAWN:  # a kind a newer release added: left for a worker that knows it
        return None
    if not call_id:
        return []  # an older format: drop it
    if store.lease_holder(parent_id) is not None:
        return None
    kids, _ = present(store, store.children(parent_id))  # a gone child: nothing to run
    kids = [k for k in kids if k.parent_tool_call_id == call_id]
    pending = [k.trace_id for k in kids if not k.is_terminal]
    return pending or [k.trace_id for k in kids[:1]]
