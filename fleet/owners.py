"""Every non-terminal trace has an owner; the check that finds one without and says what heals it.

What moves a trace that has not ended (its *owner*):

- `running`: its runner's lease; once the lease lapses, the lease index the sweeper claims
  from (`TraceStore.expired_leases`).
- `queued`: a message on its queue or a worker's countdown (a throttled run also has an
  outbox `run` entry), or a pending outbox entry of its spawn.
- `waiting` on a person: the person, and the wait's deadline in the index of waits (an
  entry a failover lost, the index living apart from the trace on a Cluster, is written
  again: `Rearm`).
- `waiting` on a provider batch: its call's entry in the batch queue (`fleet.batchapi`);
  a trace parked on a call the queue does not know is sent again (its run queues it).
- `waiting` on a remote agent's A2A task: its entry in the pollers' watch list
  (`fleet.remote`); one without is sent again (its run parks it again).
- `waiting` on children: a child that has not ended, or the outbox entry that settles them.
- any trace told to stop: its runner, if one holds the lease; else nothing, so the stop
  itself is finished here.

`unowned` reads one tree that has been quiet (no event) for `quiet_ms` and returns a
`Remedy` for each trace none of these moves. The host applies it (`workers.sweeper`): a
message can only be known to be absent by the broker, so `Resend` asks the host to send the
run again only if the trace's queue holds nothing; a duplicate run is harmless (the lease
and the status decide who runs). After `MAX_HEALS` remedies a trace that is still unowned
fails, with an error saying what it lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal, Protocol

from fleet.history import main_path, open_turn
from fleet.models import Trace
from fleet.storage import outbox
from fleet.storage.batch_calls import CallStates, batch_calls
from fleet.storage.gone import present
from fleet.storage.remote_watch import REMOTE_WATCH
from fleet.storage.store import StopsAndWaits, TraceRecords, TraceStore

MAX_HEALS = 3
"""Remedies per trace before it fails as lost."""


class OwnerIndex(Protocol):
    """What the check reads beyond the trace store (`fleet.storage.owner_index`)."""

    def open_trees(self, limit: int) -> list[str]: ...  # noqa: D102
    def open_tree_pages(self, page_size: int) -> Iterator[list[str]]: ...  # noqa: D102
    def untrack_tree(self, root_trace_id: str) -> None: ...  # noqa: D102
    def outbox_has(self, entries: Sequence[str]) -> list[bool]: ...  # noqa: D102
    def last_event_ms(self, root_trace_id: str) -> int | None: ...  # noqa: D102
    def claim_check(self, owner: str, ttl_ms: int) -> bool: ...  # noqa: D102


@dataclass(frozen=True)
class Resend:
    """Send the trace's run again (recovered) if its queue holds no message."""

    trace: Trace
    why: str
    kind: Literal["resend"] = "resend"


@dataclass(frozen=True)
class Settle:
    """Every child of the parent's open call ended: settle the call and resume the parent."""

    trace: Trace
    tool_call_id: str
    why: str
    kind: Literal["settle"] = "settle"


@dataclass(frozen=True)
class Rearm:
    """Waiting on a person, its deadline missing from the index: index it again."""

    trace: Trace
    deadline_ms: int
    why: str
    kind: Literal["rearm"] = "rearm"


@dataclass(frozen=True)
class Stop:
    """Told to stop, and no runner holds it: finish the stop (`lifecycle.end_stopped`)."""

    trace: Trace
    why: str
    kind: Literal["stop"] = "stop"


@dataclass(frozen=True)
class Fail:
    """Healed `MAX_HEALS` times and still unowned: fail it, saying what was lost."""

    trace: Trace
    why: str
    kind: Literal["fail"] = "fail"


Remedy = Resend | Settle | Stop | Rearm | Fail


@dataclass(frozen=True)
class TreeState:
    """One read of a tree: its traces, which are leased, and the outbox entries pending."""

    traces: dict[str, Trace]
    children: dict[str, list[str]]
    leased: frozenset[str]
    lapsed: frozenset[str]
    """Running traces whose lease expired: the sweeper re-enqueues them."""
    stops: frozenset[str]
    pending: frozenset[str]
    """Outbox entries (`fleet.storage.outbox`) of this tree that are pending."""
    quiet_before_ms: int
    """A trace changed at or after this instant is left alone: something may be moving it."""


def check(
    store: TraceStore,
    index: OwnerIndex,
    at_ms: int,
    quiet_ms: int,
    page_size: int = 1_000,
    *,
    forget: bool = True,
) -> list[Remedy]:
    """The remedies of every open tree quiet for `quiet_ms`.

    Every tree of the open-trees index is visited, a page of `page_size` at a time (a
    cursor over the index: a check used to read only the `page_size` oldest, so past that
    many open trees a newer one was never checked). With `forget` (the workers' check),
    trees that ended leave the index; `fleet doctor` only reads.
    """
    remedies: list[Remedy] = []
    lapsed: list[frozenset[str]] = []  # read once per check, not once per tree
    for page in index.open_tree_pages(page_size):
        for root in page:
            last_ms = index.last_event_ms(root)
            if last_ms is not None and at_ms - last_ms < quiet_ms:
                continue  # it is moving
            if tree_ended(store, root):
                if forget:
                    index.untrack_tree(root)
                continue
            lapsed = lapsed or [frozenset(store.expired_leases(at_ms))]
            remedies += _remedies(store, read_tree(store, index, root, at_ms, quiet_ms, lapsed[0]))
    return remedies


def unowned(
    store: TraceStore, index: OwnerIndex, root_trace_id: str, at_ms: int, quiet_ms: int
) -> list[Remedy]:
    """A remedy for each non-terminal trace of the tree that nothing moves, children first.

    Children first: a root's remedy may end it, and its finish event, which ends a client's
    wait, then comes after its children's.
    """
    return _remedies(store, read_tree(store, index, root_trace_id, at_ms, quiet_ms))


def _remedies(store: TraceStore, state: TreeState) -> list[Remedy]:
    remedies: list[Remedy] = []
    stopping: set[str] = set()  # stopped by this check, deepest first
    for trace in reversed(state.traces.values()):
        if trace.is_terminal or (found := _remedy(store, state, trace)) is None:
            continue
        if isinstance(found, Stop):
            if not _children_end_first(state, trace, stopping):
                continue  # a child still moves: the stop ends it first, this trace next time
            stopping.add(trace.trace_id)
        remedies.append(_or_fail(found))
    return remedies


def _children_end_first(state: TreeState, trace: Trace, stopping: AbstractSet[str]) -> bool:
    """A stopped trace ends after its children: each has ended, or this check stops it too."""
    kids = (state.traces[k] for k in state.children.get(trace.trace_id, []) if k in state.traces)
    return all(kid.is_terminal or kid.trace_id in stopping for kid in kids)


def read_tree(
    store: TraceStore,
    index: OwnerIndex,
    root_trace_id: str,
    at_ms: int,
    quiet_ms: int,
    lapsed_leases: AbstractSet[str] | None = None,
) -> TreeState:
    """The tree as the check sees it (a walk from the root, then one read per concern).

    `lapsed_leases`: `TraceStore.expired_leases(at_ms)`, when the caller read it already.
    """
    traces: dict[str, Trace] = {}
    children: dict[str, list[str]] = {}
    frontier = [root_trace_id]
    while frontier:
        found, _ = present(store, frontier)  # a gone child (a failover lost it) is left out
        traces.update((t.trace_id, t) for t in found)
        frontier = []
        for trace in found:
            children[trace.trace_id] = store.children(trace.trace_id)
            frontier += children[trace.trace_id]
    open_ids = [t for t, trace in traces.items() if not trace.is_terminal]
    entries = [e for t in open_ids for e in _entries(traces[t], traces, children)]
    pending = {e for e, has in zip(entries, index.outbox_has(entries), strict=True) if has}
    if lapsed_leases is None:
        lapsed_leases = frozenset(store.expired_leases(at_ms))
    lapsed = lapsed_leases & set(open_ids)
    return TreeState(
        traces=traces,
        children=children,
        leased=frozenset(t for t in open_ids if store.lease_holder(t) is not None),
        lapsed=frozenset(lapsed),
        stops=frozenset(t for t in open_ids if store.stop_requested(t)),
        pending=frozenset(pending),
        quiet_before_ms=at_ms - quiet_ms,
    )


def _entries(trace: Trace, traces: dict[str, Trace], children: dict[str, list[str]]) -> list[str]:
    """The outbox entries that would move this trace: its run, its spawn, its calls' settling.

    Not its parent's settle entry: that one waits for this trace to end, it does not run it
    (a sweeper re-sends only `queued` siblings, so a `running` one nobody holds stays so).
    """
    found = [outbox.run_entry(trace.trace_id)]
    if trace.parent_trace_id and trace.parent_tool_call_id:
        found.append(outbox.spawn_entry(trace.parent_trace_id, trace.parent_tool_call_id))
    kids = [traces[c] for c in children.get(trace.trace_id, []) if c in traces]
    for call in sorted({k.parent_tool_call_id for k in kids if k.parent_tool_call_id}):
        found.append(outbox.spawn_entry(trace.trace_id, call))
        found.append(outbox.settle_entry(trace.trace_id, call))
    return found


def _remedy(store: TraceStore, state: TreeState, trace: Trace) -> Remedy | None:
    tid = trace.trace_id
    if trace.updated_at_ms >= state.quiet_before_ms:
        return None  # changed lately (or a remedy was just applied): give it time
    if tid in state.leased or tid in state.lapsed or _owned_by_outbox(state, trace):
        return None
    if tid in state.stops:
        return Stop(trace, "told to stop, and no runner holds it")
    if trace.status == "running":
        return Resend(trace, "running, but no runner holds its lease")
    if trace.status == "queued":
        return Resend(trace, "queued, with nothing in the outbox for it")
    return _waiting(store, state, trace)


def _waiting(store: TraceStore, state: TreeState, trace: Trace) -> Remedy | None:
    if trace.run.waiting_on is not None:  # a question or an approval
        return _person(store, trace, trace.run.waiting_on)
    parked = trace.run.waiting_on_batch
    if parked is not None and parked.state == "parked":
        calls: CallStates = batch_calls(store)
        custom_id = str(parked.custom_id)
        (status,) = calls.statuses([custom_id])
        if status is not None or calls.answer_of(custom_id) is not None:
            return None  # its call (queued, in a batch, or answered and being resumed) owns it
        return Resend(trace, "waiting on a provider batch that holds no call of it")
    remote = trace.run.remote_call
    if remote is not None and remote.state == "sent":
        if store.capability(REMOTE_WATCH).watched(trace.trace_id):
            return None  # the pollers' watch list owns it (`fleet.remote.poll`)
        return Resend(trace, "waiting on a remote task that no poller watches")
    kids = [state.traces[c] for c in state.children.get(trace.trace_id, []) if c in state.traces]
    if any(not k.is_terminal for k in kids):
        return None  # live children own it
    snapshot = store.snapshot(trace.trace_id)
    turn = open_turn(main_path(snapshot.messages, snapshot.trace.head_sequence))
    if turn is None:
        return Resend(trace, "waiting, with every tool call answered")
    spawned = {k.parent_tool_call_id for k in kids}
    for call in turn.missing:
        if call["id"] in spawned:
            return Settle(trace, str(call["id"]), "waiting on children that all ended")
    return Resend(trace, "waiting on a tool call that has no children (lost before the spawn)")


def _person(store: StopsAndWaits, trace: Trace, waiting: dict[str, object]) -> Remedy | None:
    """The person and the wait's deadline own it, once the deadline is in the index."""
    deadline = waiting.get("deadline_ms")
    if isinstance(deadline, int) and not store.human_wait_indexed(trace.trace_id):
        return Rearm(trace, deadline, "waiting on a person, its deadline not indexed")
    return None


def _owned_by_outbox(state: TreeState, trace: Trace) -> bool:
    return any(e in state.pending for e in _entries(trace, state.traces, state.children))


def _or_fail(remedy: Remedy) -> Remedy:
    heals = remedy.trace.run.owner_heals  # written by each remedy (`run.owner_heals`)
    if heals < MAX_HEALS or isinstance(remedy, Stop | Rearm):
        return remedy
    return Fail(remedy.trace, f"lost: {remedy.why}; still so after {heals} attempts to heal it")


def tree_ended(store: TraceRecords, root_trace_id: str) -> bool:
    """True when the root and every descendant ended (or the root is gone).

    A descendant with no record (a failover lost it) is not waited for: it never ends.
    """
    frontier = [root_trace_id]
    while frontier:
        found, gone = present(store, frontier)
        if root_trace_id in gone:  # expired, or its id was indexed just before a crash
            return True
        if any(not t.is_terminal for t in found):
            return False
        frontier = [c for t in found for c in store.children(t.trace_id)]
    return True
