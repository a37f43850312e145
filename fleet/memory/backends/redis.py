"""`Board` on the fleet's Redis: one Lua script per write (keys in `fleet.storage.keys`).

The script is the rules of `fleet.memory.board` run atomically where the data is, so two
workers on two machines writing one key are ordered by Redis: one lands, the other is
told the version it lost to. A worker killed before the script ran wrote nothing; after
it, the write is whole (entry, history and TTL in one step). A Redis restart keeps what
its persistence kept; a write it lost before replying is retried by its writer, and a
retry with the same `write_id` lands once whether or not the first one was kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from fleet.memory.index import Postings, parse_posting, postings_of
from fleet.memory.model import (
    Entry,
    Landed,
    Lost,
    Proposal,
    Write,
    WriteOutcome,
    full_error,
    proposal_of,
)
from fleet.memory.names import DEFAULT_CAPS, MemoryCaps
from fleet.models import now_ms
from fleet.storage import keys

MEMORY_WRITE = """
local entries, history, proposals = KEYS[1], KEYS[2], KEYS[3]
local index, terms, recent = KEYS[4], KEYS[5], KEYS[6]
local key, expected, rest, write_id = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local depth, max_keys, ttl_s = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local length, postings, at_ms = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
if write_id ~= '' then
  for _, raw in ipairs(redis.call('LRANGE', history, 0, -1)) do
    local old = cjson.decode(raw)
    if old['write_id'] == write_id then return {'dup', old['version']} end
  end
end
local current = 0
local raw = redis.call('HGET', entries, key)
if raw then current = cjson.decode(raw)['version'] end
if expected >= 0 and current ~= expected then return {'lost', current} end
if current == 0 and redis.call('HLEN', entries) >= max_keys then return {'full', 0} end
local version = current + 1
local entry = '{"version":' .. version .. ',' .. rest
redis.call('HSET', entries, key, entry)
redis.call('LPUSH', history, entry)
redis.call('LTRIM', history, 0, depth - 1)
local grown = length - unindex(index, terms, key)
for posting in string.gmatch(postings, '[^\\n]+') do redis.call('ZADD', index, 0, posting) end
redis.call('HSET', terms, key, length .. '\\n' .. postings)
redis.call('HINCRBY', terms, '#length', grown)
redis.call('ZADD', recent, at_ms, key)
if ttl_s > 0 then
  for _, name in ipairs({entries, history, index, terms, recent}) do
    redis.call('EXPIRE', name, ttl_s)
  end
  if redis.call('EXISTS', proposals) == 1 then redis.call('EXPIRE', proposals, ttl_s) end
end
return {'ok', version}
"""
"""KEYS: entries, history, proposals, index, terms, recent. ARGV: key, expected version
(-1: any), the entry's JSON after its opening brace and without `version`, write id (''
none), history depth, max keys, TTL s (0 none), the entry's length in words, its postings
(one a line), the write's time (ms). Returns {ok|dup|lost|full, version}."""

UNINDEX = """
local function unindex(index, terms, key)
  local old = redis.call('HGET', terms, key)
  if not old then return 0 end
  local length = nil
  for line in string.gmatch(old, '[^\\n]+') do
    if length == nil then length = tonumber(line) else redis.call('ZREM', index, line) end
  end
  redis.call('HDEL', terms, key)
  return length or 0
end
"""
"""Removes a key's postings and returns its length (0 if it had none): both scripts'."""

MEMORY_REMOVE = """
local entries, history, index, terms, recent = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local key = ARGV[1]
local removed = redis.call('HDEL', entries, key)
redis.call('DEL', history)
local length = unindex(index, terms, key)
if length > 0 then redis.call('HINCRBY', terms, '#length', -length) end
redis.call('ZREM', recent, key)
return removed
"""
"""KEYS: entries, history, index, terms, recent. ARGV: key. Returns 1 if it was there."""

MEMORY_BACKFILL = """
local entries, index, terms, recent = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local added = 0
for i = 1, #ARGV, 5 do
  local key, raw, length, postings = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  if redis.call('HGET', entries, key) == raw and redis.call('HEXISTS', terms, key) == 0 then
    for posting in string.gmatch(postings, '[^\\n]+') do
      redis.call('ZADD', index, 0, posting)
    end
    redis.call('HSET', terms, key, length .. '\\n' .. postings)
    redis.call('HINCRBY', terms, '#length', length)
    redis.call('ZADD', recent, tonumber(ARGV[i + 4]), key)
    added = added + 1
  end
end
local ttl = redis.call('PTTL', entries)
if ttl > 0 then
  for _, name in ipairs({index, terms, recent}) do redis.call('PEXPIRE', name, ttl) end
end
return added
"""
"""KEYS: entries, index, terms, recent. ARGV: (key, entry JSON as read, length, postings,
written at ms) per entry. Indexes each entry that is still what was read and has no
postings yet (an entry written before the index existed); returns how many."""

BACKFILL_BATCH = 200
"""Entries indexed per backfill script call (a short script: other writes go between)."""


class RedisBoard:
    """Entries in one hash per namespace, each key's history in a list beside it."""

    def __init__(self, client: redis.Redis) -> None:
        """Use this client (the trace store's, decoded responses)."""
        self._client = client
        self._write = client.register_script(UNINDEX + MEMORY_WRITE)
        self._remove = client.register_script(UNINDEX + MEMORY_REMOVE)
        self._backfill = client.register_script(MEMORY_BACKFILL)

    def read(self, namespace: str, key: str) -> Entry | None:  # noqa: D102 (the Protocol's)
        raw = self._client.hget(keys.memory_entries(namespace), key)
        return None if raw is None else Entry.model_validate_json(raw)

    def entries(self, namespace: str) -> list[Entry]:  # noqa: D102
        found = self._client.hgetall(keys.memory_entries(namespace))
        return [Entry.model_validate_json(found[k]) for k in sorted(found)]

    def read_many(self, namespace: str, keys_: Sequence[str]) -> list[Entry]:  # noqa: D102
        if not keys_:
            return []
        found = self._client.hmget(keys.memory_entries(namespace), list(keys_))
        return [Entry.model_validate_json(raw) for raw in found if raw is not None]

    def postings(self, namespace: str, words: Sequence[str]) -> Postings:  # noqa: D102
        for _ in range(2):  # once more after indexing entries written before the index
            pipe = self._client.pipeline(transaction=False)
            pipe.hlen(keys.memory_entries(namespace))
            pipe.hlen(keys.memory_terms(namespace))
            pipe.hget(keys.memory_terms(namespace), "#length")
            for word in words:
                pipe.zrangebylex(keys.memory_index(namespace), f"[{word} ", f"({word}!")
            count, indexed, length, *found = pipe.execute()
            indexed -= 0 if length is None else 1
            if indexed >= count or not self._index_missing(namespace):
                break
        hits = {
            word: [parse_posting(p)[1:] for p in postings]
            for word, postings in zip(words, found, strict=True)
        }
        return Postings(entries=int(count), length=int(length or 0), hits=hits)

    def _index_missing(self, namespace: str) -> bool:
        """Index the entries without postings (written before the index); True if any."""
        entries = keys.memory_entries(namespace)
        indexed = set(self._client.hkeys(keys.memory_terms(namespace)))
        args: list[str | int] = []
        for key, raw in self._client.hgetall(entries).items():
            key, raw = str(key), str(raw)
            if key not in indexed:
                entry = Entry.model_validate_json(raw)
                length, postings = postings_of(key, entry.value)
                args += [key, raw, length, "\n".join(postings), entry.updated_at_ms]
        script_keys = [entries, keys.memory_index(namespace), keys.memory_terms(namespace)]
        script_keys.append(keys.memory_recent(namespace))
        step = 5 * BACKFILL_BATCH
        added = sum(
            int(self._backfill(keys=script_keys, args=args[i : i + step]))
            for i in range(0, len(args), step)
        )
        return added > 0

    def newest(self, namespace: str, count: int) -> list[Entry]:  # noqa: D102
        self.postings(namespace, [])  # entries written before the index: in `recent` too
        latest = self._client.zrevrange(keys.memory_recent(namespace), 0, count - 1)
        return self.read_many(namespace, [str(k) for k in latest])

    def write(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> WriteOutcome:  # noqa: D102
        write.checked(caps)
        ns, key = write.namespace, write.key
        at_ms = now_ms()
        rest = write.entry(0, at_ms).model_dump_json(exclude={"version"})[1:]
        expected = -1 if write.expected_version is None else write.expected_version
        length, postings = postings_of(key, write.value)
        args: list[str | int] = [key, expected, rest, write.write_id or ""]
        args += [caps.history_depth, caps.max_keys, caps.ttl_of(ns) or 0]
        args += [length, "\n".join(postings), at_ms]
        script_keys = [keys.memory_entries(ns), keys.memory_history(ns, key)]
        script_keys += [keys.memory_proposals(ns), keys.memory_index(ns)]
        script_keys += [keys.memory_terms(ns), keys.memory_recent(ns)]
        kind, version = self._write(keys=script_keys, args=args)
        if kind == "full":
            raise full_error(ns, caps)
        if kind == "lost":
            return Lost(int(version))
        # Listed apart (another slot on a cluster); a crash before it: listed by the next write.
        self._client.sadd(keys.MEMORY_NAMESPACES, ns)
        return Landed(int(version), duplicate=kind == "dup")

    def remove(self, namespace: str, key: str) -> bool:  # noqa: D102
        script_keys = [keys.memory_entries(namespace), keys.memory_history(namespace, key)]
        script_keys += [keys.memory_index(namespace), keys.memory_terms(namespace)]
        script_keys.append(keys.memory_recent(namespace))
        return bool(self._remove(keys=script_keys, args=[key]))

    def history(self, namespace: str, key: str) -> list[Entry]:  # noqa: D102
        raw = self._client.lrange(keys.memory_history(namespace, key), 0, -1)
        return [Entry.model_validate_json(r) for r in raw]

    def namespaces(self) -> list[str]:  # noqa: D102
        listed = sorted(str(ns) for ns in self._client.smembers(keys.MEMORY_NAMESPACES))
        live = [
            ns
            for ns in listed
            if self._client.exists(keys.memory_entries(ns), keys.memory_proposals(ns))
        ]
        gone = set(listed) - set(live)
        if gone:  # expired (its TTL) or emptied: listed again by its next write
            self._client.srem(keys.MEMORY_NAMESPACES, *gone)
        return live

    def propose(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> Proposal:  # noqa: D102
        write.checked(caps)
        proposal = proposal_of(write)
        where = keys.memory_proposals(write.namespace)
        if not self._client.hsetnx(where, proposal.id, proposal.model_dump_json()):
            kept = self._client.hget(where, proposal.id)
            if kept is not None:  # else taken meanwhile: this one stands
                return Proposal.model_validate_json(kept)
        self._client.sadd(keys.MEMORY_NAMESPACES, write.namespace)
        return proposal

    def proposals(self, namespace: str) -> list[Proposal]:  # noqa: D102
        raw = self._client.hvals(keys.memory_proposals(namespace))
        found = [Proposal.model_validate_json(r) for r in raw]
        return sorted(found, key=lambda p: p.proposed_at_ms)

    def take_proposal(self, namespace: str, proposal_id: str) -> Proposal | None:  # noqa: D102
        pipe = self._client.pipeline()
        where = keys.memory_proposals(namespace)
        pipe.hget(where, proposal_id)
        pipe.hdel(where, proposal_id)
        raw, taken = pipe.execute()
        return Proposal.model_validate_json(raw) if raw is not None and taken else None
