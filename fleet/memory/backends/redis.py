"""`Board` on the fleet's Redis: one Lua script per write (keys in `fleet.storage.keys`).

The script is the rules of `fleet.memory.board` run atomically where the data is, so two
workers on two machines writing one key are ordered by Redis: one lands, the other is
told the version it lost to. A worker killed before the script ran wrote nothing; after
it, the write is whole (entry, history and TTL in one step). A Redis restart keeps what
its persistence kept; a write it lost before replying is retried by its writer, and a
retry with the same `write_id` lands once whether or not the first one was kept.
"""

from __future__ import annotations

import redis

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
local key, expected, rest, write_id = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local depth, max_keys, ttl_s = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
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
if ttl_s > 0 then
  redis.call('EXPIRE', entries, ttl_s)
  redis.call('EXPIRE', history, ttl_s)
  if redis.call('EXISTS', proposals) == 1 then redis.call('EXPIRE', proposals, ttl_s) end
end
return {'ok', version}
"""
"""KEYS: entries, history, proposals. ARGV: key, expected version (-1: any), the entry's
JSON after its opening brace and without `version`, write id ('' none), history depth,
max keys, TTL s (0 none). Returns {ok|dup|lost|full, version}."""


class RedisBoard:
    """Entries in one hash per namespace, each key's history in a list beside it."""

    def __init__(self, client: redis.Redis) -> None:
        """Use this client (the trace store's, decoded responses)."""
        self._client = client
        self._write = client.register_script(MEMORY_WRITE)

    def read(self, namespace: str, key: str) -> Entry | None:  # noqa: D102 (the Protocol's)
        raw = self._client.hget(keys.memory_entries(namespace), key)
        return None if raw is None else Entry.model_validate_json(raw)

    def entries(self, namespace: str) -> list[Entry]:  # noqa: D102
        found = self._client.hgetall(keys.memory_entries(namespace))
        return [Entry.model_validate_json(found[k]) for k in sorted(found)]

    def write(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> WriteOutcome:  # noqa: D102
        write.checked(caps)
        ns, key = write.namespace, write.key
        rest = write.entry(0, now_ms()).model_dump_json(exclude={"version"})[1:]
        expected = -1 if write.expected_version is None else write.expected_version
        args: list[str | int] = [key, expected, rest, write.write_id or ""]
        args += [caps.history_depth, caps.max_keys, caps.ttl_of(ns) or 0]
        script_keys = [keys.memory_entries(ns), keys.memory_history(ns, key)]
        script_keys.append(keys.memory_proposals(ns))
        kind, version = self._write(keys=script_keys, args=args)
        if kind == "full":
            raise full_error(ns, caps)
        if kind == "lost":
            return Lost(int(version))
        # Listed apart (another slot on a cluster); a crash before it: listed by the next write.
        self._client.sadd(keys.MEMORY_NAMESPACES, ns)
        return Landed(int(version), duplicate=kind == "dup")

    def remove(self, namespace: str, key: str) -> bool:  # noqa: D102
        pipe = self._client.pipeline()
        pipe.hdel(keys.memory_entries(namespace), key)
        pipe.delete(keys.memory_history(namespace, key))
        return bool(pipe.execute()[0])

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
