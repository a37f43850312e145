"""The fleet-wide indexes of `RedisStore`: human waits, leases, presence, the outbox, counters.

The fleet-wide half of the store, beside the per-trace half (`store.RedisStore`, which
inherits it): sorted sets of due times that span every tree (human waits, leases and the
running index, the outbox), and the workers' presence. It implements `Leases`, `Outbox`
and the wait index of `StopsAndWaits`; nothing here reads or writes one trace's hash. On a
cluster each index is a key of its own slot (`redis_split`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import redis

from fleet.models import WorkerPresence, now_ms
from fleet.storage import keys
from fleet.storage.backends.redis import lease_scripts as redis_lease_scripts
from fleet.storage.backends.redis import split as redis_split
from fleet.storage.backends.redis.connect import Lua
from fleet.storage.keys import CounterName
from fleet.storage.outage import warn_failed

log = logging.getLogger(__name__)

CONSUMER_TRIM_MS = 60_000
"""A consumer entry dead this long is dropped from its queue's set by the next heartbeat."""


class RedisIndexes:
    """Human waits, leases, presence and the outbox on the store's client."""

    _client: redis.Redis
    _cluster: bool
    _renew_all: Any
    """`RENEW_LEASES` registered on the client, to run inside a pipeline."""
    _acquire = Lua(redis_lease_scripts.ACQUIRE_LEASE)
    _release = Lua(redis_lease_scripts.RELEASE_LEASE)
    _claim_due = Lua(redis_lease_scripts.CLAIM_DUE)

    def track_tree(self, root_trace_id: str) -> None:
        self._client.zadd(keys.OPEN_TREES, {root_trace_id: now_ms()})

    def index_human_wait(self, trace_id: str, deadline_ms: int) -> None:
        self._client.zadd(keys.HUMAN_WAITS, {trace_id: deadline_ms})

    def human_wait_indexed(self, trace_id: str) -> bool:
        return self._client.zscore(keys.HUMAN_WAITS, trace_id) is not None

    def expired_human_waits(self, at_ms: int) -> list[str]:
        return [str(i) for i in self._client.zrangebyscore(keys.HUMAN_WAITS, "-inf", f"({at_ms}")]

    def forget_human_wait(self, trace_id: str) -> bool:
        return self._client.zrem(keys.HUMAN_WAITS, trace_id) == 1

    def acquire_lease(self, trace_id: str, owner: str, ttl_ms: int) -> bool:
        lease, deadline_ms = keys.lease(trace_id), now_ms() + ttl_ms
        running = lease if self._cluster else keys.RUNNING  # a stand-in in its slot
        args: list[str | int] = [owner, ttl_ms, deadline_ms, trace_id, "1" if self._cluster else ""]
        acquired = bool(self._acquire(self._client, [lease, running], args))
        if acquired and self._cluster:
            self._client.zadd(keys.RUNNING, {trace_id: deadline_ms})
        return acquired

    def release_lease(self, trace_id: str, owner: str) -> None:
        lease = keys.lease(trace_id)
        running = lease if self._cluster else keys.RUNNING
        args = [owner, trace_id, "1" if self._cluster else ""]
        if self._release(self._client, [lease, running], args) and self._cluster:
            self._client.zrem(keys.RUNNING, trace_id)

    def expired_leases(self, at_ms: int) -> list[str]:
        return [str(i) for i in self._client.zrangebyscore(keys.RUNNING, "-inf", f"({at_ms}")]

    def forget_running(self, trace_id: str) -> bool:
        return self._client.zrem(keys.RUNNING, trace_id) == 1

    def lease_holder(self, trace_id: str) -> str | None:
        holder = self._client.get(keys.lease(trace_id))
        return None if holder is None else str(holder)

    # -- worker heartbeat, presence, outbox -----------------------------------

    def beat(
        self, leases: Sequence[tuple[str, str]], ttl_ms: int, presence: WorkerPresence | None
    ) -> list[bool]:
        now = now_ms()
        if self._cluster:
            return self._beat_split(leases, ttl_ms, presence, now)
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

    def _beat_split(
        self,
        leases: Sequence[tuple[str, str]],
        ttl_ms: int,
        presence: WorkerPresence | None,
        now: int,
    ) -> list[bool]:
        renewed = redis_split.renew_each(self._client, leases, ttl_ms, now + ttl_ms)
        if presence is not None:
            pipe = self._client.pipeline(transaction=False)
            pipe.set(keys.worker(presence.node), presence.model_dump_json(), px=ttl_ms)
            for queue in presence.queues:
                pipe.zadd(keys.consumers(queue), {presence.node: now + ttl_ms})
                pipe.zremrangebyscore(keys.consumers(queue), "-inf", now - CONSUMER_TRIM_MS)
            pipe.execute()
        return renewed

    def drop_presence(self, presence: WorkerPresence) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(keys.worker(presence.node))
        for queue in presence.queues:
            pipe.zrem(keys.consumers(queue), presence.node)
        pipe.execute()

    def presences(self, nodes: Sequence[str]) -> list[WorkerPresence]:
        if not nodes:
            return []
        names = [keys.worker(n) for n in nodes]
        if self._cluster:  # one key per worker, in as many slots
            found = self._client.mget_nonatomic(names)  # type: ignore[attr-defined]
        else:
            found = self._client.mget(names)
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

    # -- fleet-wide counters ------------------------------------------------------

    def count(self, counter: CounterName, by: int = 1) -> None:
        try:
            self._client.hincrby(keys.COUNTERS, counter, by)
        except redis.RedisError:  # a metric must never fail the work it counts
            warn_failed(log, "fleet counter %r not updated", counter)

    def count_fallback(self, from_model: str, to_model: str) -> None:
        try:
            self._client.hincrby(keys.MODEL_FALLBACKS, json.dumps([from_model, to_model]), 1)
        except redis.RedisError:
            warn_failed(log, "fleet fallback count not updated")
