"""Each tree's search count on Redis (`fleet.limits.searches`)."""

from __future__ import annotations

import redis

from fleet.storage import keys

_TAKE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return -1 end
redis.call('SET', KEYS[1], used + 1, 'EX', ARGV[2])
return used + 1
"""


class RedisSearchCounter:
    """The fleet-wide counter: one script call per search, atomic across workers."""

    def __init__(self, client: redis.Redis) -> None:
        """Register the script on this client."""
        self._take = client.register_script(_TAKE)

    def take(self, root_trace_id: str, limit: int) -> int | None:
        """See `SearchCounter.take`."""
        number = int(
            self._take(keys=[keys.searches(root_trace_id)], args=[limit, keys.TRACE_TTL_S])
        )
        return None if number < 0 else number
