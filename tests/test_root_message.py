"""A submitted root and its task message in one round trip, where the broker is the store.

The message is kombu's own (recorded where kombu would send it: `workers.root_message`),
put by the script that writes the root, after it and only if it wrote it
(`fleet.storage.root_message`). On another broker it goes apart, after the root, as before.
"""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.messaging import Producer
from kombu.transport.redis import Channel
from redis.connection import Connection

from fleet.client import Fleet
from fleet.errors import ConfigError
from fleet.llm.scripted import EXAMPLE_SCRIPT
from fleet.models import WorkerPresence
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from tests.procs import start_worker, wait_for_workers
from workers.patches.switches import set_off

pytestmark = pytest.mark.integration

MODEL = f"scripted:{EXAMPLE_SCRIPT}"


@pytest.fixture
def trips() -> Iterator[Counter[int]]:
    """Round trips to any Redis (the store's and kombu's), by the thread that made them."""
    counted: Counter[int] = Counter()
    send: Callable[..., None] = Connection.send_packed_command

    def counting(self: Connection, command: Any, check_health: bool = True) -> None:
        counted[threading.get_ident()] += 1
        send(self, command, check_health)

    Connection.send_packed_command = counting  # type: ignore[method-assign,assignment]
    yield counted
    Connection.send_packed_command = send  # type: ignore[method-assign]


def client(redis_url: str, workspace: Path, broker_url: str | None = None, **extra: str) -> Fleet:
    env = {
        **extra,
        "FLEET_REDIS_URL": redis_url,
        "FLEET_BROKER_URL": broker_url or redis_url,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
    }
    return Fleet.from_env(Settings.from_env(env))


def queued(client: redis.Redis, queue: str = "fleet.main") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]


def test_kombu_hands_a_batch_its_publish_and_a_redis_channel_its_commands() -> None:
    """The two kombu 5.7 points `workers.root_message` relies on."""
    source = Producer._publish.__code__.co_names
    assert "_batch_local" in source and "publish" in source
    assert "add" in Channel._put.__code__.co_names
    assert "add" in Channel._put_fanout.__code__.co_names


def test_a_root_and_its_message_take_one_round_trip(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, trips: Counter[int]
) -> None:
    fleet = client(redis_url, tmp_path)
    fleet.submit("warm up", model=MODEL)  # the scripts' first load, kombu's declarations
    redis_client.delete("fleet.main")
    trips.clear()
    handle = fleet.submit("survey it", model=MODEL)
    assert trips[threading.get_ident()] == 1, "the root, its indexes, its event, its message"
    (message,) = queued(redis_client)
    assert message["headers"]["task"] == "fleet.run_agent"
    assert json.loads(base64.b64decode(message["body"]))[0] == [handle.trace_id]
    assert fleet.trace(handle.trace_id).status == "queued"


def test_a_refused_root_puts_no_message(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    fleet = client(redis_url, tmp_path)
    presence = WorkerPresence(node="w1", queues=["fleet.main"], roots=[str(tmp_path / "other")])
    RedisStore(redis_client).beat([], 60_000, presence)
    with pytest.raises(ConfigError, match="outside the workspace roots"):
        fleet.submit("survey it", model=MODEL)
    assert redis_client.llen("fleet.main") == 0
    assert fleet.store.list_traces() == []


def test_on_another_broker_the_message_goes_apart(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, trips: Counter[int]
) -> None:
    broker = redis_url.rsplit("/", 1)[0] + "/9"
    with redis.Redis.from_url(broker) as other:
        other.delete("fleet.main")
        fleet = client(redis_url, tmp_path, broker_url=broker)
        handle = fleet.submit("survey it", model=MODEL)
        assert redis_client.llen("fleet.main") == 0
        (message,) = queued(other)
        assert json.loads(base64.b64decode(message["body"]))[0] == [handle.trace_id]
        other.delete("fleet.main")


def test_switched_off_the_message_goes_apart(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, trips: Counter[int]
) -> None:
    fleet = client(redis_url, tmp_path, FLEET_CELERY_PATCHES_OFF="root-message")
    try:
        fleet.submit("warm up", model=MODEL)
        trips.clear()
        fleet.submit("survey it", model=MODEL)
        assert trips[threading.get_ident()] >= 2, "the root's script, then kombu's publish"
        assert redis_client.llen("fleet.main") == 2
    finally:
        set_off(frozenset())


def test_a_worker_runs_the_root_its_message_came_with(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with start_worker(redis_url, concurrency=2) as worker:
        wait_for_workers(redis_url, [worker.name], timeout_s=60)
        done = client(redis_url, tmp_path).submit("survey it", model=MODEL).wait(60)
    assert done.status == "completed"
