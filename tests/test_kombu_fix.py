"""workers.kombu_fix: one redis-py client per kombu channel pool, through pool changes and a
Redis restart (a real redis-server)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer

from fleet.redis_server import RedisServer, start_redis_server
from workers import kombu_fix

pytestmark = pytest.mark.integration


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test's own (it gets restarted), persisted as a broker is."""
    data_dir = Path(tempfile.mkdtemp(prefix="kombu-fix-"))
    try:
        with start_redis_server(data_dir=data_dir, appendonly=True) as own:
            yield own
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def client_of(channel: Any) -> Any:
    with channel.conn_or_acquire() as client:
        return client


def test_a_channel_reuses_one_client_per_pool_and_follows_a_new_pool(
    server: RedisServer,
) -> None:
    kombu_fix.install()
    with Connection(server.url) as conn:
        channel = conn.default_channel
        first = client_of(channel)
        seen: list[Any] = []
        threads = [
            threading.Thread(target=lambda: seen.append(client_of(channel))) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(c is first for c in seen)
        assert first.connection_pool is channel.pool
        given = object()
        with channel.conn_or_acquire(given) as passed:
            assert passed is given
        channel._disconnect_pools()  # what kombu does after fork and on close
        second = client_of(channel)
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()


def test_publish_consume_and_ack_keep_working_across_a_redis_restart(
    server: RedisServer,
) -> None:
    kombu_fix.install()
    queue = Queue("kombu-fix", Exchange("kombu-fix", type="direct"), routing_key="kombu-fix")
    events = Exchange("celeryev", type="topic")
    with Connection(server.url, transport_options={"max_retries": 3}) as conn:

        def round_trip(n: int) -> None:
            channel = conn.default_channel
            producer = Producer(channel)
            producer.publish(
                {"n": n},
                exchange=queue.exchange,
                routing_key="kombu-fix",
                declare=[queue],
                retry=True,
            )
            producer.publish(
                {"type": "task-sent"},
                exchange=events,
                routing_key="task.sent",
                declare=[events],
                retry=True,
            )  # fanout: PUBLISH via the client
            message = queue(channel).get(no_ack=False)
            assert message is not None and message.payload == {"n": n}
            message.ack()  # the unacked bookkeeping goes through conn_or_acquire
            with channel.conn_or_acquire() as client:
                assert client.hlen(channel.unacked_key) == 0

        round_trip(1)
        port, data_dir = server.port, server.data_dir
        server.stop()
        with start_redis_server(port, data_dir, appendonly=True):
            round_trip(2)


def test_a_declared_entity_is_not_declared_again_until_the_connection_is_renewed(
    server: RedisServer,
) -> None:
    kombu_fix.install()
    queue = Queue("kombu-fix", Exchange("kombu-fix", type="direct"), routing_key="kombu-fix")
    binding = "_kombu.binding.kombu-fix"
    with Connection(server.url) as conn:
        producer = Producer(conn.default_channel)
        assert producer.maybe_declare(queue, retry=True) is True
        with conn.default_channel.conn_or_acquire() as client:
            assert client.exists(binding)
            client.flushall()  # the broker lost its data: the cache does not know yet
            assert producer.maybe_declare(queue, retry=True) is False
            assert producer.maybe_declare(queue) is False
            assert not client.exists(binding)
        conn.close()  # a reconnect clears kombu's cache of declared entities
        conn.connect()
        producer = Producer(conn.default_channel)
        assert producer.maybe_declare(queue, retry=True) is True
        with conn.default_channel.conn_or_acquire() as client:
            assert client.exists(binding)
