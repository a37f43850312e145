"""A new root in one step: the serving check, the root, its indexes and its first event.

On every store the outcome is the same (created and listed; refused with nothing written);
on a single Redis it is one round trip, and the serving check's fast path (a workspace under
an announced root's text) falls back to the exact check in Python for anything else.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import Connection

from fleet.errors import ConfigError, TraceExists
from fleet.models import Event, Trace, WorkerPresence
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.root_index import ROOTS
from fleet.storage.store import Serving, TraceStore

QUEUE = "fleet.main"


def announce(store: TraceStore, node: str, roots: list[str]) -> None:
    store.beat([], 60_000, WorkerPresence(node=node, queues=[QUEUE], roots=roots))


def root(trace_id: str = "20261129T010203-abcdef") -> tuple[Trace, Event]:
    trace = Trace(trace_id=trace_id, root_trace_id=trace_id, task="t", status="queued")
    return trace, Event(kind="trace", trace_id=trace_id, status="queued")


def contents(store: TraceStore) -> Any:
    """Everything a store holds that a root's writes could touch."""
    if isinstance(store, RedisStore):
        client = store.client
        return {k: client.dump(k) for k in sorted(client.keys("fleet:*")) if "worker" not in k}
    return (store.list_traces(), store.capability(ROOTS).page(10))


def test_a_queued_root_is_stored_listed_and_told(store: TraceStore, tmp_path: Path) -> None:
    announce(store, "w1", [str(tmp_path)])
    trace, event = root()
    store.queue_root(trace, event, Serving(QUEUE, tmp_path / "a"))
    assert store.get_trace(trace.trace_id).status == "queued"
    assert [e.status for _, e in store.read_events(trace.trace_id)] == ["queued"]
    assert store.capability(ROOTS).page(10) == [(trace.created_at_ms, trace.trace_id)]
    other, other_event = root("20261129T010203-fedcba")
    store.queue_root(other, other_event, listed=False)  # a recorder's root: not on the list
    assert [r for _, r in store.capability(ROOTS).page(10)] == [trace.trace_id]


def test_an_unserved_workspace_is_refused_with_nothing_written(
    store: TraceStore, tmp_path: Path
) -> None:
    announce(store, "w1", [str(tmp_path / "served")])
    before = contents(store)
    trace, event = root()
    with pytest.raises(ConfigError, match="outside the workspace roots of every live worker"):
        store.queue_root(trace, event, Serving(QUEUE, tmp_path / "elsewhere"))
    # A root's text that is a prefix of the workspace's, but not a folder of it.
    with pytest.raises(ConfigError, match="outside the workspace roots"):
        store.queue_root(trace, event, Serving(QUEUE, tmp_path / "served-not"))
    assert contents(store) == before


def test_a_taken_id_is_refused_whole(store: TraceStore, tmp_path: Path) -> None:
    trace, event = root()
    store.queue_root(trace, event)
    before = contents(store)
    with pytest.raises(TraceExists):
        store.queue_root(trace.model_copy(update={"task": "another"}), event)
    assert contents(store) == before
    assert store.get_trace(trace.trace_id).task == "t"


@pytest.fixture
def meter() -> Iterator[Counter[int]]:
    """Round trips by the thread that made them."""
    trips: Counter[int] = Counter()
    send: Callable[..., None] = Connection.send_packed_command

    def counting(self: Connection, command: Any, check_health: bool = True) -> None:
        trips[threading.get_ident()] += 1
        send(self, command, check_health)

    Connection.send_packed_command = counting  # type: ignore[method-assign,assignment]
    yield trips
    Connection.send_packed_command = send  # type: ignore[method-assign]


@pytest.mark.integration
def test_a_served_root_takes_one_round_trip(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int]
) -> None:
    store = RedisStore(redis_client)
    announce(store, "w1", [str(tmp_path / "b")])
    announce(store, "w2", [str(tmp_path)])
    trace, event = root()
    store.queue_root(*root("20261129T010203-000000"), Serving(QUEUE, tmp_path / "a"))  # warm
    meter.clear()
    store.queue_root(trace, event, Serving(QUEUE, tmp_path / "a"))
    assert sum(meter.values()) == 1
    assert store.get_trace(trace.trace_id).status == "queued"


@pytest.mark.integration
def test_a_root_announced_through_a_symlink_is_checked_exactly(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int]
) -> None:
    """The script's text check misses a symlinked root; Python's resolves it and lets it in."""
    real = tmp_path / "real"
    (real / "ws").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    store = RedisStore(redis_client)
    announce(store, "w1", [str(tmp_path / "link")])
    store.queue_root(*root("20261129T010203-000000"))  # warm
    meter.clear()
    trace, event = root()
    store.queue_root(trace, event, Serving(QUEUE, (real / "ws").resolve()))
    assert sum(meter.values()) == 2, "the script, then again without its check"
    assert store.get_trace(trace.trace_id).status == "queued"
