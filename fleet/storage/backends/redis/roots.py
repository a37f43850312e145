"""The roots index on the fleet's Redis (`fleet.storage.root_index`): one sorted set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from fleet.storage import keys

Cursor = tuple[int, str]
"""(created_at_ms, trace_id): `fleet.storage.root_index.Cursor`."""


class RedisRoots:
    """`keys.ROOTS` on the store's Redis (a key of its own slot on a cluster)."""

    def __init__(self, client: redis.Redis) -> None:
        """Use the store's client (decoded responses)."""
        self._client = client

    def add(self, root_trace_id: str, created_at_ms: int) -> None:
        """Index a root (again: the same score, nothing moves)."""
        self._client.zadd(keys.ROOTS, {root_trace_id: created_at_ms})

    def page(self, limit: int, before: Cursor | None = None) -> list[Cursor]:
        """Up to `limit` roots as (created_at_ms, id), newest first, older than `before`.

        The order is the list's: by creation time, then by id (both descending), as a
        sorted set orders members of one score.
        """
        if before is None:
            found: Any = self._client.zrevrange(keys.ROOTS, 0, limit - 1, withscores=True)
            return [(int(ms), str(r)) for r, ms in found]
        at_ms, last = before
        same_ms = self._client.zrangebyscore(keys.ROOTS, at_ms, at_ms)
        ties = [
            (at_ms, r) for r in sorted((str(r) for r in same_ms if str(r) < last), reverse=True)
        ]
        older: Any = self._client.zrevrangebyscore(
            keys.ROOTS, f"({at_ms}", "-inf", start=0, num=limit, withscores=True
        )
        return [*ties, *((int(ms), str(r)) for r, ms in older)][:limit]

    def drop(self, root_ids: Sequence[str]) -> None:
        """Forget roots whose trace is gone."""
        if root_ids:
            self._client.zrem(keys.ROOTS, *root_ids)
