"""Finished trees out of Redis as records, and records back in (`fleet archive`).

A tree is one `TreeRecord`: each trace's hash as its fields' texts (messages included, as
`trace show` and `--continue` read them), its collaborators in order, and the tree's events.
`read_tree` reads one whatever its state (packed or not); `write_tree` writes one back as a
compacted tree with the retention TTL, leaving alone any trace Redis already holds;
`drop_tree` deletes a tree's keys after it was safely written elsewhere.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import cast

import redis
from pydantic import BaseModel, ValidationError

from fleet.errors import ConfigError, InvalidTraceId
from fleet.ids import check_trace_id
from fleet.models import Collaborator, Event, Message, Trace, unknown_fields
from fleet.storage import keys
from fleet.storage.backends.redis import compact as redis_compact
from fleet.storage.backends.redis.connect import Lua, is_cluster
from fleet.storage.backends.redis.writes import MESSAGE_FIELD, decode_trace
from fleet.storage.capability import Capability
from fleet.storage.compaction import unpacked


class BadRecord(ValueError):
    """A record that is not a tree this fleet wrote (one line: what and where)."""


@dataclass
class TraceRecord:
    """One trace: its hash's fields as stored, its collaborator entries in order."""

    fields: dict[str, str]
    collaborators: list[tuple[str, str]] = field(default_factory=list)
    line: int = field(default=0, compare=False)
    """The line of the archive file it was read from (0: read from Redis)."""

    @property
    def trace_id(self) -> str:
        """The id in the trace's own fields."""
        return str(json.loads(self.fields["trace_id"]))


@dataclass
class TreeRecord:
    """A whole tree: its traces (root first) and its event entries (id, event JSON)."""

    root_trace_id: str
    traces: list[TraceRecord]
    events: list[tuple[str, str]]

    def lines(self) -> list[str]:
        """The tree as JSONL lines: one per trace, then one of its events."""
        out = [
            json.dumps({"kind": "trace", "fields": t.fields, "collaborators": t.collaborators})
            for t in self.traces
        ]
        out.append(
            json.dumps({"kind": "events", "root": self.root_trace_id, "events": self.events})
        )
        return out

    def digest(self) -> str:
        """What identifies this tree's content (its lines, hashed)."""
        return hashlib.sha256("\n".join(self.lines()).encode()).hexdigest()


def read_tree(client: redis.Redis, root_trace_id: str) -> TreeRecord | None:
    """The tree as stored, None if its root is gone."""
    dicts = redis_compact.DictCache(client)
    traces: list[TraceRecord] = []
    for trace_id in redis_compact.tree_ids(client, root_trace_id):
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.trace(trace_id))
        pipe.hgetall(keys.collaborators(trace_id))
        pipe.lrange(keys.collaborator_order(trace_id), 0, -1)
        raw, entries, order = pipe.execute()
        if not raw:
            continue  # expired on its own
        order, entries = redis_compact.merged_collaborators(order, entries, dicts)
        pairs = [(str(c), str(entries[c])) for c in order if c in entries]
        traces.append(TraceRecord(dicts.unpacked(cast(dict[str, str], raw)), pairs))
    if not traces:
        return None
    stream = cast(list[tuple[str, dict[str, str]]], client.xrange(keys.events(root_trace_id)))
    archived = redis_compact.events_after(client, root_trace_id, "0", 10**9)
    events = [(str(i), str(f["e"])) for i, f in [*archived, *stream]]
    return TreeRecord(root_trace_id, traces, events)


def check_tree(tree: TreeRecord) -> None:
    """`BadRecord` unless every trace, message, entry and event reads as this fleet's."""
    ids = set()
    for record in tree.traces:
        trace = check_trace(record)
        if trace.root_trace_id != tree.root_trace_id:
            raise BadRecord(f"trace {trace.trace_id!r} is not of tree {tree.root_trace_id!r}")
        ids.add(trace.trace_id)
    if tree.root_trace_id not in ids:
        raise BadRecord(f"tree {tree.root_trace_id!r} has no root trace")
    for entry_id, event in tree.events:
        if not redis_compact.is_entry_id(entry_id):
            raise BadRecord(f"event id {entry_id[:40]!r} is not a stream entry id")
        try:
            known(Event.model_validate_json(event))
        except ValueError as exc:
            raise BadRecord(_first_line(exc)) from None


def check_trace(record: TraceRecord) -> Trace:
    """The record's trace, its id, messages and collaborator entries checked (`BadRecord`)."""
    try:
        trace = decode_trace(unpacked(record.fields))
        if trace is not None:
            known(trace)
        check_trace_id(record.trace_id)
        for name, value in record.fields.items():
            if name.startswith(MESSAGE_FIELD):
                known(Message.model_validate_json(value))
        for child, entry in record.collaborators:
            known(Collaborator.model_validate_json(entry))
            check_trace_id(child)
    except (ValueError, KeyError, InvalidTraceId) as exc:
        raise BadRecord(_first_line(exc)) from None
    if trace is None:
        raise BadRecord("a trace record without fields")
    return trace


def known(record: BaseModel) -> None:
    """`ValueError` for a field this release does not know.

    The store keeps such fields for the release that wrote them, but a file from outside
    may not plant one for a later release to read.
    """
    strangers = unknown_fields(record)
    if strangers:
        raise ValueError(f"{type(record).__name__} field {strangers[0]} is not this release's")


def _first_line(exc: Exception) -> str:
    """The first thing wrong, on one line (a validation error's first field and message)."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where[:80]}: {first['msg']}"[:200]
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


# KEYS: trace, traces index, the parent's children (the trace itself if none), collaborators,
# collaborator order. ARGV: ttl_s, trace id, created_at_ms, '1' with a parent, n, then n
# (child id, Collaborator JSON) pairs, then the hash's field/value pairs. A trace Redis
# holds is kept as it is (its indexes are still written: they may be what a crash lost).
# On a cluster the traces index is in another slot: KEYS[2] is the trace's key, and the
# caller indexes the trace after.
RESTORE_TRACE = Lua("""
local fresh = redis.call('EXISTS', KEYS[1]) == 0
local n = tonumber(ARGV[5])
if fresh then
  for i = 6 + 2 * n, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
if KEYS[2] ~= KEYS[1] then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]) end
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[1])
end
if fresh and n > 0 and redis.call('EXISTS', KEYS[4]) == 0 then
  for i = 6, 5 + 2 * n, 2 do
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
    redis.call('RPUSH', KEYS[5], ARGV[i])
  end
  redis.call('EXPIRE', KEYS[4], ARGV[1])
  redis.call('EXPIRE', KEYS[5], ARGV[1])
end
return fresh and 1 or 0
""")


def write_tree(client: redis.Redis, tree: TreeRecord, retention_s: int) -> int:
    """The tree back in Redis, compacted; the traces written (one already there is kept).

    Each trace is one script (it and its index entries, or nothing), so an import cut short
    leaves whole traces, and running it again writes the rest.
    """
    written, cluster = 0, is_cluster(client)
    client.set(keys.imported(tree.root_trace_id), tree.digest(), ex=retention_s)
    for record in tree.traces:
        trace_id = record.trace_id
        parent = json.loads(record.fields.get("parent_trace_id", "null"))
        created = int(json.loads(record.fields.get("created_at_ms", "0")))
        index = keys.trace(trace_id) if cluster else keys.TRACES
        script_keys = [keys.trace(trace_id), index, keys.children(parent or trace_id)]
        script_keys += [keys.collaborators(trace_id), keys.collaborator_order(trace_id)]
        args: list[str | int] = [retention_s, trace_id, created, "1" if parent else ""]
        args.append(len(record.collaborators))
        args += [item for pair in record.collaborators for item in pair]
        args += [item for pair in record.fields.items() for item in pair]
        written += int(RESTORE_TRACE(client, script_keys, args))
        if cluster:
            client.zadd(keys.TRACES, {trace_id: created})
    if tree.events and not client.exists(keys.events(tree.root_trace_id)):
        value = redis_compact.packed_events(tree.events)
        client.set(keys.events_archive(tree.root_trace_id), value, ex=retention_s, nx=True)
    redis_compact.compact_tree(client, tree.root_trace_id, retention_s)
    return written


def held(client: redis.Redis, tree: TreeRecord) -> dict[str, bool]:
    """Each trace id of the tree -> whether Redis holds any key of it (or of its tree)."""
    root = tree.root_trace_id
    pipe = client.pipeline(transaction=False)
    for key in (keys.events(root), keys.events_archive(root), keys.tree_dict(root)):
        pipe.exists(key)
    for record in tree.traces:
        trace_id = record.trace_id
        for key in (keys.trace(trace_id), keys.children(trace_id), keys.collaborators(trace_id)):
            pipe.exists(key)
    found = [bool(n) for n in pipe.execute()]
    tree_keys, per_trace = any(found[:3]), found[3:]
    return {
        record.trace_id: any(per_trace[3 * i : 3 * i + 3])
        or (tree_keys and record.trace_id == root)
        for i, record in enumerate(tree.traces)
    }


def drop_tree(client: redis.Redis, tree: TreeRecord) -> None:
    """Every key of the tree deleted, and its traces out of the traces index."""
    root = tree.root_trace_id
    doomed = [keys.events(root), keys.events_archive(root), keys.tree_dict(root)]
    doomed.append(keys.imported(root))
    for record in tree.traces:
        trace_id = record.trace_id
        doomed += [keys.trace(trace_id), keys.children(trace_id)]
        doomed += [keys.collaborators(trace_id), keys.collaborator_order(trace_id)]
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(doomed), 500):
        pipe.delete(*doomed[start : start + 500])
    ids = [record.trace_id for record in tree.traces]
    for start in range(0, len(ids), 500):
        pipe.zrem(keys.TRACES, *ids[start : start + 500])
    pipe.execute()


class TreeArchive:
    """Whole trees read, written and dropped on the store's Redis (`ARCHIVE`)."""

    def __init__(self, client: redis.Redis) -> None:
        """On the store's client (decoded responses)."""
        self._client = client

    def read_tree(self, root_trace_id: str) -> TreeRecord | None:
        """`read_tree` on this store's Redis."""
        return read_tree(self._client, root_trace_id)

    def write_tree(self, tree: TreeRecord, retention_s: int) -> int:
        """`write_tree` on this store's Redis."""
        return write_tree(self._client, tree, retention_s)

    def drop_tree(self, tree: TreeRecord) -> None:
        """`drop_tree` on this store's Redis."""
        drop_tree(self._client, tree)

    def held(self, tree: TreeRecord) -> dict[str, bool]:
        """`held` on this store's Redis."""
        return held(self._client, tree)

    def import_mark(self, root_trace_id: str) -> str | None:
        """The digest of the tree an import wrote (or began) under this root, if any."""
        value = self._client.get(keys.imported(root_trace_id))
        return None if value is None else str(value)

    def newest_ids(self, start: int, count: int) -> list[str]:
        """Trace ids of the traces index, newest first, from `start` (a page of `count`)."""
        return [str(i) for i in self._client.zrevrange(keys.TRACES, start, start + count - 1)]


def _no_archive() -> TreeArchive:
    raise ConfigError("fleet archive needs the Redis store (FLEET_REDIS_URL), not a memory one")


ARCHIVE: Capability[TreeArchive] = Capability("archive", TreeArchive, _no_archive)
"""`store.capability(ARCHIVE)`: the store's trees as records (`fleet archive`)."""
