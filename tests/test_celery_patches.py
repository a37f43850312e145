"""What each patch in `workers/patches/` relies on, asserted on Celery and kombu themselves.

Each test reads the upstream object with the patch switched off (`upstream`), so an upgrade
of Celery or kombu that changes a behaviour a patch fixes or assumes fails here, named
after the patch, before it misbehaves in a worker. The patched results have their own
tests (test_kombu_fix.py, test_chord_join.py, test_dispatch_publish.py,
test_worker_events.py).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app import trace as celery_trace
from celery.app.amqp import AMQP
from celery.backends.asynchronous import AsyncBackendMixin
from celery.backends.base import BaseBackend
from celery.backends.redis import RedisBackend
from celery.events.dispatcher import EventDispatcher
from celery.utils.saferepr import saferepr
from kombu.asynchronous import Hub
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer
from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.redis import QoS

from workers import patches
from workers.patches import header_messages


@pytest.fixture
def upstream() -> Iterator[None]:
    """Every patch off in this process (Celery and kombu as shipped), all on again after."""
    patches.configure(["all"])
    try:
        yield
    finally:
        patches.configure(())


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def memory_app() -> Celery:
    return Celery("patches", broker="memory://", set_as_current=False)


# header-template: Producer._publish's positional arguments, the batch's thread-local.


def test_header_template_producer_publish_takes_the_15_arguments_in_order() -> None:
    expected = [
        "self",
        "body",
        "priority",
        "content_type",
        "content_encoding",
        "headers",
        "properties",
        "routing_key",
        "mandatory",
        "immediate",
        "exchange",
        "declare",
        "timeout",
        "confirm_timeout",
        "retry",
        "retry_policy",
    ]
    assert parameters(Producer._publish) == expected
    assert len(expected) - 1 == header_messages._PUBLISH_ARGS


def test_header_template_publish_calls_private_publish_once_positionally(upstream: None) -> None:
    with Connection("memory://") as conn:
        producer = Producer(conn.default_channel)
        calls: list[tuple[Any, ...]] = []
        original = producer._publish

        def keep(*args: Any, **kwargs: Any) -> Any:
            calls.append(args)
            return original(*args, **kwargs)

        producer._publish = keep  # type: ignore[method-assign]
        producer.publish({"n": 1}, routing_key="q", headers={"id": "x"}, retry=True)
    (args,) = calls
    assert len(args) == header_messages._PUBLISH_ARGS
    assert args[header_messages._HEADERS]["id"] == "x"
    assert args[header_messages._ROUTING_KEY] == "q" and args[header_messages._RETRY] is True


def test_header_template_a_batch_sets_the_producers_thread_local() -> None:
    with Connection("memory://") as conn:
        producer = Producer(conn.default_channel)
        assert getattr(producer._batch_local, "current", None) is None
        with producer.batch(4):
            assert getattr(producer._batch_local, "current", None) is not None
    assert parameters(Connection.ensure)[:3] == ["self", "obj", "fun"]


def test_header_template_send_task_publishes_its_task_sent_event_through_the_dispatcher(
    upstream: None,
) -> None:
    app = memory_app()
    app.conf.task_send_sent_event = True
    dispatcher = app.amqp._event_dispatcher
    seen: list[tuple[str, dict[str, Any]]] = []
    dispatcher.publish = lambda type, fields, producer, **kw: seen.append((type, fields))
    app.send_task("t", args=(1,), task_id="tid", argsrepr="shown")
    ((kind, fields),) = seen
    assert kind == "task-sent" and fields["uuid"] == "tid" and fields["args"] == "shown"
    expected = {"root_id", "parent_id", "name", "kwargs", "retries", "eta", "expires", "queue"}
    assert expected <= set(fields)


# chord-send: the backend's chord hooks and send_task's chord arguments.


def test_chord_send_backend_hooks_and_send_task_arguments() -> None:
    assert parameters(RedisBackend.apply_chord) == ["self", "header_result_args", "body", "kwargs"]
    assert parameters(RedisBackend.set_chord_size) == ["self", "group_id", "chord_size"]
    assert {"group_id", "group_index", "chord", "add_to_parent"} <= set(
        parameters(Celery.send_task)
    )


# fleet-join: every header part reported, ignore_result or not; Celery's key and error paths.


class RecordingBackend(BaseBackend):  # type: ignore[misc]
    def __init__(self, app: Celery) -> None:
        super().__init__(app)
        self.parts: list[tuple[str, Any]] = []
        self.stored: list[str] = []

    def _store_result(self, task_id: str, *args: Any, **kwargs: Any) -> None:
        self.stored.append(task_id)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kw: Any) -> None:
        self.parts.append((state, result))


def test_fleet_join_a_header_that_ignores_its_result_still_reports_its_part() -> None:
    app = memory_app()
    backend = RecordingBackend(app)
    request = type("Request", (), {"chord": {"task": "body"}, "ignore_result": True})()
    backend.mark_as_done("tid", {"trace_id": "t"}, request=request)
    assert backend.parts == [("SUCCESS", {"trace_id": "t"})] and backend.stored == []
    backend.mark_as_failure("tid2", ValueError("x"), request=request, call_errbacks=False)
    assert [state for state, _ in backend.parts] == ["SUCCESS", "FAILURE"]


def test_fleet_join_the_backend_names_group_keys_and_runs_errbacks_as_assumed() -> None:
    app = memory_app()
    backend = RedisBackend(app=app, url="redis://127.0.0.1:1/0")  # builds no connection
    assert backend.get_key_for_group("g", ".fj") == b"celery-taskset-meta-g.fj"
    assert parameters(BaseBackend.chord_error_from_stack) == ["self", "callback", "exc"]
    assert parameters(AMQP._retry_publish) == ["self", "publish", "args", "kwargs"]
    # Celery 5.7 keeps a chord's size in a `.s` key, not in the body's options.
    assert "chord_size" not in inspect.getsource(Celery.send_task)


# send-only-results and fleet-join: `FleetCelery._get_backend` redoes Celery's three lines.


def test_the_backend_is_built_by_celerys_get_backend_as_the_fleet_app_redoes_it() -> None:
    body = inspect.getsource(Celery._get_backend)
    assert "backends.by_url(" in body and "self.backend_cls or self.conf.result_backend" in body
    assert "return backend(app=self, url=url)" in body
    assert "_get_backend" in inspect.getsource(type(memory_app()).backend.fget)


# send-only-results: registering a pending result subscribes to its channel.


@pytest.mark.integration
def test_send_only_results_a_pending_result_subscribes_to_its_channel(redis_url: str) -> None:
    assert parameters(AsyncBackendMixin.add_pending_result) == [
        "self",
        "result",
        "weak",
        "start_drainer",
    ]
    app = memory_app()
    backend = RedisBackend(app=app, url=redis_url)
    channel = backend.get_key_for_task("patch-tid").decode()
    result = app.AsyncResult("patch-tid", backend=backend)
    backend.add_pending_result(result)
    try:
        assert backend.client.pubsub_numsub(channel) == [(channel.encode(), 1)]
    finally:
        backend.remove_pending_result(result)
        result.backend = None  # its __del__ would unsubscribe again, maybe from a dead server
        backend.result_consumer.stop()
        backend.client.close()


# event-batching and event-repr: the dispatcher's buffer and the tracer's shown result.


def test_event_batching_the_dispatcher_has_the_buffer_it_extends() -> None:
    init = parameters(EventDispatcher.__init__)
    assert {"buffer_group", "buffer_limit", "on_send_buffered"} <= set(init)
    assert inspect.signature(EventDispatcher.__init__).parameters["buffer_limit"].default == 24
    assert parameters(EventDispatcher.flush) == ["self", "errors", "groups"]
    assert parameters(EventDispatcher._prepare_event)[:4] == ["self", "type", "fields", "blind"]
    assert parameters(EventDispatcher._publish)[:4] == ["self", "event", "producer", "routing_key"]
    assert parameters(EventDispatcher.publish)[:4] == ["self", "type", "fields", "producer"]
    dispatcher = EventDispatcher(app=memory_app(), enabled=False)
    assert dispatcher._group_buffer == {} and hasattr(dispatcher, "mutex")


def test_event_repr_the_tracer_renders_a_success_with_its_module_level_saferepr(
    upstream: None,
) -> None:
    assert celery_trace.saferepr is saferepr
    assert "Rstr = saferepr(R, resultrepr_maxsize)" in inspect.getsource(celery_trace)


# kombu-*: the Redis transport as kombu 5.7 ships it (a real Redis).


def deliver_one(conn: Connection, name: str) -> Any:
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    Producer(conn.default_channel).publish(
        {"n": 1}, exchange=queue.exchange, routing_key=name, declare=[queue]
    )
    message = queue(conn.default_channel).get(no_ack=False)
    assert message is not None
    return message


def unacked(channel: Any, tag: str) -> tuple[bool, bool]:
    """Whether `tag` is in the unacked index and hash (shared by every channel on this Redis)."""
    with channel.conn_or_acquire() as client:
        index = client.zscore(channel.unacked_index_key, tag) is not None
        return index, bool(client.hexists(channel.unacked_key, tag))


def collected_channel(redis_url: str) -> tuple[Any, Any]:
    """A channel holding an unacked message whose connection was collected, pools dropped.

    What Celery's consumer leaves when the broker goes away (`Connection.collect()`: the
    channel's `connection` is None) once kombu drops the channel's pools (close, fork).
    """
    conn = Connection(redis_url)
    message = deliver_one(conn, "patch-loss")
    channel: Any = conn.default_channel
    conn.collect()
    channel._disconnect_pools()
    assert channel.connection is None
    return channel, message


@pytest.mark.integration
def test_kombu_broker_loss_upstream_raises_on_a_collected_connection(
    redis_url: str, upstream: None
) -> None:
    channel, message = collected_channel(redis_url)
    with pytest.raises(AttributeError):
        channel.qos.restore_unacked()
    with pytest.raises(AttributeError):
        channel.qos.ack(message.delivery_tag)
    with pytest.raises(AttributeError):
        channel.qos.reject(message.delivery_tag, requeue=True)


@pytest.mark.integration
def test_kombu_broker_loss_patched_logs_instead(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    patches.configure(())
    channel, message = collected_channel(redis_url)
    with caplog.at_level("WARNING", logger="workers.patches.kombu_redis"):
        assert channel.qos.restore_unacked() is None
        assert channel.qos.reject(message.delivery_tag, requeue=True) is None
    assert caplog.text.count("broker connection lost") == 2


@pytest.mark.integration
def test_kombu_unacked_script_upstream_records_what_the_script_records(
    redis_url: str, upstream: None
) -> None:
    with Connection(redis_url) as conn:
        before = time.time()
        message = deliver_one(conn, "patch-append")
        channel = conn.default_channel
        with channel.conn_or_acquire() as client:
            tag = message.delivery_tag
            assert before <= client.zscore(channel.unacked_index_key, tag) <= time.time()
            stored = json.loads(client.hget(channel.unacked_key, tag))
        assert stored == [message._raw, "patch-append", "patch-append"]
        message.ack()
        assert unacked(channel, tag) == (False, False)
    assert parameters(QoS.append) == ["self", "message", "delivery_tag"]


@pytest.mark.integration
def test_kombu_batched_acks_upstream_acks_at_once_and_the_loop_knows_its_thread(
    redis_url: str, upstream: None
) -> None:
    with Connection(redis_url) as conn:
        message = deliver_one(conn, "patch-ack")
        assert unacked(conn.default_channel, message.delivery_tag) == (True, True)
        message.ack()  # upstream: the pipeline's ZREM + HDEL now, whatever the thread
        assert unacked(conn.default_channel, message.delivery_tag) == (False, False)
    assert parameters(QoS.ack) == ["self", "delivery_tag"]
    hub = Hub()
    assert hub._loop_thread is None
    next(hub.create_loop())  # what `Hub.run_forever` runs: it records the loop's thread
    assert hub._loop_thread is not None
    hub.close()


@pytest.mark.integration
def test_kombu_pool_client_upstream_builds_a_client_per_call(
    redis_url: str, upstream: None
) -> None:
    with Connection(redis_url) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is not second and first.connection_pool is channel.pool
        assert hasattr(RedisChannel, "_create_client")


@pytest.mark.integration
def test_kombu_pool_client_upstream_fails_on_a_closed_channel_with_an_attribute_error(
    redis_url: str, upstream: None
) -> None:
    channel, _ = collected_channel(redis_url)
    with pytest.raises(AttributeError), channel.conn_or_acquire():
        pass


@pytest.mark.integration
def test_kombu_pool_client_patched_a_closed_channel_is_a_connection_error_ensure_recovers(
    redis_url: str,
) -> None:
    patches.configure(())
    channel, _ = collected_channel(redis_url)
    with pytest.raises(redis.exceptions.ConnectionError), channel.conn_or_acquire():
        pass
    with Connection(redis_url) as conn:  # what `Connection.ensure` retries after reconnecting
        assert redis.exceptions.ConnectionError in conn.transport.connection_errors


@pytest.mark.integration
def test_kombu_declare_cache_upstream_keeps_declared_entities_by_hash(
    redis_url: str, upstream: None
) -> None:
    queue = Queue("patch-declare", Exchange("patch-declare", type="direct"))
    with Connection(redis_url) as conn:
        producer = Producer(conn.default_channel)
        assert queue.can_cache_declaration
        assert producer.maybe_declare(queue, retry=True) is True
        assert hash(queue) in producer.channel.connection.client.declared_entities
        assert producer.maybe_declare(queue, retry=True) is False
    assert parameters(Producer.maybe_declare) == ["self", "entity", "retry", "retry_policy"]
