"""The remote children's watch list on Redis: one sorted set, taken by one Lua script."""

from __future__ import annotations

from typing import Any

import redis

from fleet.storage import keys

_TAKE_DUE = """
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
for _, id in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], id)
end
return due
"""


class RedisRemoteWatch:
    """`fleet.storage.remote_watch.RemoteWatch` on `keys.remote_watch()`."""

    def __init__(self, client: redis.Redis) -> None:
        """Use `client` (decoded responses)."""
        self.client = client
        self._take: Any = client.register_script(_TAKE_DUE)

    def watch(self, trace_id: str, due_ms: int) -> None:
        self.client.zadd(keys.remote_watch(), {trace_id: due_ms})

    def due(self, at_ms: int, limit: int, lease_ms: int) -> list[str]:
        found = self._take(keys=[keys.remote_watch()], args=[at_ms, limit, at_ms + lease_ms])
        return [str(x) for x in found]

    def forget(self, trace_id: str) -> None:
        self.client.zrem(keys.remote_watch(), trace_id)

    def watched(self, trace_id: str) -> bool:
        return self.client.zscore(keys.remote_watch(), trace_id) is not None
