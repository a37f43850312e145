"""The one writer of a parent's collaborator entries: announce a child, mirror its end.

Settling a tool call from its children (`fleet.children.settling`) writes the entries
through `put_collaborator` here.
"""

from __future__ import annotations

from typing import Any

from fleet.models import (
    Collaborator,
    CollaboratorStatus,
    Event,
    Trace,
)
from fleet.runtime import Runtime
from fleet.storage.store import TraceContent
from fleet.storage.writes import TraceWrite


def announce(
    runtime: Runtime, parent: Trace, child: Trace, write: TraceWrite | None = None
) -> None:
    """A new (or reopened) child shows in its parent's collaborators as `running`.

    With `write` (the parent's), the entry joins that batch; the caller applies it.
    """
    entry = Collaborator(
        name=child.name,
        trace_id=child.trace_id,
        status="running",
        summary=child.task[:120],
        mode=child.mode,
        tool_call_id=child.parent_tool_call_id,
    )
    put_collaborator(runtime.store, parent.trace_id, child, entry, "queued", write)


def mirror(
    runtime: Runtime,
    parent_trace_id: str,
    child: Trace,
    write: TraceWrite | None = None,
    *,
    announce: bool = True,
) -> None:
    """The child's status and answer, copied into its parent's entry (idempotent).

    `announce=False`: no `collaborator` event (the child's `finish` event says it).
    """
    entry = mirrored(runtime, child)
    store = runtime.store
    put_collaborator(store, parent_trace_id, child, entry, entry.status, write, quiet=not announce)


def mirrored(runtime: Runtime, child: Trace) -> Collaborator:
    """The parent's entry for this child as it is now."""
    status: CollaboratorStatus = "running"
    if child.status in ("completed", "failed", "stopped"):
        status = child.status
    summary = child.answer if child.status == "completed" else (child.error or child.status)
    if child.status == "stopped" and child.answer:  # cut short, with a partial answer
        summary = f"{summary}: {child.answer}"
    return Collaborator(
        name=child.name or child.mode,
        trace_id=child.trace_id,
        status=status,
        summary=(summary or "")[: runtime.settings.summary_chars],
        mode=child.mode,
        tool_call_id=child.parent_tool_call_id,
        stats=child.stats,
        output=child.output if child.status == "completed" else None,
        remote_id=remote_id_of(child),
    )


def remote_id_of(child: Trace) -> str | None:
    """A remote child's `agent://NAME/<task id>`, once its agent gave one."""
    call = child.run.remote_call if child.mode == "remote" else None
    return call.remote_id() if call is not None else None


def put_collaborator(
    store: TraceContent,
    parent_trace_id: str,
    child: Trace,
    entry: Collaborator,
    shown: str,
    write: TraceWrite | None = None,
    extra: dict[str, Any] | None = None,
    *,
    quiet: bool = False,
) -> None:
    """The one write of a collaborator entry, with its event, atomic per child.

    `quiet`: no event (a child's `finish` event stands for it), and none is built.
    """
    if quiet:
        if write is not None:
            write.put_collaborator(parent_trace_id, entry, None)
        else:
            store.put_collaborator(parent_trace_id, entry)
        return
    data = {"parent_trace_id": parent_trace_id, "name": entry.name, "mode": child.mode}
    event = Event(
        kind="collaborator", trace_id=child.trace_id, status=shown, data=data | (extra or {})
    )
    if write is not None:
        write.put_collaborator(parent_trace_id, entry, event)
    else:
        store.put_collaborator_and_emit(parent_trace_id, child.root_trace_id, entry, event)
