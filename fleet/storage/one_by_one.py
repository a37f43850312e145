"""A write applied op by op through a store's single-purpose methods: the memory store's apply.

`MemoryStore.apply` holds its lock around `apply_one_by_one`, which makes it one atomic step;
the Redis store runs the same ops in one script instead (`redis_scripts.APPLY`).
"""

from __future__ import annotations

from fleet.errors import StopLanded
from fleet.models import Event, Message
from fleet.storage.store import TraceRecords, TraceStore
from fleet.storage.writes import (
    AddStats,
    Append,
    Emit,
    PutCollaborator,
    ReleaseLease,
    SetFields,
    SetRun,
    TraceWrite,
    WriteExtension,
    WriteOp,
    WriteResult,
)


def apply_one_by_one(store: TraceStore, write: TraceWrite) -> WriteResult:
    """Apply a write through the store's single-purpose methods, in order.

    `MemoryStore.apply` holds its lock around this, which makes it one atomic step; the
    Redis store runs the same ops in one script instead.
    """
    if any(isinstance(op, WriteExtension) for op in write.ops):  # a Redis host's Lua
        raise TypeError(
            "a write extension needs a Redis store (fleet.storage.backends.redis.store)"
        )
    if write.unless_stopped and store.stop_requested(write.trace_id):
        raise StopLanded(f"a stop was requested for {write.trace_id!r}: nothing was written")
    stored = [m for op in write.ops if (m := _apply_op(store, write, op)) is not None]
    return WriteResult(stored, store.stop_requested(write.trace_id))


def _apply_op(store: TraceStore, write: TraceWrite, op: WriteOp) -> Message | None:
    root = write.root_trace_id
    match op:
        case Append(message=message, event=None):
            return store.append_message(message)
        case Append(message=message, event=Event() as event, iteration=iteration):
            return store.record_turn(root, message, event, iteration=iteration)
        case SetFields() | SetRun():
            _set_fields(store, write, op)
        case AddStats(deltas=deltas):
            store.add_stats(write.trace_id, **deltas)
        case PutCollaborator(parent_trace_id=parent, collaborator=entry, event=None):
            store.put_collaborator(parent, entry)
        case PutCollaborator(parent_trace_id=parent, collaborator=entry, event=Event() as event):
            store.put_collaborator_and_emit(parent, root, entry, event)
        case Emit(event=event):
            store.emit(root, event)
        case ReleaseLease(owner=owner):
            store.release_lease(write.trace_id, owner)
    return None


def _set_fields(store: TraceRecords, write: TraceWrite, op: SetFields | SetRun) -> None:
    match op:
        case SetFields(fields=fields, event=None):
            store.update_trace(write.trace_id, **fields)
        case SetFields(fields=fields, event=Event() as event):
            store.update_trace_and_emit(write.trace_id, write.root_trace_id, event, **fields)
        case SetRun(fields=run_fields):
            store.update_run(write.trace_id, **run_fields)
