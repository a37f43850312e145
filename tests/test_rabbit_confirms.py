"""Re-sent runs survive a SIGKILL of the RabbitMQ node right after the send (issue 38).

Without publisher confirms RabbitMQ keeps a just-published persistent message in memory for
a while; a node killed then loses it, and the sender, told nothing, logged it as sent (the
chaos run's `rabbitmq-node` rounds: runs re-sent by the sweeper never reached a worker).
`workers.confirmed` confirms the sends that heal a tree. The test starts a private node of
its own (`bench.chaos_parts.rabbit`), never the shared one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kombu.connection import Connection

from bench.chaos_parts.rabbit import Node, installed, private_node
from fleet.models import Trace
from fleet.settings import Settings
from workers import confirmed, dispatch
from workers.app import QUEUE_BY_MODE, create_app

# A private node starts twice (its start, then after the SIGKILL): each boot of Erlang took
# 10-60 s on the 2 shared cores under load, past the suite's 120 s default together.
pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.timeout(480)]

SENDS = 50


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if installed() is None:
        pytest.skip("rabbitmq-server is not installed")
    with private_node(tmp_path_factory.mktemp("rabbit")) as started:
        yield started


def a_child(n: int) -> Trace:
    fields = {"trace_id": f"c{n}", "root_trace_id": "r", "parent_trace_id": "r", "task": "do"}
    return Trace.model_validate({**fields, "mode": "delegate"})


def queued(url: str, queue: str) -> int:
    with Connection(url) as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def test_only_recovered_runs_take_the_confirming_producer(monkeypatch: Any) -> None:
    app = create_app(Settings(broker_url="amqp://guest:guest@127.0.0.1:1//"), set_as_current=False)
    producers: list[Any] = []
    monkeypatch.setattr(
        "celery.canvas.Signature.apply_async",
        lambda self, **options: producers.append(options.get("producer")),
    )
    dispatch.send(a_child(1), via=app)
    dispatch.send(a_child(2), via=app, recovered=True)
    plain, recovered = producers
    assert plain is None
    assert recovered.connection.transport_options["confirm_publish"] is True
    with confirmed.producer(create_app(Settings(), set_as_current=False)) as on_redis:
        assert on_redis is None  # no confirms on Redis: the app's own producers
    app.close()


def test_runs_re_sent_just_before_the_node_is_killed_are_there_after_its_restart(
    node: Node,
) -> None:
    app = create_app(Settings(broker_url=node.url), set_as_current=False)
    try:
        for n in range(SENDS):
            dispatch.send(a_child(n), via=app, recovered=True)
        node.stop(kill=True)  # SIGKILL at once: what was not on disk is gone
        node.start()
        assert queued(node.url, QUEUE_BY_MODE["delegate"]) == SENDS
    finally:
        app.close()
