"""Tasks sent to RabbitMQ survive a SIGKILL of the node right after the send (issue 38).

Without publisher confirms RabbitMQ keeps a just-published persistent message in memory for
a while; a node killed then loses it, and the sender, told nothing, logged it as sent (the
chaos run's `rabbitmq-node` rounds: runs re-sent by the sweeper never reached a worker).
The test starts a private node of its own (`bench.chaos_parts.rabbit`), never the shared one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kombu import Connection

from bench.chaos_parts.rabbit import Node, installed, private_node
from fleet.settings import Settings
from workers.app import create_app, transport_options

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq]

SENDS = 50
QUEUE = "fleet.test.confirms"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if installed() is None:
        pytest.skip("rabbitmq-server is not installed")
    with private_node(tmp_path_factory.mktemp("rabbit")) as started:
        yield started


def queued(url: str) -> int:
    with Connection(url) as conn:
        return int(conn.default_channel.queue_declare(QUEUE, passive=True).message_count)


def test_a_rabbitmq_broker_gets_publisher_confirms() -> None:
    assert transport_options("amqp://guest:guest@127.0.0.1:5672//", None)["confirm_publish"]
    assert "confirm_publish" not in transport_options("redis://127.0.0.1:6379/0", None)


def test_tasks_sent_just_before_the_node_is_killed_are_there_after_its_restart(
    node: Node,
) -> None:
    app = create_app(Settings(broker_url=node.url), set_as_current=False)
    try:
        for _ in range(SENDS):
            app.send_task("fleet.test.nothing", queue=QUEUE, ignore_result=True)
        node.stop(kill=True)  # SIGKILL at once: what was not on disk is gone
        node.start()
        assert queued(node.url) == SENDS
    finally:
        app.close()
