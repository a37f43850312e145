"""The remote children a poller watches: which A2A tasks to ask about, and when.

A remote child (`fleet.remote`) parked on its A2A task holds no worker slot; its entry
here is its owner (`fleet.owners`). Every worker's watcher takes the entries that are due
(`due`: taking one re-scores it one lease later, so two watchers never follow the same
task at once, and an entry whose watcher died is due again after that lease), follows
the remote task (a stream window or one GetTask), and either re-scores the entry for the
next follow (also while a person is asked the task's question: a stop then still cancels
it) or forgets it once the task or the child ended. `store.capability(REMOTE_WATCH)` gives
the Redis list or its memory twin.
"""

from __future__ import annotations

from typing import Protocol

import redis

from fleet.storage.backends.memory.remote_watch import MemoryRemoteWatch
from fleet.storage.backends.redis.remote_watch import RedisRemoteWatch
from fleet.storage.capability import Capability


class RemoteWatch(Protocol):
    """The parked remote children, each with the instant it is next polled."""

    def watch(self, trace_id: str, due_ms: int) -> None:
        """Poll `trace_id`'s remote task at `due_ms` (added, or moved)."""
        ...

    def due(self, at_ms: int, limit: int, lease_ms: int) -> list[str]:
        """Take at most `limit` entries due at `at_ms`; each is due again at `at_ms + lease_ms`."""
        ...

    def forget(self, trace_id: str) -> None:
        """No more polls of `trace_id`."""
        ...

    def watched(self, trace_id: str) -> bool:
        """Whether `trace_id` has an entry."""
        ...


def _on_redis(client: redis.Redis) -> RemoteWatch:
    return RedisRemoteWatch(client)


REMOTE_WATCH: Capability[RemoteWatch] = Capability("remote_watch", _on_redis, MemoryRemoteWatch)
"""The store's list of parked remote children (`store.capability(REMOTE_WATCH)`)."""
