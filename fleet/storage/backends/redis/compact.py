"""Compaction of a finished tree on Redis: each trace hash packed, the event stream archived.

When the owner check finds a tree whose every trace ended, `compact_tree` packs each trace
hash into one compressed field (`fleet.storage.compaction`), moves the tree's event stream
into one packed string (`keys.events_archive`) and gives every key of the tree the
retention TTL (`Settings.retention_s`). Each step is one script on one key (or a tree's two
event keys) that first checks nothing changed since it was read, so a step that fails or
loses a race leaves that key as it was, readable, and the next check packs it.

Before a write to a packed trace (`fleet run --continue`, a reply), `thaw` spreads the
fields back (and restores the root's events into its stream) so the write scripts find the
fields they read. Readers never thaw: they unpack (`compaction.unpacked`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, cast

import redis

from fleet.models import TERMINAL
from fleet.storage import keys
from fleet.storage.backends.redis.connect import Lua
from fleet.storage.backends.redis.writes import MESSAGE_FIELD
from fleet.storage.compaction import (
    PACKED_FIELD,
    PackError,
    TreeDict,
    digest,
    pack,
    unpack,
    unpacked,
)

READ_BATCH = 100
"""Trace hashes read per pipeline while compacting."""

_SORTED_DUMP = """
local function dump(flat)
  local names, at = {}, {}
  for i = 1, #flat, 2 do
    names[#names + 1] = flat[i]
    at[flat[i]] = flat[i + 1]
  end
  table.sort(names)
  local parts = {}
  for _, name in ipairs(names) do parts[#parts + 1] = name .. '\\0' .. at[name] .. '\\0' end
  return table.concat(parts)
end
"""

# KEYS: trace hash. ARGV: digest of the hash as read (`compaction.digest`), packed value,
# ttl_s. Replaces the hash with its one packed field, only if it is still as read.
PACK_TRACE = Lua(
    _SORTED_DUMP
    + """
local flat = redis.call('HGETALL', KEYS[1])
if #flat == 0 or dump(flat) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'z', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: trace hash. ARGV: the packed value as read, then field, value, ... from it.
# Spreads the packed fields back (a field written since packing is kept), only if the
# packed value is still the one read. Returns 1 if thawed.
THAW_TRACE = Lua("""
if redis.call('HGET', KEYS[1], 'z') ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('HDEL', KEYS[1], 'z')
return 1
""")

# KEYS: events stream, events archive. ARGV: the stream's last id as read, its length as
# read, the archive as read ('' when none), the new archive, ttl_s.
ARCHIVE_EVENTS = Lua("""
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 or last[1][1] ~= ARGV[1] or redis.call('XLEN', KEYS[1]) ~= tonumber(ARGV[2]) then
  return 0
end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[5])
redis.call('DEL', KEYS[1])
return 1
""")

# KEYS: events stream, events archive. ARGV: the archive as read, then id, event JSON, ...
# Puts the archived events back into the stream when it has none (a continued tree).
RESTORE_EVENTS = Lua("""
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
for i = 2, #ARGV, 2 do redis.call('XADD', KEYS[1], ARGV[i], 'e', ARGV[i + 1]) end
redis.call('DEL', KEYS[2])
return 1
""")

_TERMINAL_JSON = frozenset(json.dumps(status) for status in TERMINAL)


class Compacted(NamedTuple):
    """What one compaction of a tree did."""

    packed: int
    """Traces packed now (packed ones before are not counted)."""
    raced: bool
    """A key changed between its read and its pack (it was left as it is): the tree moves."""


def compact_tree(client: redis.Redis, root_trace_id: str, retention_s: int) -> Compacted:
    """Pack every ended trace of the tree and archive its events.

    A trace that has not ended, or changed while read, is left as it is.
    """
    dicts = DictCache(client)
    tree_dict: TreeDict | None = None
    packed = raced = 0
    for trace_ids in _batches(tree_ids(client, root_trace_id)):
        pipe = client.pipeline(transaction=False)
        for trace_id in trace_ids:
            pipe.hgetall(keys.trace(trace_id))
        hashes = pipe.execute()
        found = [(t, cast(dict[str, str], raw)) for t, raw in zip(trace_ids, hashes, strict=True)]
        for trace_id, raw in found:
            data = _packable(raw, dicts)
            if data is None:
                continue
            if tree_dict is None:
                tree_dict = _tree_dict(client, root_trace_id, found, dicts, retention_s)
            value = pack(data, tree_dict)
            done = int(
                PACK_TRACE(client, [keys.trace(trace_id)], [digest(raw), value, retention_s])
            )
            packed, raced = packed + done, raced + 1 - done
        if tree_dict is not None:
            _pack_collaborators(client, trace_ids, tree_dict, retention_s)
        _expire_family(client, found, retention_s)
    client.expire(keys.tree_dict(root_trace_id), retention_s)  # after every trace packed with it
    archived = archive_events(client, root_trace_id, retention_s)
    return Compacted(packed, bool(raced) or archived is False)


COLLABORATORS_PACKED = ":packed"
"""The field of a packed collaborators hash (no trace id has a `:`): its entries and order."""

# KEYS: collaborators, collaborator order. ARGV: digest of the hash as read, the order's
# length as read, packed value, ttl_s. The order list is folded into the packed value.
PACK_COLLABORATORS = Lua(
    _SORTED_DUMP
    + """
local flat = redis.call('HGETALL', KEYS[1])
if #flat == 0 or dump(flat) ~= ARGV[1] then return 0 end
if redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], ':packed', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""
)


def _pack_collaborators(
    client: redis.Redis, trace_ids: Sequence[str], tree_dict: TreeDict, ttl_s: int
) -> None:
    pipe = client.pipeline(transaction=False)
    for trace_id in trace_ids:
        pipe.hgetall(keys.collaborators(trace_id))
        pipe.lrange(keys.collaborator_order(trace_id), 0, -1)
    replies = pipe.execute()
    for at, trace_id in enumerate(trace_ids):
        entries = cast(dict[str, str], replies[2 * at])
        order = [str(c) for c in replies[2 * at + 1]]
        if not entries or set(entries) == {COLLABORATORS_PACKED}:
            continue
        merged_order, merged = merged_collaborators(order, dict(entries), DictCache(client))
        value = pack({"order": json.dumps(merged_order), "entries": json.dumps(merged)}, tree_dict)
        script_keys = [keys.collaborators(trace_id), keys.collaborator_order(trace_id)]
        PACK_COLLABORATORS(client, script_keys, [digest(entries), len(order), value, ttl_s])


def merged_collaborators(
    order: list[str], entries: dict[str, str], dicts: DictCache
) -> tuple[list[str], dict[str, str]]:
    """The order and entries of a collaborators hash, its packed part (if any) spread back.

    Entries added after packing (a continued tree's new children) come after the packed ones.
    """
    value = entries.pop(COLLABORATORS_PACKED, None)
    if value is None:
        return order, entries
    fields = dicts.unpacked({PACKED_FIELD: value})
    old_order = [str(c) for c in json.loads(fields["order"])]
    old = {str(k): str(v) for k, v in json.loads(fields["entries"]).items()}
    return old_order + [c for c in order if c not in old], {**old, **entries}


def tree_ids(client: redis.Redis, root_trace_id: str) -> list[str]:
    """The tree's trace ids, root first, breadth first (by the children sets)."""
    found, frontier = [root_trace_id], [root_trace_id]
    while frontier:
        pipe = client.pipeline(transaction=False)
        for trace_id in frontier:
            pipe.zrange(keys.children(trace_id), 0, -1)
        frontier = [str(child) for kids in pipe.execute() for child in kids]
        found += frontier
    return found


def _batches(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), READ_BATCH):
        yield ids[start : start + READ_BATCH]


def _packable(raw: dict[str, str], dicts: DictCache) -> dict[str, str] | None:
    """The fields of an ended trace not packed yet; None for any other."""
    if not raw or set(raw) == {PACKED_FIELD}:
        return None  # gone, or packed already
    data = unpacked(raw, dicts)
    return data if data.get("status") in _TERMINAL_JSON else None


def _tree_dict(
    client: redis.Redis,
    root_trace_id: str,
    found: list[tuple[str, dict[str, str]]],
    dicts: DictCache,
    ttl_s: int,
) -> TreeDict:
    """The tree's dictionary: the one it has, else one made of a branch (the root if alone)."""
    have = dicts(root_trace_id)
    if have is not None:
        return have
    sample = next((raw for t, raw in found[1:] if raw and PACKED_FIELD not in raw), found[0][1])
    made = TreeDict.of(root_trace_id, unpacked(sample, dicts))
    text = base64.b64encode(made.data).decode("ascii")
    if client.set(keys.tree_dict(root_trace_id), text, nx=True, ex=ttl_s):
        return made
    return dicts(root_trace_id) or made  # another compaction made one first


class DictCache:
    """Tree dictionaries read from Redis, kept by this process (they never change)."""

    MAX_TREES = 256

    def __init__(self, client: redis.Redis) -> None:
        """Read through `client`."""
        self._client = client
        self._known: dict[str, TreeDict] = {}

    def __call__(self, root_trace_id: str) -> TreeDict | None:
        """The tree's dictionary, None if it has none."""
        known = self._known.get(root_trace_id)
        if known is not None:
            return known
        text = cast(str | None, self._client.get(keys.tree_dict(root_trace_id)))
        if text is None:
            return None
        if len(self._known) >= self.MAX_TREES:
            self._known.clear()
        found = self._known[root_trace_id] = TreeDict(root_trace_id, base64.b64decode(text))
        return found

    def unpacked(self, data: dict[str, str]) -> dict[str, str]:
        """`compaction.unpacked` with these dictionaries; read again once if one was stale."""
        try:
            return unpacked(data, self)
        except PackError:
            if not self._known:
                raise
            self._known.clear()  # a dictionary that expired and was made anew
            return unpacked(data, self)


def _expire_family(
    client: redis.Redis, found: Sequence[tuple[str, dict[str, str]]], ttl_s: int
) -> None:
    """The retention TTL on the keys beside each trace hash.

    Children, collaborators, and the marker of each tool call whose children were collected
    (it kept the trace's 7 days: a soak saw one per collected call outlive its tree).
    """
    pipe = client.pipeline(transaction=False)
    for trace_id, raw in found:
        for key in (keys.children, keys.collaborators, keys.collaborator_order):
            pipe.expire(key(trace_id), ttl_s)
        for call_id in _tool_results(raw):
            pipe.expire(keys.collected(trace_id, call_id), ttl_s)
    pipe.execute()


def _tool_results(raw: dict[str, str]) -> list[str]:
    """The tool call ids a trace hash holds results of (a packed hash: none left to find)."""
    calls = []
    for name, value in raw.items():
        if name.startswith(MESSAGE_FIELD) and '"role":"tool"' in value:
            call_id = json.loads(value).get("tool_call_id")
            if isinstance(call_id, str):
                calls.append(call_id)
    return calls


def archive_events(client: redis.Redis, root_trace_id: str, ttl_s: int) -> bool | None:
    """The tree's event stream moved into its archive (merged with an older one).

    None when there was no stream; False when it changed while read (left as it is).
    """
    stream, archive = keys.events(root_trace_id), keys.events_archive(root_trace_id)
    read = cast(list[tuple[str, dict[str, str]]], client.xrange(stream))
    entries = [(str(i), str(f["e"])) for i, f in read]
    if not entries:
        return None
    old = cast(str | None, client.get(archive))
    merged = (archived_events(old) if old else []) + entries
    args: list[Any] = [entries[-1][0], len(entries), old or "", packed_events(merged)]
    return bool(ARCHIVE_EVENTS(client, [stream, archive], [*args, ttl_s]))


def archived_events(value: str) -> list[tuple[str, str]]:
    """(entry id, event JSON) pairs of a packed events archive."""
    return [(str(i), str(e)) for i, e in json.loads(unpack(value)["events"])]


def packed_events(entries: Sequence[tuple[str, str]]) -> str:
    """(entry id, event JSON) pairs as an events archive's value."""
    return pack({"events": json.dumps(list(entries), separators=(",", ":"))})


def thaw(client: redis.Redis, trace_id: str, dicts: DictCache | None = None) -> bool:
    """Spread a packed trace's fields back before a write; False if it was not packed."""
    key = keys.trace(trace_id)
    value = cast(str | None, client.hget(key, PACKED_FIELD))
    if value is None:
        return False
    fields = (dicts or DictCache(client)).unpacked({PACKED_FIELD: value})
    items = [item for pair in fields.items() for item in pair]
    thawed = bool(THAW_TRACE(client, [key], [value, *items]))
    if thawed and json.loads(fields.get("parent_trace_id", "null")) is None:
        restore_events(client, trace_id)
    return thawed


def restore_events(client: redis.Redis, root_trace_id: str) -> bool:
    """The root's archived events back in its stream, if the stream is empty."""
    stream, archive = keys.events(root_trace_id), keys.events_archive(root_trace_id)
    value = cast(str | None, client.get(archive))
    if value is None:
        return False
    items = [item for pair in archived_events(value) for item in pair]
    return bool(RESTORE_EVENTS(client, [stream, archive], [value, *items]))


def events_after(client: redis.Redis, root_trace_id: str, after: str, count: int) -> list[Any]:
    """Archived (id, {"e": event}) entries after `after`, as XREAD gives them; [] for none."""
    value = cast(str | None, client.get(keys.events_archive(root_trace_id)))
    if value is None:
        return []
    cursor = _stream_id(after)
    found = [(i, {"e": e}) for i, e in archived_events(value) if _stream_id(i) > cursor]
    return found[:count]


def is_entry_id(value: str) -> bool:
    """Whether `value` is a stream entry id (`{ms}-{seq}`)."""
    ms, dash, seq = value.partition("-")
    return bool(dash) and ms.isdigit() and seq.isdigit() and len(value) <= 41


def _stream_id(entry_id: str) -> tuple[int, int]:
    """An entry id as a comparable pair; `$` (only what comes next) is past every archived one."""
    ms, _, seq = entry_id.partition("-")
    if not (ms.isdigit() and (seq.isdigit() or not seq)):
        return (2**63, 0)
    return int(ms), int(seq or 0)
