"""What `fleet a2a` keeps (fleetops.a2a): its A2A tasks and which tree each task is.

a2a-sdk's server keeps each task it serves in a task store, and the fleet's executor
keeps which root trace an A2A task and an A2A context are. Both live in the fleet's
Redis (`store.capability(A2A_TASKS)`), so a restarted `fleet a2a`, or a second one on the
same fleet, still answers GetTask and CancelTask for a task an earlier one took. Each
entry lives the fleet's retention from its last write (`Settings.retention_s`). Bodies are
a2a-sdk's JSON, opaque here (storage imports no a2a-sdk).
"""

from __future__ import annotations

from typing import Protocol

import redis

from fleet.storage.backends.memory.a2a_tasks import MemoryA2ATasks
from fleet.storage.backends.redis.a2a_tasks import RedisA2ATasks
from fleet.storage.capability import Capability
from fleet.storage.keys.a2a import A2AKind


class A2ATasks(Protocol):
    """A2A tasks by id, and the root trace each task and context is."""

    def save(self, task_id: str, body: str, at_ms: int, ttl_s: int) -> None:
        """Keep `body` as task `task_id` (saved at `at_ms`) for `ttl_s`."""
        ...

    def get(self, task_id: str) -> str | None:
        """The task's body, or None (never saved, or past the retention)."""
        ...

    def delete(self, task_id: str) -> None:
        """Forget the task's body."""
        ...

    def recent(self, limit: int) -> list[str]:
        """The bodies of at most `limit` tasks, the last saved first."""
        ...

    def link(self, kind: A2AKind, a2a_id: str, root: str, ttl_s: int) -> None:
        """The task or context `a2a_id` is the tree `root` (for `ttl_s`)."""
        ...

    def root_of(self, kind: A2AKind, a2a_id: str) -> str | None:
        """The root trace id of a task or context, or None."""
        ...


def _on_redis(client: redis.Redis) -> A2ATasks:
    return RedisA2ATasks(client)


A2A_TASKS: Capability[A2ATasks] = Capability("a2a_tasks", _on_redis, MemoryA2ATasks)
"""`fleet a2a`'s tasks and links (`store.capability(A2A_TASKS)`)."""
