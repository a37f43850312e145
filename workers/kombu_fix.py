"""Two kombu 5.7 Redis-transport behaviours, patched where kombu defines them.

**A lost broker connection crashed the worker.** When the broker goes away while a worker
holds unacknowledged messages, Celery's consumer first `collect()`s the connection
(dropping its client) and then closes it; closing the channel restores the unacked messages
through that client, which is gone: AttributeError, "Unrecoverable error", and the worker
exits instead of reconnecting (seen here on every Redis restart with work in flight). With
this, the close skips the restore and the worker reconnects (a task finishing on its old
channel skips its ack too). What those messages carried is not lost: their traces' leases
lapse and the sweeper re-enqueues them, and waits that relied on a countdown are kept in
the outbox.

**A redis-py client object per broker command.** `Channel.conn_or_acquire()` builds a new
`redis.Redis` on the channel's connection pool every time it is called without a client:
for every message delivered (the unacked bookkeeping), acked, and every event published.
redis-py 8's constructor fills a case-insensitive dict of ~200 response callbacks, so the
object cost more than the command it sent: 9-16 % of a worker's CPU in an explore of 1000
(`py-spy --gil`). The client holds no connection of its own (each command borrows one
from the pool, which is thread-safe), so one client per pool does the same; a pool kombu
replaces (after fork, on close, on reconnect: a new channel) gets a new client.

**A declaration check per publish that copied or wrapped what it checked.** Every publish
names the entities it needs declared (Celery: the task queue and exchange; events: the
event exchange), and kombu's `maybe_declare` first binds each entity to the channel (a copy
of the unbound event exchange per event) or, with `retry` (every task message), wraps the
check in `Connection.ensure`, and only then looks in the connection's cache of what it
already declared. The cache is looked at first here; kombu clears it whenever the
connection closes or reconnects, so anything not in it takes kombu's own path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kombu.messaging import Producer
from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.redis import QoS

log = logging.getLogger(__name__)

_installed = False


def install() -> None:
    """Patch kombu's Redis transport (idempotent).

    The QoS's `restore_unacked` (on close), `ack` and `reject` (a task that ran across the
    loss finishing on its old channel) then log instead of raising; `conn_or_acquire`
    reuses one client per connection pool; `Producer.maybe_declare` looks in the cache of
    declared entities before anything else.
    """
    global _installed
    if _installed:
        return
    for name in ("restore_unacked", "ack", "reject"):
        setattr(QoS, name, _tolerant(name, getattr(QoS, name)))
    RedisChannel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign]
    Producer.maybe_declare = _cached_first(Producer.maybe_declare)  # type: ignore[method-assign]
    _installed = True


def _tolerant(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except AttributeError:  # the broken connection lost its client before this call
            log.warning(
                "broker connection lost: %s skipped (%d unacknowledged message(s) are left"
                " to the sweeper and the visibility timeout)",
                name,
                len(self._delivered),
            )
            return None

    return call


@contextmanager
def _conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
    """`Channel.conn_or_acquire` as kombu has it, with one client per connection pool."""
    if client:
        yield client
        return
    pool = self.pool  # kombu makes a new one after `_disconnect_pools`
    shared = self.__dict__.get("_fleet_pool_client")
    if shared is None or shared.connection_pool is not pool:
        # Two threads may both build one here: either is a valid client of this pool.
        shared = self._fleet_pool_client = self._create_client()
    yield shared


def _cached_first(maybe_declare: Callable[..., Any]) -> Callable[..., Any]:
    def declare(self: Any, entity: Any, retry: bool = False, **retry_policy: Any) -> Any:
        if entity and entity.can_cache_declaration:
            transport = getattr(self.channel, "connection", None)  # None: channel closed
            if transport is not None and hash(entity) in transport.client.declared_entities:
                return False  # what kombu's own check returns for a declared entity
        return maybe_declare(self, entity, retry, **retry_policy)

    return declare
