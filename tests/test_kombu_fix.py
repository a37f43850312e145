"""workers.patches.kombu_redis: one redis-py client per kombu channel pool, through pool
changes and a Redis restart (a real redis-server)."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.asynchronous import Hub, set_event_loop
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer
from redis.connection import Connection as RedisConnection

from fleetops.redis_server import RedisServer, start_redis_server
from workers import patches
from workers.patches import kombu_redis

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
    patches.configure(())
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
    patches.configure(())
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
    patches.configure(())
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


def deliver(conn: Connection, queue: Queue, count: int) -> list[Any]:
    """`count` messages published and taken unacked (each in the channel's unacked index)."""
    channel = conn.default_channel
    producer = Producer(channel)
    for n in range(count):
        producer.publish(
            {"n": n}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue]
        )
    messages = [queue(channel).get(no_ack=False) for _ in range(count)]
    assert all(m is not None for m in messages)
    return messages


def unacked(channel: Any) -> tuple[int, int]:
    with channel.conn_or_acquire() as client:
        return client.zcard(channel.unacked_index_key), client.hlen(channel.unacked_key)


@pytest.fixture
def hub() -> Iterator[Hub]:
    """An event loop as a worker's, this thread its loop thread (as `create_loop` sets)."""
    loop = Hub()
    set_event_loop(loop)
    loop._loop_thread = threading.get_ident()
    yield loop
    set_event_loop(None)
    loop.close()


def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sent: list[int] = []
    send = RedisConnection.send_packed_command

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        return send(self, *args, **kwargs)

    monkeypatch.setattr(RedisConnection, "send_packed_command", counting)
    return sent


def test_a_delivered_message_is_recorded_unacked_as_kombu_records_it(
    server: RedisServer,
) -> None:
    patches.configure(())
    queue = Queue("append", Exchange("append", type="direct"), routing_key="append")
    with Connection(server.url) as conn:
        before = time.time()
        (message,) = deliver(conn, queue, 1)
        channel = conn.default_channel
        with channel.conn_or_acquire() as client:
            tag = message.delivery_tag
            assert before <= client.zscore(channel.unacked_index_key, tag) <= time.time()
            stored = json.loads(client.hget(channel.unacked_key, tag))
        assert stored == [message._raw, "append", "append"], "kombu's own layout"


def test_acks_on_the_loop_thread_reach_redis_in_one_script_on_the_next_turn(
    server: RedisServer, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches.configure(())
    queue = Queue("acks", Exchange("acks", type="direct"), routing_key="acks")
    with Connection(server.url) as conn:
        messages = deliver(conn, queue, 5)
        channel = conn.default_channel
        assert unacked(channel) == (5, 5)
        with channel.conn_or_acquire() as client:
            client.script_load(kombu_redis.REMOVE_UNACKED.source)  # count the acks' trips only
        sent = round_trips(monkeypatch)
        for message in messages:
            message.ack()
        assert sent == [], "acked in memory only, so far"
        assert {m.delivery_tag for m in messages} <= channel.qos._dirty, "acked in memory"
        hub.run_once()  # the loop's next turn
        assert len(sent) == 1, "the five acks' removals in one round trip"
        assert unacked(channel) == (0, 0)


def test_an_ack_off_the_loop_thread_reaches_redis_at_once(server: RedisServer, hub: Hub) -> None:
    patches.configure(())
    queue = Queue("acks-off", Exchange("acks-off", type="direct"), routing_key="acks-off")
    with Connection(server.url) as conn:
        (message,) = deliver(conn, queue, 1)
        worker = threading.Thread(target=message.ack)
        worker.start()
        worker.join()
        assert unacked(conn.default_channel) == (0, 0)


def test_a_restore_writes_the_pending_acks_first_and_restores_only_the_unacked(
    server: RedisServer, hub: Hub
) -> None:
    patches.configure(())
    queue = Queue("acks-close", Exchange("acks-close", type="direct"), routing_key="acks-close")
    with Connection(server.url) as conn:
        done, running = deliver(conn, queue, 2)
        done.ack()  # pending: the loop has not turned
        channel = conn.default_channel
        channel.qos.restore_unacked()  # what closing the channel does
        assert unacked(channel) == (0, 0)
        with channel.conn_or_acquire() as client:
            assert client.llen("acks-close") == 1, "the unacked message is back, the acked not"
        again = queue(channel).get(no_ack=True)
        assert again is not None and again.payload == running.payload


def test_pending_acks_that_cannot_be_written_are_logged_and_left_to_the_visibility_timeout(
    server: RedisServer, hub: Hub, caplog: pytest.LogCaptureFixture
) -> None:
    patches.configure(())
    queue = Queue("acks-lost", Exchange("acks-lost", type="direct"), routing_key="acks-lost")
    with Connection(server.url) as conn:
        (message,) = deliver(conn, queue, 1)
        message.ack()
        channel = conn.default_channel
        server.stop()
        with caplog.at_level("WARNING", logger="workers.patches.kombu_redis"):
            kombu_redis.flush_acks(channel.qos)  # what the loop's next turn runs
        assert "1 ack(s) not written to the broker" in caplog.text
        assert not getattr(channel.qos, kombu_redis.PENDING_ACKS, None)


def test_with_a_global_key_prefix_the_unacked_entries_are_kombus_own_prefixed_keys(
    server: RedisServer, hub: Hub
) -> None:
    patches.configure(())
    queue = Queue("prefixed", Exchange("prefixed", type="direct"), routing_key="prefixed")
    options = {"global_keyprefix": "pre:"}
    with Connection(server.url, transport_options=options) as conn:
        (message,) = deliver(conn, queue, 1)
        with redis.Redis.from_url(server.url) as plain:
            assert plain.hlen("pre:unacked") == 1 and plain.zcard("pre:unacked_index") == 1
            assert plain.hlen("unacked") == 0, "nothing under the unprefixed key"
            message.ack()
            hub.run_once()
            assert plain.hlen("pre:unacked") == 0 and plain.zcard("pre:unacked_index") == 0
