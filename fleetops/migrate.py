"""`fleet migrate`: move traces an earlier version wrote into this version's layout.

Layout 1 (up to wave 2) kept a trace's messages, stats and stop flag in keys of their own
(`fleet:trace:{id}:messages`, `:stats`, `:stop`). Layout 2 keeps them in the trace hash
(`m:{sequence}`, `stats`, `stop`), so one write is one HSET; it does not read layout-1 keys.
Upgrade: stop the old workers, run `fleet migrate`, start the new ones.

Every root of the traces index is also put in the roots index (`fleet.storage.root_index`,
which lists whole trees on `fleet serve`'s front page): roots created before it existed.

Each trace moves in one script (all its parts or none), so an interrupted run leaves every
trace either moved or untouched and running again moves the rest; a message or stats field
the new version already wrote is kept (sequences continue from the hash's `last_sequence`,
which both layouts share). Keys whose trace hash has expired are left to their own TTL.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from fleet.errors import InvalidTraceId
from fleet.ids import check_trace_id, root_of
from fleet.storage import keys

MOVE_TRACE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local moved = 0
local messages = redis.call('HGETALL', KEYS[2])
for i = 1, #messages, 2 do
  moved = moved + redis.call('HSETNX', KEYS[1], 'm:' .. messages[i], messages[i + 1])
end
local old = redis.call('HGETALL', KEYS[3])
if #old > 0 then
  local current = redis.call('HGET', KEYS[1], 'stats')
  local stats = current and cjson.decode(current) or {}
  for i = 1, #old, 2 do stats[old[i]] = (stats[old[i]] or 0) + tonumber(old[i + 1]) end
  redis.call('HSET', KEYS[1], 'stats', cjson.encode(stats))
end
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('HSET', KEYS[1], 'stop', '1') end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return {1, moved}
"""

SCAN_COUNT = 1000


@dataclass
class Migration:
    """What one `fleet migrate` found and did."""

    traces: int = 0
    messages: int = 0
    expired: int = 0
    """Layout-1 keys of a trace whose hash is gone (left to expire)."""
    skipped: int = 0
    """Keys under `fleet:trace:` that are not a trace's layout-1 keys (left alone)."""
    roots: int = 0
    """Roots of the traces index put in the roots index (`fleet.storage.root_index`)."""

    def line(self, dry_run: bool) -> str:
        """One line for the terminal."""
        verb = "would move" if dry_run else "moved"
        text = f"{verb} {self.traces} trace(s) to the current layout ({self.messages} messages)"
        extra = [f"{self.expired} expired" if self.expired else ""]
        extra.append(f"{self.skipped} foreign key(s) left alone" if self.skipped else "")
        indexed = "to index" if dry_run else "indexed"
        extra.append(f"{self.roots} root(s) {indexed}" if self.roots else "")
        notes = ", ".join(e for e in extra if e)
        return f"{text}; {notes}" if notes else text


def legacy_trace_ids(client: redis.Redis) -> tuple[set[str], int]:
    """Ids of traces with a layout-1 key, and how many such keys name no valid trace id."""
    found: set[str] = set()
    skipped = 0
    prefix = f"{keys.PREFIX}:trace:"
    for part in keys.LEGACY_SUFFIXES:
        for key in client.scan_iter(match=f"{prefix}*:{part}", count=SCAN_COUNT):
            trace_id = key.removeprefix(prefix).removesuffix(f":{part}")
            try:
                check_trace_id(trace_id)
            except InvalidTraceId:
                skipped += 1
                continue
            found.add(trace_id)
    return found, skipped


def index_roots(client: redis.Redis, dry_run: bool = False) -> int:
    """Put every root of the traces index in the roots index (created before it existed).

    A root's id is its own root (`fleet.ids.root_of`); its score, its creation time, is
    the traces index's. Roots indexed already are counted again, harmlessly (same score).
    """
    count = 0
    for chunk in _chunks(client.zscan_iter(keys.TRACES, count=SCAN_COUNT)):
        roots = {str(t): ms for t, ms in chunk if _is_root(str(t))}
        if roots and not dry_run:
            client.zadd(keys.ROOTS, roots)
        count += len(roots)
    return count


def _is_root(trace_id: str) -> bool:
    return root_of(trace_id) == trace_id


def _chunks(items: Iterator[Any]) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == SCAN_COUNT:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def migrate(client: redis.Redis, dry_run: bool = False) -> Migration:
    """Move every layout-1 trace on this Redis (`client` decodes responses); index roots."""
    trace_ids, skipped = legacy_trace_ids(client)
    done = Migration(skipped=skipped, roots=index_roots(client, dry_run))
    move = client.register_script(MOVE_TRACE)
    for trace_id in sorted(trace_ids):
        parts = [
            keys.legacy_messages(trace_id),
            keys.legacy_stats(trace_id),
            keys.legacy_stop(trace_id),
        ]
        if dry_run:
            alive = bool(client.exists(keys.trace(trace_id)))
            done.traces += alive
            done.expired += not alive
            done.messages += int(client.hlen(parts[0])) if alive else 0
            continue
        try:
            status, moved = move(keys=[keys.trace(trace_id), *parts])
        except redis.ResponseError:  # not the hashes and string layout 1 wrote
            done.skipped += 1
            continue
        if int(status) < 0:
            done.expired += 1
        else:
            done.traces += 1
            done.messages += int(moved)
    return done
