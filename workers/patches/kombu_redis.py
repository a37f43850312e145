"""Five kombu Redis-transport patches, each replacing a kombu function where kombu defines it.

Written and tested against kombu 5.7.0 (Celery 5.7.0, redis-py 8.1.0; pyproject pins
`kombu>=5.7,<5.8`). Each is one switch (`workers.patches.switches`), installed by
`workers.patches.configure` in `INSTALLS` order, and each relies on kombu as follows
(tests/test_celery_patches.py asserts every point on kombu itself):

- `kombu-broker-loss` wraps `kombu.transport.redis.QoS.restore_unacked`, `.ack` and
  `.reject`: upstream, after `Connection.collect()` dropped the channel's client, each
  raises AttributeError (the bug). It also replaces `kombu.message.Message.ack_log_error`
  (upstream: `ack()`, and on an error of `errors` or a BrokenPipeError a CRITICAL "Couldn't
  ack" with its traceback, the BrokenPipeError re-raised) by the same in one line. **Off, a
  worker exits** ("Unrecoverable error") when its Redis broker connection breaks with
  messages unacknowledged, and needs a supervisor to restart it; and an ack after a broker
  restart is a CRITICAL traceback; nothing else changes.
- `kombu-unacked-script` replaces `QoS.append(message, delivery_tag)`: upstream writes
  `ZADD unacked_index {tag: time}` and `HSET unacked {tag: [raw, exchange, routing_key]}`
  in a MULTI pipeline, then `virtual.QoS.append`; the script writes the same entries.
- `kombu-batched-acks` replaces `QoS.ack(delivery_tag)` (upstream: `ZREM` + `HDEL` in a
  pipeline, then `virtual.QoS.ack`) on the event loop's thread (`Hub._loop_thread`, set by
  `Hub.create_loop`), and runs the pending removals before `QoS.restore_unacked`.
- `kombu-pool-client` replaces `Channel.conn_or_acquire(client=None)`: upstream yields a
  new `Channel._create_client()` per call, on the channel's `pool`, and on a closed channel
  (its `connection` None) raises AttributeError; here that is a redis-py ConnectionError,
  which a publish's `ensure` recovers from (a chaos run: the sweeper's publish at a Redis
  restart).
- `kombu-declare-cache` wraps `kombu.messaging.Producer.maybe_declare(entity, retry=False,
  **retry_policy)`: upstream keeps `hash(entity)` in `connection.declared_entities` (the
  channel's `connection.client`) once declared, and returns False for a cached one.

Switched off, a patch's kombu function is back as kombu has it.

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

**A transaction per delivered message.** kombu records each message it delivers in the
unacked hash and index (`QoS.append`: `ZADD` + `HSET` in a `MULTI`/`EXEC` pipeline) and
each ack removes both entries the same way: redis-py's pipeline machinery (the retry
wrapper, four replies to parse, the pipeline object itself) cost more than the commands,
13 % of a worker's CPU in an explore of 1000 (`py-spy --gil`). Both are one small Lua
script each (`APPEND_UNACKED`, `REMOVE_UNACKED`), as atomic as the transaction, writing the
same entries (kombu's restore code reads them unchanged).

**A round trip per ack.** Each ack of a task message removed its two unacked-index
entries with a pipeline of its own (`ZREM` + `HDEL`): with acks_late, one round trip per
task in the event loop's thread, whose acks the pool's threads hand to it
(`Consumer.call_soon_ack`). An ack on the loop's thread now acks in memory at once (the
prefetch window opens as before) and the Redis removals of every ack of that loop turn go
in one script on the next turn (`flush_acks`), before the channel restores anything on
close. A worker that dies in between leaves those entries to the visibility timeout: the
messages come back once, as they would had it died just before acking (at least once; a
fleet run finds its trace ended, and its part counts once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.asynchronous import get_event_loop
from kombu.message import Message
from kombu.messaging import Producer
from kombu.transport import virtual
from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.redis import QoS
from kombu.utils.json import dumps

from fleet.storage.backends.redis.connect import Lua
from workers.patches.switches import Undo, replace

log = logging.getLogger(__name__)


def install_broker_loss() -> list[Undo]:
    """`kombu-broker-loss`: the QoS's restore, ack and reject log a lost client, not raise.

    And an ack that meets the lost connection (any transport) is one line, not kombu's
    CRITICAL "Couldn't ack" with its traceback (`_ack_logged`).
    """
    names = ("restore_unacked", "ack", "reject")
    undos = [replace(QoS, name, _tolerant(name, getattr(QoS, name))) for name in names]
    return [*undos, replace(Message, "ack_log_error", _ack_logged)]


def _ack_logged(self: Any, logger: Any, errors: Any, multiple: bool = False) -> None:
    """`Message.ack_log_error` in one line (kombu: CRITICAL and its traceback).

    As kombu, a BrokenPipeError is raised again after the line. The message is not lost:
    the broker delivers it again (RabbitMQ at once, Redis after its visibility timeout) and
    its run finds its trace as the first run left it.
    """
    caught: tuple[type[BaseException], ...] = (BrokenPipeError, *_as_tuple(errors))
    try:
        self.ack(multiple=multiple)
    except caught as exc:
        logger.warning(
            "broker connection lost: ack of %r skipped (%s: %s); the broker delivers the"
            " message again",
            self.delivery_tag,
            type(exc).__name__,
            " ".join(str(exc).split())[:200],
        )
        if isinstance(exc, BrokenPipeError):
            raise


def _as_tuple(errors: Any) -> tuple[type[BaseException], ...]:
    return tuple(errors) if isinstance(errors, (tuple, list)) else (errors,)


def install_unacked_script() -> list[Undo]:
    """`kombu-unacked-script`: `QoS.append` in one script instead of MULTI/EXEC."""
    return [replace(QoS, "append", _scripted_append(QoS.append))]


def install_batched_acks() -> list[Undo]:
    """`kombu-batched-acks`: acks on the loop's thread written once per loop turn."""
    return [
        replace(QoS, "ack", _batched(QoS.ack)),
        replace(QoS, "restore_unacked", _flushed_first(QoS.restore_unacked)),
    ]


def install_pool_client() -> list[Undo]:
    """`kombu-pool-client`: `Channel.conn_or_acquire` reuses one client per pool."""
    return [replace(RedisChannel, "conn_or_acquire", _conn_or_acquire)]


def install_declare_cache() -> list[Undo]:
    """`kombu-declare-cache`: `Producer.maybe_declare` looks in the cache first."""
    return [replace(Producer, "maybe_declare", _cached_first(Producer.maybe_declare))]


INSTALLS = {
    "kombu-unacked-script": install_unacked_script,
    "kombu-batched-acks": install_batched_acks,
    "kombu-broker-loss": install_broker_loss,
    "kombu-pool-client": install_pool_client,
    "kombu-declare-cache": install_declare_cache,
}
"""In kombu's install order: the broker-loss wrapper goes around the batched ack."""


class ChannelClosed(redis.exceptions.ConnectionError):
    """A broker command on a channel kombu closed: a connection error `ensure` recovers."""


def _tolerant(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (AttributeError, ChannelClosed):  # the broken connection lost its client
            log.warning(
                "broker connection lost: %s skipped (%d unacknowledged message(s) are left"
                " to the sweeper and the visibility timeout)",
                name,
                len(self._delivered),
            )
            return None

    return call


APPEND_UNACKED = Lua(
    "redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])\nredis.call('HSET', KEYS[2], ARGV[1], ARGV[3])"
)
"""KEYS: unacked index, unacked hash. ARGV: delivery tag, delivered at (s), `[raw, ex, rk]`."""

REMOVE_UNACKED = Lua(
    "redis.call('ZREM', KEYS[1], unpack(ARGV))\nredis.call('HDEL', KEYS[2], unpack(ARGV))"
)
"""KEYS: unacked index, unacked hash. ARGV: delivery tags (at most a loop turn's acks)."""


def _scripted_append(append: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, message: Any, delivery_tag: str) -> None:
        """`QoS.append` as kombu has it (the same entries), in one script instead of MULTI.

        With a `global_keyprefix` kombu's own (its prefixed client prefixes only the first
        key of an EVALSHA).
        """
        if self.channel.global_keyprefix:
            return append(self, message, delivery_tag)  # type: ignore[no-any-return]
        delivery = message.delivery_info
        payload = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.channel.conn_or_acquire() as client:
            script_keys = [self.unacked_index_key, self.unacked_key]
            APPEND_UNACKED(client, script_keys, [delivery_tag, repr(time.time()), payload])
        virtual.QoS.append(self, message, delivery_tag)
        return None

    return call


PENDING_ACKS = "_fleet_pending_acks"
"""The QoS attribute listing the delivery tags acked in memory, not yet in Redis."""


def _batched(ack: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, delivery_tag: str) -> Any:
        loop = get_event_loop()
        if loop is None or threading.get_ident() != getattr(loop, "_loop_thread", None):
            return ack(self, delivery_tag)  # off the loop: as kombu does, at once
        pending: list[str] = self.__dict__.setdefault(PENDING_ACKS, [])
        if not pending:
            loop.call_soon(flush_acks, self)
        pending.append(delivery_tag)
        return virtual.QoS.ack(self, delivery_tag)

    return call


def flush_acks(qos: Any) -> None:
    """Remove the acked messages' unacked-index entries, in one script.

    Redis unreachable: the entries stay, and the visibility timeout brings those messages
    back (logged), as an ack that failed would have.
    """
    tags: list[str] = qos.__dict__.pop(PENDING_ACKS, None) or []
    if not tags:
        return
    try:
        if qos.channel.global_keyprefix:  # kombu's prefixed pipeline (see `_scripted_append`)
            with qos.pipe_or_acquire() as pipe:
                pipe.zrem(qos.unacked_index_key, *tags).hdel(qos.unacked_key, *tags).execute()
            return
        with qos.channel.conn_or_acquire() as client:
            REMOVE_UNACKED(client, [qos.unacked_index_key, qos.unacked_key], tags)
    except (redis.RedisError, AttributeError, OSError) as exc:  # AttributeError: client gone
        log.warning(
            "%d ack(s) not written to the broker (%s): the visibility timeout redelivers"
            " those messages",
            len(tags),
            exc,
        )


def _flushed_first(restore_unacked: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        flush_acks(self)
        return restore_unacked(self, *args, **kwargs)

    return call


@contextmanager
def _conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
    """`Channel.conn_or_acquire` as kombu has it, with one client per connection pool."""
    if client:
        yield client
        return
    if self.connection is None:  # closed (its broker lost): kombu's `ensure` reconnects
        raise ChannelClosed("the broker channel is closed")
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
