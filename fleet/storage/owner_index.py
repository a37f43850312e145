"""What the owner check (`fleet.owners`) reads beyond the trace store, for Redis and memory.

The open-trees index (`keys.OPEN_TREES`), whether outbox entries are pending, when a tree
last changed (its event stream's newest entry) and the fleet-wide claim of one check per
interval. `track_tree`, the one write on the hot path, is the store's own. On Redis a tree
that ended is compacted as it leaves the index (`redis_compact.compact_tree`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fleet.models import now_ms
from fleet.storage import keys
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis import compact as redis_compact
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore

COMPACT_PER_CHECK = 5_000
"""Traces one owner check compacts at most (~1-2 s of the sweeper thread per 1,000): a backlog
of ended trees (after an outage) is worked off over several checks, the rest left open."""


class RedisOwnerIndex:
    """The owner check's reads on the fleet's Redis (one instance per check)."""

    def __init__(self, store: RedisStore, retention_s: int = keys.TRACE_TTL_S) -> None:
        """Read through `store`'s client; an ended tree is compacted to live `retention_s`."""
        self._client = store.client
        self._retention_s = retention_s
        self._compact_left = COMPACT_PER_CHECK
        self._last_ms: dict[str, int | None] = {}
        """The newest event of each root of the page being checked."""

    def open_trees(self, limit: int) -> list[str]:
        """Up to `limit` open roots, oldest first."""
        return [str(r) for r in self._client.zrange(keys.OPEN_TREES, 0, limit - 1)]

    def open_tree_pages(self, page_size: int) -> Iterator[list[str]]:
        """Every open root once, a page at a time.

        ZSCAN: a tree in the index from the first page to the last is in one of them,
        however the index changes meanwhile (one it returns twice is given once). Each
        page's newest events are read in one round trip (`last_event_ms` answers from them).
        """
        cursor: int | None = None
        seen: set[str] = set()
        while cursor != 0:
            cursor, found = self._client.zscan(keys.OPEN_TREES, cursor or 0, count=page_size)
            page = [r for r in dict.fromkeys(str(root) for root, _ in found) if r not in seen]
            seen.update(page)
            pipe = self._client.pipeline(transaction=False)
            for root in page:
                pipe.xrevrange(keys.events(root), count=1)
            self._last_ms = {r: _newest_ms(n) for r, n in zip(page, pipe.execute(), strict=True)}
            yield page

    def untrack_tree(self, root_trace_id: str) -> None:
        """The tree ended (or expired): compacted, then no longer checked.

        Compaction first: if it fails halfway, or a write raced it, the tree stays in the index
        and the next check packs what is left; so does a tree this check has no compaction
        budget left for.
        """
        if self._compact_left <= 0:
            return
        done = redis_compact.compact_tree(self._client, root_trace_id, self._retention_s)
        self._compact_left -= max(done.packed, 1)
        if not done.raced:  # else something wrote to it meanwhile: checked (and packed) again
            self._client.zrem(keys.OPEN_TREES, root_trace_id)

    def outbox_has(self, entries: Sequence[str]) -> list[bool]:
        """Whether each entry is pending in the outbox."""
        if not entries:
            return []
        return [s is not None for s in self._client.zmscore(keys.OUTBOX, list(entries))]

    def last_event_ms(self, root_trace_id: str) -> int | None:
        """When the tree last changed (its newest event), None if it has no events."""
        if root_trace_id in self._last_ms:  # read with its page
            return self._last_ms[root_trace_id]
        newest: Any = self._client.xrevrange(keys.events(root_trace_id), count=1)
        return _newest_ms(newest)

    def claim_check(self, owner: str, ttl_ms: int) -> bool:
        """True for exactly one caller per `ttl_ms` across the fleet."""
        return bool(self._client.set(keys.OWNER_CHECK, owner, nx=True, px=ttl_ms))


def _newest_ms(newest: list[Any]) -> int | None:
    """The time of the one entry an `XREVRANGE ... COUNT 1` read, if any."""
    return int(str(newest[0][0]).split("-")[0]) if newest else None


class MemoryOwnerIndex:
    """The same reads on an in-process store (tests, `--inline`)."""

    def __init__(self, store: MemoryStore) -> None:
        """Read `store`'s own tables."""
        self._store = store
        self._claimed_until_ms = 0

    def open_trees(self, limit: int) -> list[str]:  # noqa: D102
        return self._store.tracked_trees()[:limit]

    def open_tree_pages(self, page_size: int) -> Iterator[list[str]]:  # noqa: D102
        roots = self._store.tracked_trees()
        for start in range(0, len(roots), page_size):
            yield roots[start : start + page_size]

    def untrack_tree(self, root_trace_id: str) -> None:  # noqa: D102
        self._store.untrack_tree(root_trace_id)

    def outbox_has(self, entries: Sequence[str]) -> list[bool]:  # noqa: D102
        return self._store.outbox_pending(entries)

    def last_event_ms(self, root_trace_id: str) -> int | None:  # noqa: D102
        events = self._store.read_events(root_trace_id, count=1_000_000)
        return events[-1][1].at_ms if events else None

    def claim_check(self, owner: str, ttl_ms: int) -> bool:  # noqa: D102
        if now_ms() < self._claimed_until_ms:
            return False
        self._claimed_until_ms = now_ms() + ttl_ms
        return True


def owner_index(
    store: TraceStore, retention_s: int = keys.TRACE_TTL_S
) -> RedisOwnerIndex | MemoryOwnerIndex:
    """The owner check's reads for this store (`retention_s`: of a compacted tree, on Redis)."""
    if isinstance(store, RedisStore):
        return RedisOwnerIndex(store, retention_s)
    if isinstance(store, MemoryStore):
        return MemoryOwnerIndex(store)
    raise TypeError(f"no owner index for {type(store).__name__}")
