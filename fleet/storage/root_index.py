"""The roots index: every root trace by creation time, for lists of whole trees.

`fleet serve`'s front page lists trees (`GET /api/traces?roots=1`). Read from the traces
index, roots were found only among the newest 2,000 traces, branches included: after a tree
of more branches than that, every older root was off the page. This index holds roots alone
(`keys.ROOTS`), so a page of trees is a page of the index, from any cursor.

Written by `fleet.conversation.roots.create_root` once its root is stored (a crash between
leaves that root off the list; `fleet trace show` still reads it by id). An entry whose trace
has expired is dropped by the reader that finds it gone (`drop`). Roots created before the
index existed are not in it: `fleet migrate` indexes them.

`ROOTS` is the capability: `store.capability(ROOTS)` gives the Redis index
(`fleet.storage.backends.redis.roots`) or its memory twin (`...backends.memory.roots`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import redis

from fleet.storage.backends.memory.roots import MemoryRoots
from fleet.storage.backends.redis.roots import RedisRoots
from fleet.storage.capability import Capability

Cursor = tuple[int, str]
"""(created_at_ms, trace_id) of the last root of a page: the next page is strictly older."""


class Roots(Protocol):
    """Every root trace by creation time, newest first."""

    def add(self, root_trace_id: str, created_at_ms: int) -> None:
        """Index a root (again: the same score, nothing moves)."""
        ...

    def page(self, limit: int, before: Cursor | None = None) -> list[Cursor]:
        """Up to `limit` roots as (created_at_ms, id), newest first, older than `before`.

        The order is the list's: by creation time, then by id (both descending).
        """
        ...

    def drop(self, root_ids: Sequence[str]) -> None:
        """Forget roots whose trace is gone."""
        ...


def _on_redis(client: redis.Redis) -> Roots:
    return RedisRoots(client)


ROOTS: Capability[Roots] = Capability("roots", _on_redis, MemoryRoots)
"""The roots index of a store (`store.capability(ROOTS)`)."""
