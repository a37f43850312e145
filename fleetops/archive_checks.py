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
- no field the fleet keeps for itself: in the trace hash only Trace fields, `stats` and
  messages (not `stop`, `uncounted`, a packed form or anything else); in `metadata` none of
  `RESERVED_METADATA` (an approved call would let a continued run skip its approval);
- no trace id or root Redis already holds a key of (a root equal to a live one ran
  compaction, TTL and event moves on the live tree), except the tree this same file began
  to import: its import mark (`keys.imported`) matches, so an import cut short runs again;
- no trace id twice in the file.

`refusal_of_record`, `refusal_of_tree`, `refusal_of_events` and `refusal_of_ids` are the
rules read from the file (one line each to extend); `refusal_of_live` needs the store.
Export strips the reserved keys (`strip_reserved`), so the fleet's own archives import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from fleet.ids import root_of
from fleet.models import TERMINAL, Collaborator, Event, Trace
from fleet.storage.backends.redis.archive import TraceRecord, TreeArchive, TreeRecord
from fleet.storage.backends.redis.writes import MESSAGE_FIELD, TRACE_FIELDS

RESERVED_METADATA = frozenset(
    {
        "approved_call",  # fleet.conversation.approval: the call `fleet approve` approved
        "waiting_on",  # fleet.lifecycle.status: the person (or approval) waited on
        "waiting_on_batch",  # fleet.lifecycle.batch: the provider batch call parked
        "batch_call",  # fleet.batchapi.route
        "fan_out",  # fleet.conversation.fanout: the tasks a fan-out root explores
        "owner_heals",  # fleet.owners
        "transient_retries",  # fleet.loop.turns
        "overloads",  # fleet.loop.turns
        "model_fallbacks",  # fleet.llm.fallback
        "correction",  # fleet.loop.structured
        "warm_after_first",  # fleet.children.warming
    }
)
"""Metadata keys the fleet itself writes and reads back as run state, not the caller's.

Not here, though the fleet writes them too: `turn` (fleet.conversation.continuation) and
`context` (fleet.loop.fit's note), which a continued import reads to tell its new turn's
events from the archived ones and to count compactions; a forged value steers nothing.
"""
HASH_FIELDS = frozenset(TRACE_FIELDS)
"""The trace hash's fields an archive may carry, besides its messages (`m:N`)."""


def refusal_of_record(record: TraceRecord, trace: Trace) -> str | None:
    """Why one trace line may not be imported, or None."""
    extra = [f for f in record.fields if f not in HASH_FIELDS and not f.startswith(MESSAGE_FIELD)]
    if extra:
        return f"field {extra[0][:40]!r} is the fleet's own, not an archived trace's"
    if trace.status not in TERMINAL:
        return f"trace {trace.trace_id!r} is {trace.status}: only ended trees are imported"
    if reserved := sorted(RESERVED_METADATA & set(trace.metadata)):
        return f"metadata {reserved[0]!r} of trace {trace.trace_id!r} is the fleet's run state"
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
    metadata = json.loads(fields.get("metadata", "{}"))
    if isinstance(metadata, dict) and RESERVED_METADATA & set(metadata):
        kept = {k: v for k, v in metadata.items() if k not in RESERVED_METADATA}
        fields["metadata"] = json.dumps(kept, ensure_ascii=False)
    return TraceRecord(fields, record.collaborators)
