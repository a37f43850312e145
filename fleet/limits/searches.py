"""Each tree's search budget: how many `web_search` calls its agents may make together.

One counter per root (`keys.searches`), taken before the provider is asked: a tree cannot
make more calls than `search.max_searches_per_tree` whatever its branches do at once.
"""

from __future__ import annotations

import threading
from typing import Protocol

import redis

from fleet.storage import keys


class SearchCounter(Protocol):
    """Takes one search from a tree's budget."""

    def take(self, root_trace_id: str, limit: int) -> int | None:
        """The number of this search (1, 2, ...), or None when the tree has used `limit`."""
        ...


class MemorySearchCounter:
    """The counter of one process (the in-memory store's twin)."""

    def __init__(self) -> None:
        """Start with no tree counted."""
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, root_trace_id: str, limit: int) -> int | None:
        """See `SearchCounter.take`."""
        with self._lock:
            used = self._used.get(root_trace_id, 0)
            if used >= limit:
                return None
            self._used[root_trace_id] = used + 1
            return used + 1


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
