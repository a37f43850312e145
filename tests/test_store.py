"""The TraceStore contract, run against every backend (MemoryStore and a real Redis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import fakeredis
import pytest
import redis
from pydantic import ValidationError

from fleet.errors import ConfigError, TraceExists, TraceNotFound
from fleet.goals import GoalTree
from fleet.models import Collaborator, Event, Message, Trace, TraceStats, now_ms
from fleet.storage import keys
from fleet.storage.backends.redis.connect import Lua, _cluster_class, redact_url
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleetops.redis_server import free_port

T = TypeVar("T")


def make_trace(trace_id: str = "t1", **fields: Any) -> Trace:
    return Trace.model_validate(
        {"trace_id": trace_id, "root_trace_id": "t1", "task": "do", **fields}
    )


def run_concurrently(n: int, job: Callable[[int], T]) -> list[T]:
    """Run `job(i)` for i in range(n) on n threads released together by a barrier."""
    barrier = threading.Barrier(n)

    def go(i: int) -> T:
        barrier.wait(timeout=30)
        return job(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(go, range(n)))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.01)


def user(trace_id: str, content: str = "hi") -> Message:
    return Message(trace_id=trace_id, role="user", content=content)


# -- traces ------------------------------------------------------------------


def rich_trace() -> Trace:
    goals = GoalTree()
    goals.add("find the bug")
    goals.add("reproduce it", under="1")
    goals.done("1.1", summary="reproduced ✓")
    return make_trace(
        parent_trace_id="p0",
        mode="delegate",
        task='résumé · 日本語 · emoji 🚀 · "quotes" \\ backslash',
        context={"nested": {"list": [1, 2.5, None, {"k": []}], "empty": {}}},
        skills=["read", "grep"],
        metadata={"ünïcode": "✓", "float": 0.1 + 0.2, "big": 2**53, "none": None},
        stats=TraceStats(prompt_tokens=3, cost_usd=0.1),
        goals=goals,
        head_sequence=None,
    )


def test_create_and_get_round_trip_exactly(store: TraceStore) -> None:
    trace = rich_trace()
    store.create_trace(trace)
    assert store.get_trace("t1") == trace


def test_create_existing_id_is_an_error(store: TraceStore) -> None:
    store.create_trace(make_trace())
    with pytest.raises(TraceExists, match="already exists"):
        store.create_trace(make_trace(task="again"))


def test_missing_trace_raises_trace_not_found(store: TraceStore) -> None:
    with pytest.raises(TraceNotFound):
        store.get_trace("nope")
    with pytest.raises(TraceNotFound):
        store.update_trace("nope", status="running")
    with pytest.raises(TraceNotFound):
        store.append_message(user("nope"))


def test_update_overwrites_only_the_given_fields(store: TraceStore) -> None:
    trace = rich_trace()
    store.create_trace(trace)
    goals = GoalTree()
    goals.add("new plan")
    store.update_trace("t1", status="running", iteration=4, goals=goals, answer="42 ✓")
    got = store.get_trace("t1")
    assert (got.status, got.iteration, got.goals, got.answer) == ("running", 4, goals, "42 ✓")
    assert got.updated_at_ms >= trace.updated_at_ms
    untouched = {"status", "iteration", "goals", "answer", "updated_at_ms"}
    assert got.model_dump(exclude=untouched) == trace.model_dump(exclude=untouched)


@pytest.mark.parametrize("fields", [{"status": "bogus"}, {"no_such_field": 1}, {"iteration": "x"}])
def test_update_rejects_invalid_fields(store: TraceStore, fields: dict[str, Any]) -> None:
    store.create_trace(make_trace())
    with pytest.raises(ValueError):
        store.update_trace("t1", **fields)
    assert store.get_trace("t1").status == "queued"


def test_list_traces_newest_first(store: TraceStore) -> None:
    for i, created_at_ms in enumerate([1_000, 3_000, 2_000]):
        store.create_trace(make_trace(f"t{i}", created_at_ms=created_at_ms))
    assert [t.trace_id for t in store.list_traces()] == ["t1", "t2", "t0"]
    assert [t.trace_id for t in store.list_traces(limit=2)] == ["t1", "t2"]


def test_children_in_creation_order(store: TraceStore) -> None:
    store.create_trace(make_trace("p"))
    for i, child in enumerate(["p@b", "p@a", "p@c"]):
        store.create_trace(make_trace(child, parent_trace_id="p", created_at_ms=1_000 + i))
    assert store.children("p") == ["p@b", "p@a", "p@c"]
    assert store.children("p@a") == []


# -- messages and stats ------------------------------------------------------


def test_append_assigns_sequences_and_chains_parents(store: TraceStore) -> None:
    store.create_trace(make_trace())
    stored = [store.append_message(user("t1", str(i))) for i in range(3)]
    assert [(m.sequence, m.parent_sequence) for m in stored] == [(1, None), (2, 1), (3, 2)]
    assert store.messages("t1") == stored
    trace = store.get_trace("t1")
    assert (trace.head_sequence, trace.last_sequence) == (3, 3)


def test_message_json_round_trips_exactly(store: TraceStore) -> None:
    store.create_trace(make_trace())
    message = Message(
        trace_id="t1",
        role="assistant",
        content='héllo 🌍 "quoted" \\ \n\t',
        tool_calls=[],
        metadata={"list": [], "dict": {}, "nested": {"a": [1, {"b": []}]}, "π": 3.14159},
        cost_usd=0.1 + 0.2,
        prompt_tokens=7,
    )
    stored = store.append_message(message)
    assert stored == message.model_copy(update={"sequence": 1, "parent_sequence": None})
    assert store.messages("t1") == [stored]


def test_set_head_rewinds_and_later_appends_branch(store: TraceStore) -> None:
    store.create_trace(make_trace())
    for i in range(3):
        store.append_message(user("t1", str(i)))
    store.set_head("t1", 1)
    branch = store.append_message(user("t1", "branch"))
    assert (branch.sequence, branch.parent_sequence) == (4, 1)
    store.set_head("t1", None)
    root = store.append_message(user("t1", "new root"))
    assert (root.sequence, root.parent_sequence) == (5, None)
    assert [m.sequence for m in store.messages("t1")] == [1, 2, 3, 4, 5]


def test_concurrent_appends_get_unique_sequences(store: TraceStore) -> None:
    store.create_trace(make_trace())
    stored = run_concurrently(200, lambda i: store.append_message(user("t1", str(i))))
    assert sorted(m.sequence for m in stored) == list(range(1, 201))
    messages = store.messages("t1")
    assert [m.sequence for m in messages] == list(range(1, 201))
    # One chain: every message hangs under the one appended just before it.
    assert [m.parent_sequence for m in messages] == [None, *range(1, 200)]
    assert sorted(m.content or "" for m in messages) == sorted(str(i) for i in range(200))


def test_concurrent_add_stats_lose_nothing(store: TraceStore) -> None:
    store.create_trace(make_trace())
    run_concurrently(100, lambda i: store.add_stats("t1", prompt_tokens=2, cost_usd=0.25))
    stats = store.get_trace("t1").stats
    assert (stats.prompt_tokens, stats.cost_usd) == (200, 25.0)


def test_add_stats_rejects_unknown_fields(store: TraceStore) -> None:
    store.create_trace(make_trace())
    with pytest.raises(ValueError, match="bogus"):
        store.add_stats("t1", bogus=1)


def turn_message(trace_id: str = "t1") -> Message:
    return Message(
        trace_id=trace_id,
        role="assistant",
        content="ok ✓",
        tool_calls=[],
        model="m",
        prompt_tokens=7,
        completion_tokens=3,
        cost_usd=0.25,
    )


def test_record_turn_appends_counts_and_emits_in_one_step(store: TraceStore) -> None:
    store.create_trace(make_trace())
    event = Event(kind="message", trace_id="t1", data={"role": "assistant", "tools": []})
    stored = store.record_turn("t1", turn_message(), event, iteration=1)
    assert (stored.sequence, stored.parent_sequence) == (1, None)
    assert store.messages("t1") == [stored]
    trace = store.get_trace("t1")
    assert (trace.iteration, trace.head_sequence, trace.last_sequence) == (1, 1, 1)
    usage = TraceStats(messages=1, prompt_tokens=7, completion_tokens=3, cost_usd=0.25)
    assert trace.stats == usage
    expected = event.model_copy(update={"data": {"role": "assistant", "tools": [], "sequence": 1}})
    assert [e for _, e in store.read_events("t1")] == [expected]


def test_record_turn_of_a_tool_result_leaves_stats_and_iteration(store: TraceStore) -> None:
    store.create_trace(make_trace())
    store.append_message(user("t1"))
    event = Event(kind="message", trace_id="t1", data={"role": "tool", "tool": "x"})
    stored = store.record_turn("t1", Message(trace_id="t1", role="tool", content="out"), event)
    assert (stored.sequence, stored.parent_sequence) == (2, 1)
    trace = store.get_trace("t1")
    assert (trace.iteration, trace.head_sequence, trace.stats) == (0, 2, TraceStats())
    assert [e.data["sequence"] for _, e in store.read_events("t1")] == [2]


def test_combined_writes_to_a_missing_trace_raise_and_emit_nothing(store: TraceStore) -> None:
    event = Event(kind="trace", trace_id="nope", status="running")
    with pytest.raises(TraceNotFound):
        store.record_turn("r", turn_message("nope"), event, iteration=1)
    with pytest.raises(TraceNotFound):
        store.update_trace_and_emit("nope", "r", event, status="running")
    assert store.read_events("r") == []


def test_update_trace_and_emit(store: TraceStore) -> None:
    store.create_trace(make_trace())
    event = Event(kind="finish", trace_id="t1", status="completed", data={"reason": "x"})
    store.update_trace_and_emit("t1", "root", event, status="completed", answer="42")
    trace = store.get_trace("t1")
    assert (trace.status, trace.answer, trace.task) == ("completed", "42", "do")
    assert [e for _, e in store.read_events("root")] == [event]


def test_snapshot_reads_trace_messages_and_stop_flag(store: TraceStore) -> None:
    store.create_trace(make_trace())
    stored = [store.append_message(user("t1", str(i))) for i in range(2)]
    snapshot = store.snapshot("t1")
    assert (snapshot.trace, snapshot.messages) == (store.get_trace("t1"), stored)
    assert not snapshot.stop_requested
    store.request_stop("t1")
    assert store.snapshot("t1").stop_requested
    with pytest.raises(TraceNotFound):
        store.snapshot("nope")


# -- collaborators and events --------------------------------------------------


def collaborator(child: str, status: Any = "running", summary: str = "") -> Collaborator:
    return Collaborator(name=child, trace_id=child, status=status, summary=summary)


def test_collaborators_keep_first_insertion_order(store: TraceStore) -> None:
    first = [collaborator(child) for child in ["p@b", "p@a", "p@c"]]
    for entry in first:
        store.put_collaborator("p", entry)
    done = collaborator("p@b", "completed", "plan A ✓")
    store.put_collaborator("p", done)
    assert store.collaborators("p") == [done, *first[1:]]


def test_put_collaborator_and_emit(store: TraceStore) -> None:
    event = Event(kind="collaborator", trace_id="p@a", status="running", data={"mode": "x"})
    done = collaborator("p@a", "completed")
    store.put_collaborator_and_emit("p", "root", collaborator("p@a"), event)
    store.put_collaborator_and_emit("p", "root", done, event)
    assert store.collaborators("p") == [done]
    assert [e for _, e in store.read_events("root")] == [event, event]


def test_concurrent_collaborators_none_lost_or_duplicated(store: TraceStore) -> None:
    children = [f"p@explore-{i:03d}" for i in range(200)]
    run_concurrently(200, lambda i: store.put_collaborator("p", collaborator(children[i])))
    assert sorted(c.trace_id for c in store.collaborators("p")) == children


def test_events_are_read_in_order_after_an_id(store: TraceStore) -> None:
    assert store.read_events("r") == []
    events = [Event(kind="message", trace_id="r", data={"i": i, "empty": []}) for i in range(3)]
    ids = [store.emit("r", event) for event in events]
    assert store.read_events("r") == list(zip(ids, events, strict=True))
    assert [e for _, e in store.read_events("r", after=ids[0])] == events[1:]
    assert store.read_events("r", after=ids[-1]) == []
    assert len(store.read_events("r", count=2)) == 2


def test_blocking_read_wakes_when_an_event_arrives(store: TraceStore) -> None:
    event = Event(kind="finish", trace_id="r", status="completed")

    def emit_soon() -> None:
        time.sleep(0.2)  # let the reader block first
        store.emit("r", event)

    emitter = threading.Thread(target=emit_soon)
    started = time.monotonic()
    emitter.start()
    got = store.read_events("r", block_ms=3_000)
    emitter.join()
    assert [e for _, e in got] == [event]
    assert time.monotonic() - started < 3


def test_blocking_read_times_out_empty(store: TraceStore) -> None:
    assert store.read_events("r", block_ms=50) == []


# -- stop, leases, collection, cache -------------------------------------------


def test_stop_flag(store: TraceStore) -> None:
    store.create_trace(make_trace("t1"))
    store.create_trace(make_trace("t2"))
    assert not store.stop_requested("t1")
    store.request_stop("t1")
    assert store.stop_requested("t1")
    assert not store.stop_requested("t2")
    assert store.get_trace("t1").task == "do", "the flag is no Trace field: the trace still reads"
    store.clear_stop("t1")
    assert not store.stop_requested("t1")
    store.request_stop("ghost")  # a trace that does not exist has no flag to raise
    assert not store.stop_requested("ghost")


def test_lease_has_one_owner(store: TraceStore) -> None:
    assert store.acquire_lease("t1", "w1", ttl_ms=10_000)
    assert not store.acquire_lease("t1", "w2", ttl_ms=10_000)
    assert store.acquire_lease("t1", "w1", ttl_ms=10_000)  # already ours
    assert store.beat([("t1", "w1"), ("t1", "w2")], 10_000, None) == [True, False]
    store.release_lease("t1", "w2")  # not w2's: no effect
    assert not store.acquire_lease("t1", "w2", ttl_ms=10_000)
    store.release_lease("t1", "w1")
    assert store.expired_leases(now_ms() + 10**9) == []
    assert store.acquire_lease("t1", "w2", ttl_ms=10_000)


def test_expired_lease_is_listed_and_can_be_taken_over(store: TraceStore) -> None:
    before_ms = now_ms()
    assert store.acquire_lease("t1", "w1", ttl_ms=50)
    assert store.expired_leases(before_ms) == []
    wait_until(lambda: store.expired_leases(now_ms()) == ["t1"])
    wait_until(lambda: store.acquire_lease("t1", "w2", ttl_ms=10_000))
    assert store.beat([("t1", "w1")], 10_000, None) == [False]


def test_forget_running_is_true_for_one_caller(store: TraceStore) -> None:
    store.acquire_lease("t1", "w1", ttl_ms=10_000)
    assert run_concurrently(50, lambda i: store.forget_running("t1")).count(True) == 1
    assert store.expired_leases(now_ms() + 10**9) == []


def test_a_collected_result_is_appended_once(store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="t1", root_trace_id="t1", task="x"))

    def result(i: int, call_id: str = "call_1") -> Message | None:
        message = Message(trace_id="t1", role="tool", tool_call_id=call_id, content=str(i))
        return store.append_collected(message)

    written = [m for m in run_concurrently(50, result) if m is not None]
    assert len(written) == 1
    assert [m.tool_call_id for m in store.messages("t1")] == ["call_1"]
    assert result(0, "call_2") is not None
    with pytest.raises(TraceNotFound):
        store.append_collected(Message(trace_id="nope", role="tool", tool_call_id="c"))


def test_cache_expires_after_its_ttl(store: TraceStore) -> None:
    key = keys.cache("explore", "abc")
    assert store.cache_get(key) is None
    store.cache_set(key, "answer ✓", ttl_s=1)
    assert store.cache_get(key) == "answer ✓"
    wait_until(lambda: store.cache_get(key) is None, timeout_s=5)
    store.cache_set(key, "gone", ttl_s=0)
    assert store.cache_get(key) is None


# -- RedisStore only: what MemoryStore has no counterpart for -------------------


def test_redis_store_refreshes_ttls_and_prunes_expired_traces(redis_db: redis.Redis) -> None:
    redis_client = redis_db
    store = RedisStore(redis_client)
    store.create_trace(make_trace("t1", parent_trace_id="p", created_at_ms=1))
    store.create_trace(make_trace("t2", created_at_ms=2))
    store.append_message(user("t1"))
    for key in [keys.trace("t1"), keys.children("p")]:
        assert 0 < redis_client.ttl(key) <= keys.TRACE_TTL_S
    redis_client.delete(keys.trace("t2"))  # as if its TTL ran out
    assert [t.trace_id for t in store.list_traces()] == ["t1"]
    assert redis_client.zrange(keys.TRACES, 0, -1) == ["t1"]


def test_redis_store_ping_names_the_url_without_its_password() -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    with RedisStore.from_url(url) as store, pytest.raises(ConfigError) as info:
        store.ping()
    assert "s3cret" not in str(info.value)
    assert f"'redis://user@127.0.0.1:{url.rsplit(':', 1)[1]}'" in str(info.value)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://:pw@h:1/0", "redis://h:1/0"),
        ("rediss://u:pw@h/2?ssl_cert_reqs=none", "rediss://u@h/2?ssl_cert_reqs=none"),
        ("unix://u:pw@/tmp/r.sock?db=1&password=pw", "unix://u@/tmp/r.sock?db=1"),
        ("unix:///tmp/r.sock?password=pw", "unix:///tmp/r.sock"),
        ("redis://h:6379", "redis://h:6379"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_redis_store_needs_decoded_responses() -> None:
    with fakeredis.FakeRedis() as raw, pytest.raises(ConfigError):  # the client's setting
        RedisStore(raw)


def test_redis_store_scripts_survive_a_script_flush(redis_db: redis.Redis) -> None:
    """A restarted or flushed Redis has lost the scripts: each is loaded again on NOSCRIPT."""
    redis_client = redis_db
    store = RedisStore(redis_client)
    store.create_trace(make_trace("t1"))
    fenced = store.fenced("t1", "me")
    redis_client.script_flush()
    assert store.begin_run("t1", "me", 10_000) is not None  # BEGIN_RUN
    redis_client.script_flush()
    assert fenced.append_message(user("t1")).sequence == 1  # APPLY behind the lease check
    redis_client.script_flush()
    store.release_lease("t1", "me")
    assert store.lease_holder("t1") is None


def test_update_trace_validates_only_trace_fields(store: TraceStore) -> None:
    store.create_trace(make_trace("t1"))
    with pytest.raises(ValidationError):
        store.update_trace("t1", status="sleeping")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'colour' is not a field of a trace"):
        store.update_trace("t1", colour="red")  # type: ignore[call-arg]
    store.update_trace("t1", status="running", metadata={"k": "é"}, head_sequence=None)
    trace = store.get_trace("t1")
    assert (trace.status, trace.metadata, trace.head_sequence) == ("running", {"k": "é"}, None)


class LoadsElsewhere:
    """A Cluster client just failed over: SCRIPT LOAD reaches the masters it knew, not the
    promoted replica serving the keys, so EVALSHA keeps meeting NOSCRIPT there."""

    def __init__(self) -> None:
        self.evals: list[tuple[Any, ...]] = []

    def evalsha(self, *args: Any) -> Any:
        raise redis.exceptions.NoScriptError("No matching script. Please use EVAL.")

    def script_load(self, source: str) -> str:
        return "sha-loaded-on-the-old-masters"

    def eval(self, source: str, numkeys: int, *keys_and_args: Any) -> Any:
        self.evals.append((numkeys, *keys_and_args))
        return "ran"

    def get_encoder(self) -> Any:
        return redis.Redis().get_encoder()


def test_a_script_the_serving_node_lacks_runs_as_eval_not_a_second_evalsha() -> None:
    # Found by bench/chaos.py (seed 32, round 8): a Cluster master killed, the lease's
    # release met NOSCRIPT on the promoted replica twice and the run failed "crashed".
    client = LoadsElsewhere()
    lua = Lua("return KEYS[1]")
    assert lua(cast(redis.Redis, client), ["fleet:k"], ["a"]) == "ran"
    registered = _cluster_class().register_script(client, "return KEYS[1]")
    assert registered(keys=["fleet:k"], args=["b"]) == "ran"
    assert client.evals == [(1, "fleet:k", "a"), (1, "fleet:k", "b")]
