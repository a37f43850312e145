"""The roots index: every root trace by creation time, for lists of whole trees.

`fleet serve`'s front page lists trees (`GET /api/traces?roots=1`). Read from the traces
index, roots were found only among the newest 2,000 traces, branches included: after a tree
of more branches than that, every older root was off the page. This index holds roots alone
(`keys.ROOTS`), so a page of trees is a page of the index, from any cursor.

Written by `fleet.conversation.roots.create_root` once its root is stored (a crash between
leaves that root off the list; `fleet trace show` still reads it by id). An entry whose trace
has expired is dropped by the reader that finds it gone (`drop`). Roots created before the
index existed are not in it: `fleet migrate` indexes them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import redis

from fleet.storage import keys
from fleet.storage.capability import Capability

Cursor = tuple[int, str]
"""(created_at_ms, trace_id) of the last root of a page: the next page is strictly older."""


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


class MemoryRoots:
    """The same index in this process (an in-process fleet, tests)."""

    def __init__(self) -> None:
        """Empty."""
        self._scores: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, root_trace_id: str, created_at_ms: int) -> None:  # noqa: D102
        with self._lock:
            self._scores[root_trace_id] = created_at_ms

    def page(self, limit: int, before: Cursor | None = None) -> list[Cursor]:  # noqa: D102
        with self._lock:
            order = sorted(((ms, r) for r, ms in self._scores.items()), reverse=True)
        return [(ms, r) for ms, r in order if before is None or (ms, r) < before][:limit]

    def drop(self, root_ids: Sequence[str]) -> None:  # noqa: D102
        with self._lock:
            for root in root_ids:
                self._scores.pop(root, None)


ROOTS: Capability[RedisRoots | MemoryRoots] = Capability("roots", RedisRoots, MemoryRoots)
"""The roots index of a store (`store.capability(ROOTS)`)."""
