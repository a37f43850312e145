"""Main's newer keys on a local 3-master Redis Cluster: provider batches, images, cached usage.

Each would raise CROSSSLOT on a cluster if its keys were not laid out for it (the plain
layout's batch names are shown to: the test of the test). No broker, no workers: the
stores themselves, against real cluster nodes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from fleet.models import Message, Trace, now_ms
from fleet.storage import keys
from fleet.storage.backends.redis.batch_calls import RedisBatchCalls
from fleet.storage.backends.redis.images import RedisImages
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.batch_types import Flush, PendingCall
from tests.redis_cluster import redis_cluster

pytestmark = pytest.mark.integration

ROOT = "20261127T160000-c1a2b3"
MODEL = "m"


@pytest.fixture(scope="module")
def masters() -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        nodes = stack.enter_context(redis_cluster())
        stack.callback(keys.use_cluster_layout, False)  # this process's layout, for later tests
        yield nodes


@pytest.fixture(scope="module")
def store(masters: list[str]) -> Iterator[RedisStore]:
    with contextlib.ExitStack() as stack:
        cluster_store = RedisStore.from_url(masters[0], cluster=True)
        stack.callback(cluster_store.close)
        yield cluster_store


def pending(custom_id: str) -> PendingCall:
    return PendingCall(
        custom_id=custom_id,
        trace_id=f"{ROOT}@explore-001-20261127160001-001",
        root_trace_id=ROOT,
        model_name=MODEL,
        body={"messages": [{"role": "user", "content": "hi"}]},
        queued_at_ms=1,
    )


def test_a_provider_batch_call_moves_through_every_state_on_a_cluster(store: RedisStore) -> None:
    queue = RedisBatchCalls(store.client)
    assert queue.enqueue(pending("c1"), deadline_ms=10**13) and queue.enqueue(pending("c2"))
    flush = Flush(flush_id="f1", model_name=MODEL, custom_ids=["c1", "c2"], at_ms=2)
    assert sorted(queue.begin_flush(flush)) == ["c1", "c2"]
    queue.submitted(flush.model_copy(update={"batch_id": "b1"}))
    assert [f.batch_id for f in queue.in_flight()] == ["b1"]
    assert queue.answer("c1", {"content": "x"}) and not queue.answer("c1", {"content": "y"})
    assert queue.answer_of("c1") == {"content": "x"}
    assert queue.cancel("c2") == "cancelled" and not queue.answer("c2", {"content": "late"})
    queue.release("c1")
    queue.forget("c2")
    assert queue.calls(["c1", "c2"]) == [None, None]
    assert queue.claim(keys.batch_poll(), "a", 10_000)
    assert not queue.claim(keys.batch_poll(), "b", 10_000)
    names = [keys.batch_calls(), keys.batch_state(), keys.batch_answer("c1"), keys.batch_poll()]
    assert len({key_slot(name.encode()) for name in names}) == 1


def test_the_plain_layout_s_batch_names_would_not_run_on_a_cluster(store: RedisStore) -> None:
    queue = RedisBatchCalls(store.client)
    keys.use_cluster_layout(False)
    try:
        with pytest.raises((redis.RedisError, RedisClusterException), match="same key slot"):
            queue.enqueue(pending("plain"))
    finally:
        keys.use_cluster_layout(True)
    assert queue.calls(["plain"]) == [None], "nothing written by the refused script"


def test_a_tree_s_images_are_stored_once_in_its_slot(store: RedisStore) -> None:
    images = RedisImages(store)
    data = b"\x89PNG\r\n\x1a\n" + bytes(100)
    images.put(ROOT, "d1", data)
    images.put(ROOT, "d1", data)  # stored once: the counter does not move
    assert images.get(ROOT, "d1") == data
    assert int(store.client.get(keys.image_bytes(ROOT)) or 0) == len(data)
    slot = key_slot(keys.trace(ROOT).encode())
    assert key_slot(keys.image(ROOT, "d1").encode()) == slot
    assert keys.image(ROOT, "d1").startswith(f"fleet:image:{{{ROOT}}}:")


def test_an_image_digest_that_would_move_the_key_is_refused(store: RedisStore) -> None:
    images = RedisImages(store)
    before = store.client.get(keys.image_bytes(ROOT))
    for hostile in ("}{other", "{x}", "a:b", "../d1"):
        with pytest.raises(ValueError, match="is not a digest"):
            images.put(ROOT, hostile, b"\x89PNG\r\n\x1a\n")
    assert store.client.get(keys.image_bytes(ROOT)) == before, "nothing counted"


def test_cached_tokens_reach_the_fleet_wide_usage_on_a_cluster(store: RedisStore) -> None:
    trace_id = "20261127T160001-c4d5e6"
    store.create_trace(Trace(trace_id=trace_id, root_trace_id=trace_id, task="x"))
    store.update_trace(trace_id, status="running")
    turn = Message(trace_id=trace_id, role="assistant", model=MODEL, prompt_tokens=10)
    store.append_message(turn.model_copy(update={"cached_tokens": 8, "completion_tokens": 2}))
    store.update_trace(trace_id, status="completed")

    usage = store.client.hgetall(keys.USAGE)

    assert usage[f"cached_tokens:{MODEL}"] == "8" and usage[f"prompt_tokens:{MODEL}"] == "10"
    assert not store.client.hexists(keys.trace(trace_id), "uncounted")


def test_closing_a_cluster_store_closes_every_node_s_sockets(masters: list[str]) -> None:
    cluster_store = RedisStore.from_url(masters[0], cluster=True)
    for n in range(30):  # keys on every node
        cluster_store.client.set(f"close-test:{n}", "x")
    client: Any = cluster_store.client
    pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
    assert len(pools) == len(masters)
    assert all(any(c._sock for c in pool._connections) for pool in pools), "each node used"

    cluster_store.close()

    left = [c for pool in pools for c in pool._connections if c._sock is not None]
    assert left == [], "sockets left for the garbage collector (a ResourceWarning later)"


def test_a_message_between_branches_is_one_script_in_the_tree_s_slot(store: RedisStore) -> None:
    from fleet.conversation.messages import LIMITS
    from fleet.storage.inbox import INBOX
    from fleet.storage.inbox_types import Posted, Refused

    one, two = (f"{ROOT}@explore-00{i}-20261127160001-001" for i in (1, 2))
    for trace_id in (one, two):
        store.create_trace(Trace(trace_id=trace_id, root_trace_id=ROOT, task="t", mode="explore"))
    inbox = store.capability(INBOX)
    posted = Posted(sender="explore-001", content="look at C", sender_trace_id=one)
    entry_id = inbox.post(two, posted, LIMITS, sender_trace_id=one)
    assert [e.entry_id for e in inbox.after(two, None, 10)] == [entry_id]
    assert inbox.newest(two) == entry_id and inbox.count(two) == 1
    store.update_trace(two, status="completed")
    with pytest.raises(Refused) as refused:
        inbox.post(two, posted, LIMITS, sender_trace_id=one)
    assert refused.value.why == "ended" and inbox.count(two) == 1


def test_a_heartbeat_renews_the_leases_of_several_trees_on_a_cluster(store: RedisStore) -> None:
    roots = [f"20261127T16010{n}-beat0{n}" for n in range(6)]
    held = [(root, "me") for root in roots] + [(f"{roots[0]}@explore-001-20261127160101-001", "me")]
    # 30 s leases: on a loaded machine a shorter one may run out before the beat below.
    for trace_id, owner in held:
        assert store.acquire_lease(trace_id, owner, 30_000)
    assert store.acquire_lease(f"{roots[1]}@explore-002-20261127160101-001", "other", 30_000)
    taken = (f"{roots[1]}@explore-002-20261127160101-001", "me")  # another runner holds it
    slots = {key_slot(keys.lease(t).encode()) for t, _ in held}
    assert len(slots) == len(roots), "a slot per tree: the beat spans them"
    store.client.script_flush()  # a restarted node: the script is loaded again

    renewed = store.beat([*held, taken], 60_000, None)

    assert renewed == [True] * len(held) + [False]
    assert all(store.client.pttl(keys.lease(t)) > 50_000 for t, _ in held)
    assert store.client.pttl(keys.lease(taken[0])) <= 30_000, "not ours: left as it was"
    running: Any = store.client.zrange(keys.RUNNING, 0, -1, withscores=True)
    deadlines = dict(running)
    assert all(deadlines[t] > now_ms() + 50_000 for t, _ in held)
    assert store.beat([], 60_000, None) == []


def test_a_result_backend_on_a_cluster_node_is_refused_at_worker_start(
    masters: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet.settings import Settings
    from fleet.storage.backends.redis.probe import is_cluster_node
    from fleetops.redis_server import start_redis_server
    from workers import signals

    with start_redis_server() as single:
        assert is_cluster_node(masters[1]) is True
        assert is_cluster_node(single.url) is False
        assert is_cluster_node("sentinel://127.0.0.1:1;sentinel://127.0.0.1:2") is False
    assert is_cluster_node(single.url, timeout_s=0.5) is None, "stopped: unreachable"
    env = {"FLEET_REDIS_URL": masters[0], "FLEET_REDIS_CLUSTER": "1"}
    settings = Settings.from_env({**env, "FLEET_RESULT_BACKEND_URL": masters[1]})
    monkeypatch.setattr(signals, "process_settings", lambda: settings)
    with pytest.raises(SystemExit) as refused:
        signals._refuse_results_on_a_cluster()
    assert refused.value.code == 2
    said = capsys.readouterr().err.strip()
    assert said.endswith("single Redis apart from the cluster") and "\n" not in said


def test_memory_writes_searches_and_removals_run_in_the_namespace_s_slot(
    store: RedisStore,
) -> None:
    from fleet.loop.memory_calls import search
    from fleet.memory.backends.redis import RedisBoard
    from fleet.memory.model import Write

    board = RedisBoard(store.client)
    for n, city in enumerate(["Tongzhou", "Shunyi", "Tongzhou"]):
        board.write(Write("user:alice", f"k{n}", {"lives": city}, 0, "test"))
    assert [e.key for e in search(board, ["user:alice"], "tongzhou", None, 5)] == ["k0", "k2"]
    assert board.remove("user:alice", "k0")
    assert [e.key for e in search(board, ["user:alice"], "tongzhou", None, 5)] == ["k2"]
    assert [e.key for e in board.newest("user:alice", 1)] == ["k2"]
    names = [keys.memory_entries("user:alice"), keys.memory_index("user:alice")]
    names += [keys.memory_terms("user:alice"), keys.memory_recent("user:alice")]
    names.append(keys.memory_history("user:alice", "k1"))
    assert len({key_slot(name.encode()) for name in names}) == 1
