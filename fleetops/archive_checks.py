"""What `fleet archive --import` refuses: trees that would graft onto, or steer, the fleet's own.

An archive file is hostile input: anyone may have written it. The import writes its trees
into the fleet's Redis, where listings, `trace show`, compaction, the owner check and
`fleet run --continue` take them for the fleet's own. So a tree must stand alone and be over:

- every id starts with the root's (a child's is `ROOT@...`: its keys are its tree's, on a
  Redis Cluster in its root's slot);
- the root has no parent and every other trace's parent is a trace of the same tree, and
  every agent collaborator entry and every event names one (a parent elsewhere put the
  trace into another tree's listing and `trace show`);
- every trace ended (completed, failed, stopped): nothing runs or waits on an import;
- no field the fleet keeps for itself: in the trace hash only Trace fields, `stats`,
  messages and the run-state fields an ended trace is read with (`ARCHIVED_RUN_FIELDS`:
  its stop reason, turn, context note, model fallbacks); not `stop`, `uncounted`, a packed
  form, and no pending run state (an approved call would let a continued run skip its
  approval; a wait, a parked batch call or a fan-out plan would steer the fleet);
- no trace id or root Redis already holds a key of (a root equal to a live one ran
  compaction, TTL and event moves on the live tree), except the tree this same file began
  to import: its import mark (`keys.imported`) matches, so an import cut short runs again;
- no trace id twice in the file.

`refusal_of_record`, `refusal_of_tree`, `refusal_of_events` and `refusal_of_ids` are the
rules read from the file (one line each to extend); `refusal_of_live` needs the store.
Export keeps only those fields (`strip_reserved`), so the fleet's own archives import.
`metadata` is the caller's alone (`fleet.runstate`): the fleet reads nothing from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from fleet.ids import root_of
from fleet.models import TERMINAL, Collaborator, Event, Trace
from fleet.storage.backends.redis.archive import TraceRecord, TreeArchive, TreeRecord
from fleet.storage.backends.redis.writes import MESSAGE_FIELD, RUN_FIELD, TRACE_FIELDS

ARCHIVED_RUN_FIELDS = frozenset(
    RUN_FIELD + name
    for name in (
        "schema_version",
        "stop_reason",
        "turn",
        "context",
        "model_fallbacks",
        "budgeted",
        "scheduled",
    )
)
"""The run-state fields (`r:{name}`) of an ended trace an archive carries: what `trace show`
prints and what a continued import reads (`turn` tells its new run's events from the
archived ones; `budgeted` and `scheduled`, a root's, how it was created: a budget or a
schedule gone since reads as none).
Every other one is pending state the fleet acts on, never archived."""
HASH_FIELDS = frozenset(TRACE_FIELDS) | ARCHIVED_RUN_FIELDS
"""The trace hash's fields an archive may carry, besides its messages (`m:N`)."""


def refusal_of_record(record: TraceRecord, trace: Trace) -> str | None:
    """Why one trace line may not be imported, or None."""
    extra = [f for f in record.fields if f not in HASH_FIELDS and not f.startswith(MESSAGE_FIELD)]
    if extra:
        return f"field {extra[0][:40]!r} is the fleet's own, not an archived trace's"
    if trace.status not in TERMINAL:
        return f"trace {trace.trace_id!r} is {trace.status}: only ended trees are imported"
    return None


def refusal_of_tree(tree: TreeRecord) -> tuple[TraceRecord, str] | None:
    """The first trace of `tree` that would graft it onto another tree, and why; or None."""
    ids = {record.trace_id for record in tree.traces}
    for record in tree.traces:
        if root_of(record.trace_id) != tree.root_trace_id:  # its keys: another tree's
            return record, f"id {record.trace_id!r} is not of tree {tree.root_trace_id!r}"
        parent = json.loads(record.fields.get("parent_trace_id", "null"))
        if record.trace_id == tree.root_trace_id and parent is not None:
            return record, f"root {record.trace_id!r} has a parent ({str(parent)[:80]!r})"
        if record.trace_id != tree.root_trace_id and parent not in ids:
            return record, f"parent {str(parent)[:80]!r} of {record.trace_id!r} is not in its tree"
        for _, entry in record.collaborators:
            child = Collaborator.model_validate_json(entry)
            if child.type == "agent" and child.trace_id not in ids:
                return record, f"collaborator {child.trace_id[:80]!r} is not in its tree"
    return None


def refusal_of_events(tree: TreeRecord) -> str | None:
    """Why the tree's events line may not be imported (an event of another tree), or None."""
    ids = {record.trace_id for record in tree.traces}
    for _, text in tree.events:
        event = Event.model_validate_json(text)
        if event.trace_id not in ids:
            return f"an event of trace {event.trace_id[:80]!r}, which is not in tree"
    return None


def refusal_of_ids(trees: Iterable[TreeRecord]) -> tuple[TraceRecord, str] | None:
    """A trace id the file holds twice, or None."""
    seen: set[str] = set()
    for tree in trees:
        for record in tree.traces:
            if record.trace_id in seen:
                return record, f"trace {record.trace_id!r} appears twice"
            seen.add(record.trace_id)
    return None


def refusal_of_live(archive: TreeArchive, tree: TreeRecord) -> tuple[TraceRecord, str] | None:
    """The first trace of `tree` whose id Redis holds already, unless this tree began there."""
    if archive.import_mark(tree.root_trace_id) == tree.digest():
        return None  # this same tree, written in part by an import cut short
    held = archive.held(tree)
    for record in tree.traces:
        if held[record.trace_id]:
            return record, f"trace {record.trace_id!r} exists in this fleet's Redis"
    return None


def strip_reserved(record: TraceRecord) -> TraceRecord:
    """The record without the fleet's run state: what an export writes."""
    fields = {
        name: value
        for name, value in record.fields.items()
        if name in HASH_FIELDS or name.startswith(MESSAGE_FIELD)
    }
    return TraceRecord(fields, record.collaborators)
