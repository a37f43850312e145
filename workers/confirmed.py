"""Producers whose publishes RabbitMQ confirms: for the sends that heal a tree (issue 38).

RabbitMQ keeps a just-published persistent message in memory for a while; a node killed
then (SIGKILL, power loss) loses it and the sender, told nothing, counts it as sent. The
fleet heals a lost first send (the sweeper, the outbox, the owner check re-send the run);
a lost re-send left trees stuck for good (the chaos run's `rabbitmq-node` rounds). With
publisher confirms (`confirm_publish`) a publish returns once the node has the message on
disk, and one it never confirms raises: the caller's own fallback (outbox, next check)
applies.

A confirmed send waits for the node's disk (bench/confirm_bench.py: ~7 ms against ~1 ms
per send), so only recovered runs take this path; a tree's spawns, many at once and
healed when lost, go unconfirmed. Redis brokers have no confirms: nothing changes there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery
from kombu import pools
from kombu.messaging import Producer

from workers.app import is_amqp

CONFIRMING = {"confirm_publish": True}
"""kombu's transport option: every channel of the connection in confirm mode."""

CONFIRM_TIMEOUT_S = 10.0
"""A publish not confirmed this long raises (a dead connection that no FIN announced): kombu
reconnects and publishes again, as for any connection error; a run sent twice is harmless
(the copy finds its trace running or ended)."""

_pools: WeakKeyDictionary[Celery, tuple[int, Any]] = WeakKeyDictionary()
"""Each app's pool and the process that made it: a forked child makes its own."""
_lock = threading.Lock()


def _producer_pool(app: Celery) -> Any:
    """`app`'s pool of confirming producers (kombu's pools, apart from the app's own)."""
    with _lock:
        pid, pool = _pools.get(app, (None, None))
        if pool is None or pid != os.getpid():
            connection = app.connection_for_write(transport_options=CONFIRMING)
            pool = pools.producers[connection]
            pool.limit = app.pool.limit
            _pools[app] = (os.getpid(), pool)
        return pool


@contextmanager
def producer(app: Celery) -> Iterator[Producer | None]:
    """A confirming producer of `app` on RabbitMQ; None (the app's own) on other brokers."""
    if not is_amqp(app.conf.broker_url):
        yield None
        return
    with _producer_pool(app).acquire(block=True) as confirming:
        yield confirming
