"""The Redis store's worker tables: heartbeats, presence, and the outbox.

`RedisStore` takes these from here (a mixin on its client and scripts), so the store's
module keeps the traces; keys are in `fleet.storage.keys`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from fleet.models import WorkerPresence, now_ms
from fleet.storage import keys
from fleet.storage.redis_connect import Lua

CONSUMER_TRIM_MS = 60_000
"""A consumer entry dead this long is dropped from its queue's set by the next heartbeat."""


class RedisWorkerTables:
    """Leases renewed in one beat, who consumes which queue, work due to the queue."""

    _client: redis.Redis
    _renew_all: Any
    """`redis_scripts.RENEW_LEASES`, registered for use in a pipeline."""
    _claim_due: Lua

    def beat(
        self, leases: Sequence[tuple[str, str]], ttl_ms: int, presence: WorkerPresence | None
    ) -> list[bool]:
        now = now_ms()
        pipe = self._client.pipeline(transaction=False)
        if leases:
            lease_keys = [keys.lease(trace_id) for trace_id, _ in leases]
            args: list[str | int] = [ttl_ms, now + ttl_ms]
            args += [item for trace_id, owner in leases for item in (owner, trace_id)]
            self._renew_all(keys=[keys.RUNNING, *lease_keys], args=args, client=pipe)
        if presence is not None:
            pipe.set(keys.worker(presence.node), presence.model_dump_json(), px=ttl_ms)
            for queue in presence.queues:
                pipe.zadd(keys.consumers(queue), {presence.node: now + ttl_ms})
                pipe.zremrangebyscore(keys.consumers(queue), "-inf", now - CONSUMER_TRIM_MS)
        replies = pipe.execute()
        return [bool(r) for r in replies[0]] if leases else []

    def drop_presence(self, presence: WorkerPresence) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(keys.worker(presence.node))
        for queue in presence.queues:
            pipe.zrem(keys.consumers(queue), presence.node)
        pipe.execute()

    def presences(self, nodes: Sequence[str]) -> list[WorkerPresence]:
        if not nodes:
            return []
        found = self._client.mget([keys.worker(n) for n in nodes])
        return [WorkerPresence.model_validate_json(raw) for raw in found if raw is not None]

    def live_consumers(self, queue: str) -> list[str]:
        return [str(n) for n in self._client.zrangebyscore(keys.consumers(queue), now_ms(), "+inf")]

    def outbox_put(self, entry: str, due_ms: int) -> None:
        self._client.zadd(keys.OUTBOX, {entry: due_ms})

    def outbox_done(self, entry: str) -> None:
        self._client.zrem(keys.OUTBOX, entry)

    def outbox_claim(self, at_ms: int, retry_ms: int, limit: int = 100) -> list[str]:
        due = self._claim_due(self._client, [keys.OUTBOX], [at_ms, at_ms + retry_ms, limit])
        return [str(m) for m in due]
