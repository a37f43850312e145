"""`fleet a2a`'s tasks and links on Redis (`fleet.storage.a2a_tasks`, keys in `keys/a2a.py`)."""

from __future__ import annotations

import redis

from fleet.storage import keys
from fleet.storage.keys.a2a import A2AKind


class RedisA2ATasks:
    """`fleet.storage.a2a_tasks.A2ATasks` on the fleet's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        """Use `client` (decoded responses)."""
        self.client = client

    def save(self, task_id: str, body: str, at_ms: int, ttl_s: int) -> None:
        recent = keys.a2a_recent()
        with self.client.pipeline(transaction=False) as pipe:
            pipe.set(keys.a2a_task(task_id), body, ex=ttl_s)
            pipe.zadd(recent, {task_id: at_ms})
            pipe.zremrangebyscore(recent, "-inf", at_ms - ttl_s * 1000)
            pipe.zremrangebyrank(recent, 0, -keys.A2A_RECENT_MAX - 1)
            pipe.expire(recent, ttl_s)
            pipe.execute()

    def get(self, task_id: str) -> str | None:
        found = self.client.get(keys.a2a_task(task_id))
        return None if found is None else str(found)

    def delete(self, task_id: str) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(keys.a2a_task(task_id))
            pipe.zrem(keys.a2a_recent(), task_id)
            pipe.execute()

    def recent(self, limit: int) -> list[str]:
        ids = [str(i) for i in self.client.zrevrange(keys.a2a_recent(), 0, max(limit, 1) - 1)]
        if not ids:
            return []
        bodies = self.client.mget([keys.a2a_task(i) for i in ids])
        return [str(b) for b in bodies if b is not None]

    def link(self, kind: A2AKind, a2a_id: str, root: str, ttl_s: int) -> None:
        self.client.set(keys.a2a_link(kind, a2a_id), root, ex=ttl_s)

    def root_of(self, kind: A2AKind, a2a_id: str) -> str | None:
        found = self.client.get(keys.a2a_link(kind, a2a_id))
        return None if found is None else str(found)
