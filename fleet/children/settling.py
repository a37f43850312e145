"""Settling a tool call from its children: their entries and one tool result, once.

Settling returns a value, dispatched by the caller with `match` (like
`steps.decide_next`):

- `Settled`: this call wrote the children's result into the parent; `turn_complete` says
  whether that answered the parent's last open call, so the parent should resume.
- `Waiting`: some child has not ended; nothing was written.
- `AlreadyCollected`: another collector wrote the result first (or there is no call to
  settle); nothing was written.

The entries go through `fleet.lifecycle.put_collaborator`, their one writer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleet import lifecycle
from fleet.children.cache import remember
from fleet.children.collect import result_message
from fleet.errors import TraceNotFound
from fleet.history import main_path, open_turn
from fleet.models import Collaborator, Event, Trace, text_of
from fleet.runtime import Runtime
from fleet.storage.gone import present, stand_in
from fleet.storage.store import TraceRecords, TraceStore
from fleet.storage.writes import TraceWrite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """The call was settled here: collaborator entries and the tool result are written."""

    parent_trace_id: str
    tool_call_id: str
    turn_complete: bool
    """True when no call of the parent's last assistant turn is left open: resume it."""
    kind: Literal["settled"] = "settled"


@dataclass(frozen=True)
class Waiting:
    """Some children have not ended yet; nothing was written."""

    pending: tuple[str, ...]
    """The ids of the children still queued, running or waiting."""
    kind: Literal["waiting"] = "waiting"


@dataclass(frozen=True)
class AlreadyCollected:
    """Nothing to write: another collector settled the call first, or there is no call."""

    kind: Literal["already_collected"] = "already_collected"


Settlement = Settled | Waiting | AlreadyCollected


def settle(
    runtime: Runtime, parent_trace_id: str, tool_call_id: str, child_ids: Sequence[str]
) -> Settlement:
    """Write ended children into the parent: their entries and one tool result, once.

    The entries are idempotent; the tool message is written at most once per call
    (atomically with its mark), so duplicate or concurrent collectors are harmless. The
    children are read in one step and their entries written in one step. A child with no
    record (a failover lost it) counts as `failed`, saying it is gone, while its parent's
    call is still open (`fleet.storage.gone`).
    """
    children, gone = present(runtime.store, child_ids)
    if gone and children and all(c.is_terminal for c in children):
        if not _open(runtime.store, parent_trace_id, tool_call_id):
            return AlreadyCollected()  # the parent lost the call too: the owner check heals it
        log.warning(
            "%r's call %r settled with %s gone (no record)", parent_trace_id, tool_call_id, gone
        )
        by_id = {c.trace_id: c for c in children}
        children = [by_id.get(i) or stand_in(i, children[0]) for i in child_ids]
    return _settle(runtime, parent_trace_id, tool_call_id, children)


def _open(store: TraceRecords, parent_trace_id: str, tool_call_id: str) -> bool:
    """True when the parent (still there) waits on this call's result."""
    try:
        snapshot = store.snapshot(parent_trace_id)
    except TraceNotFound:
        return False
    turn = open_turn(main_path(snapshot.messages, snapshot.trace.head_sequence))
    return turn is not None and any(c.get("id") == tool_call_id for c in turn.missing)


def _settle(
    runtime: Runtime, parent_trace_id: str, tool_call_id: str, children: list[Trace]
) -> Settlement:
    """`settle`, on the children as read in one step."""
    store = runtime.store
    pending = tuple(c.trace_id for c in children if not c.is_terminal)
    if pending or not children:  # none: the store lost them (a failover); the call stays owed
        return Waiting(pending)
    # Each child's finish wrote its entry; what a lost finish or a later change left
    # behind is written again here (with its event), the rest is left as it is.
    written = {c.trace_id: _same(c) for c in store.collaborators(parent_trace_id)}
    entries = TraceWrite(parent_trace_id, children[0].root_trace_id)
    for child in children:
        entry = lifecycle.mirrored(runtime, child)
        if written.get(child.trace_id) != _same(entry):
            lifecycle.put_collaborator(store, parent_trace_id, child, entry, entry.status, entries)
    if entries.ops:
        store.apply(entries)
    message = result_message(parent_trace_id, tool_call_id, children)
    if len(children) == 1:
        remember(store, children[0], text_of(message.content))
    if store.append_collected(message) is None:
        return AlreadyCollected()
    for child in children:  # once: only the collector whose result landed gets here
        runtime.hooks.child_settled(parent_trace_id, child)
    # A child shares its parent's tree, so the parent's events go to the child's root.
    store.emit(
        children[0].root_trace_id,
        Event(kind="message", trace_id=parent_trace_id, data={"role": "tool"}),
    )
    return Settled(parent_trace_id, tool_call_id, turn_complete(store, parent_trace_id))


_COMPARED = set(Collaborator.model_fields) - {"updated_at_ms"}
"""What this release writes of an entry (the fields of a newer one are kept, not compared)."""


def _same(entry: Collaborator) -> dict[str, Any]:
    """What makes two entries of a child the same (not when they were written).

    The cost is compared to the nano-dollar: the runner sums it in Python, Redis stores
    the sum with 14 significant digits.
    """
    same = entry.model_dump(include=_COMPARED)
    same["stats"]["cost_usd"] = round(entry.stats.cost_usd, 9)
    return same


def settle_from_child(runtime: Runtime, child_id: str) -> Settlement:
    """Settle the call that spawned this child, once it and every sibling of that call ended.

    For a recovered child: the chord of a lost worker never runs its body, and the sibling
    that ends last may be one whose chord header succeeded, so the caller asks again while
    this returns `Waiting`. A trace that is nobody's child has nothing to settle.
    """
    return settle_siblings(runtime, runtime.store.get_trace(child_id))


def settle_siblings(runtime: Runtime, child: Trace) -> Settlement:
    """`settle_from_child` on the child as already read."""
    if child.parent_trace_id is None or child.parent_tool_call_id is None:
        return AlreadyCollected()
    parent_id, call_id = child.parent_trace_id, child.parent_tool_call_id
    return _settle(runtime, parent_id, call_id, _call_traces(runtime.store, parent_id, call_id))


def call_children(store: TraceStore, parent_trace_id: str, tool_call_id: str) -> list[str]:
    """The children one tool call of the parent spawned, in creation order."""
    return [k.trace_id for k in _call_traces(store, parent_trace_id, tool_call_id)]


def _call_traces(store: TraceRecords, parent_trace_id: str, tool_call_id: str) -> list[Trace]:
    """Those children as read in one step (a child's end settles on them: no second read).

    A child with no record (a failover lost it) is left out: nothing says which call it was.
    """
    kids, _ = present(store, store.children(parent_trace_id))
    return [k for k in kids if k.parent_tool_call_id == tool_call_id]


def turn_complete(store: TraceRecords, trace_id: str) -> bool:
    """True when every tool call of the trace's last assistant turn has a result."""
    snapshot = store.snapshot(trace_id)  # the trace and its messages from one instant
    return open_turn(main_path(snapshot.messages, snapshot.trace.head_sequence)) is None
