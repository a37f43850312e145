"""What the owner check (`fleet.owners`) reads beyond the trace store, for Redis and memory.

The open-trees index (`keys.OPEN_TREES`), whether outbox entries are pending, when a tree
last changed (its event stream's newest entry) and the fleet-wide claim of one check per
interval. `track_tree`, the one write on the hot path, is the store's own. On Redis a tree
that ended is compacted as it leaves the index (`redis_compact.compact_tree`).
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def open_trees(self, limit: int) -> list[str]:
        """Up to `limit` open roots, oldest first."""
        return [str(r) for r in self._client.zrange(keys.OPEN_TREES, 0, limit - 1)]

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
        newest = self._client.xrevrange(keys.events(root_trace_id), count=1)
        return int(str(newest[0][0]).split("-")[0]) if newest else None

    def claim_check(self, owner: str, ttl_ms: int) -> bool:
        """True for exactly one caller per `ttl_ms` across the fleet."""
        return bool(self._client.set(keys.OWNER_CHECK, owner, nx=True, px=ttl_ms))


class MemoryOwnerIndex:
    """The same reads on an in-process store (tests, `--inline`)."""

    def __init__(self, store: MemoryStore) -> None:
        """Read `store`'s own tables."""
        self._store = store
        self._claimed_until_ms = 0

    def open_trees(self, limit: int) -> list[str]:  # noqa: D102
        return self._store.tracked_trees()[:limit]

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
