"""The fleet's chord join (`workers.patches.chord_join`) on a real Redis: each part once, the
body once.

Header parts are reported as a worker reports them (`app.backend.on_chord_part_return` with
the task's request), and the body is published to the real broker queue it is sent to.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from amqp.exceptions import ConnectionForced  # type: ignore[import-untyped]
from celery import states
from celery._state import _set_task_join_will_block
from celery.app.task import Context
from celery.canvas import Signature

from fleet.errors import LeaseLost
from fleet.models import Trace, now_ms
from fleet.storage import keys as fleet_keys
from fleet.storage import outbox
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.writes import TraceWrite
from tests.fleetkit import wait_until
from workers.app import app
from workers.patches import chord_join

pytestmark = pytest.mark.integration

BODY_QUEUE = "fleet.main"


@pytest.fixture
def conn(redis_url: str, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The workers' app on this (emptied) Redis as broker and backend, as in a worker."""
    app.conf.broker_url = app.conf.result_backend = redis_url
    _set_task_join_will_block(True)
    yield redis_client
    _set_task_join_will_block(False)


def chord_body(size: int | None, task: str = chord_join.BODY_TASK) -> dict[str, Any]:
    """A chord body as a header message carries it: collect, its errback, the size option."""
    options: dict[str, Any] = {"task_id": str(uuid.uuid4()), "argsrepr": "collect root call_1"}
    if size is not None:
        options[chord_join.SIZE_OPTION] = size
    body = Signature(task, args=("root", "call_1"), queue=BODY_QUEUE, options=options, app=app)
    # Not registered in this process: Celery sends it as a task, so the test sees it queued.
    body.link_error(Signature("tests.errback", args=("root",), queue=BODY_QUEUE, immutable=True))
    return dict(json.loads(json.dumps(body)))


class Chord:
    """One chord's header parts, reported like a worker does when each header task ends."""

    def __init__(self, size: int | None, task: str = chord_join.BODY_TASK) -> None:
        self.group_id = str(uuid.uuid4())
        self.body = chord_body(size, task)
        self.task_ids = [str(uuid.uuid4()) for _ in range(size or 1)]

    def trace_id(self, index: int) -> str:
        return f"root@explore-{index + 1:03d}"

    def request(self, index: int) -> Context:
        """Header task `index`'s request, as its worker has it."""
        return Context(
            id=self.task_ids[index],
            group=self.group_id,
            group_index=index,
            chord=self.body,
            args=[self.trace_id(index)],
        )

    def result(self, index: int) -> dict[str, str]:
        return {"trace_id": self.trace_id(index), "outcome": "completed"}

    def report(self, index: int, state: str = states.SUCCESS) -> None:
        """Header task `index` ended in `state` (a redelivered copy reports the same)."""
        result: Any = self.result(index)
        if state != states.SUCCESS:
            result = RuntimeError("worker lost Redis")
        app.backend.on_chord_part_return(self.request(index), state, result)

    def keys(self, conn: redis.Redis) -> list[str]:
        return sorted(conn.scan_iter(f"celery-taskset-meta-{self.group_id}*"))


def queued(conn: redis.Redis, task: str) -> list[list[Any]]:
    """The args of every message of `task` waiting in the body queue, oldest first."""
    found = []
    for raw in reversed(conn.lrange(BODY_QUEUE, 0, -1)):
        message = json.loads(raw)
        if message["headers"]["task"] == task:
            found.append(json.loads(base64.b64decode(message["body"]))[0])
    return found


def bodies(conn: redis.Redis) -> list[list[str]]:
    """The trace ids each queued collect was sent with."""
    return [[r["trace_id"] for r in args[0]] for args in queued(conn, chord_join.BODY_TASK)]


def test_each_part_counts_once_and_the_last_sends_the_body_in_header_order(
    conn: redis.Redis,
) -> None:
    chord = Chord(3)
    chord.report(2)
    chord.report(2)  # redelivered: same task id
    chord.report(0)
    assert bodies(conn) == [], "two of three parts"
    chord.report(1)
    assert bodies(conn) == [[chord.trace_id(0), chord.trace_id(1), chord.trace_id(2)]]
    (args,) = queued(conn, chord_join.BODY_TASK)
    assert args[1:] == ["root", "call_1"]


def test_a_copy_of_a_part_after_the_body_was_sent_sends_nothing(conn: redis.Redis) -> None:
    chord = Chord(2)
    chord.report(0)
    chord.report(1)
    chord.report(1)
    chord.report(0)
    assert len(bodies(conn)) == 1
    assert chord.keys(conn) == [chord_join.claim_key(app.backend, chord.group_id)], "only the mark"
    one = Chord(1)
    one.report(0)
    one.report(0)
    one.report(0)
    assert len(bodies(conn)) == 2, "a chord of one fires once too"
    assert one.keys(conn) == [chord_join.claim_key(app.backend, one.group_id)]


def test_a_claimer_lost_before_sending_leaves_the_body_to_a_later_copy(
    conn: redis.Redis,
) -> None:
    chord = Chord(2)
    chord.report(0)
    backend = app.backend
    claim = chord_join.claim_key(backend, chord.group_id)
    part = chord_join.part_of(chord.request(1), states.SUCCESS, chord.result(1))
    keys = [chord_join.parts_key(backend, chord.group_id), claim]
    args = [chord.task_ids[1], part, 2, chord_join.ttl_s(backend), chord_join.JOIN_CLAIM_S]
    owed = outbox.settle_entry("root", "call_1")
    claimed_at_ms = now_ms()
    args += [owed, claimed_at_ms + chord_join.OWED_AFTER_MS]
    script = backend.fleet_join_script
    assert script(backend.client, [*keys, fleet_keys.OUTBOX], args), "claimed; its worker dies here"
    chord.report(1)  # a copy while the claim holds
    assert bodies(conn) == []
    due_ms = conn.zscore(fleet_keys.OUTBOX, owed)
    assert due_ms == claimed_at_ms + chord_join.OWED_AFTER_MS, "the call is owed to a sweeper"
    conn.pexpire(claim, 1)  # the claim's lease lapses
    wait_until(lambda: not conn.exists(claim), 5, "the claim to lapse")
    chord.report(1)  # a copy after it: redelivered (acks_late) or retried
    assert bodies(conn) == [[chord.trace_id(0), chord.trace_id(1)]]
    assert conn.zscore(fleet_keys.OUTBOX, owed) is None, "the body is out: nothing owed"


def test_a_body_sent_owes_nothing_and_a_failed_send_stays_owed(
    conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    chord = Chord(2)
    chord.report(0)
    chord.report(1)
    assert len(bodies(conn)) == 1
    assert conn.zcard(fleet_keys.OUTBOX) == 0
    dying = Chord(1)

    class WorkerKilled(BaseException):
        """The claimer's send is cut short (a SIGKILL would not even mark the chord done)."""

    def die(*_: Any) -> None:
        raise WorkerKilled

    monkeypatch.setattr(chord_join, "fire", die)
    with pytest.raises(WorkerKilled):
        chord_join.part_returned(app.backend, dying.request(0), states.SUCCESS, dying.result(0))
    monkeypatch.undo()
    owed = outbox.settle_entry("root", "call_1")
    assert conn.zscore(fleet_keys.OUTBOX, owed) is not None, "a sweeper settles the call"
    assert len(bodies(conn)) == 1, "and no body went out for it"
    dying.report(0)  # a copy of its part
    assert len(bodies(conn)) == 1, "the sweeper's settlement is the only one"


@app.task(name="tests.settle_later_errback")
def settle_later_errback(parent_trace_id: str, tool_call_id: str, *_: Any) -> None:
    """As `fleet.collect_failed` with a child still pending: owes the call to the outbox."""
    entry = outbox.settle_entry(parent_trace_id, tool_call_id)
    app.backend.client.zadd(fleet_keys.OUTBOX, {entry: now_ms()})


def test_an_errback_run_inline_keeps_the_call_owed(conn: redis.Redis) -> None:
    chord = Chord(2)
    # Registered here, so Celery runs the errback inline (as the fleet's `collect_failed`
    # runs in a worker), in the thread that reported the last part.
    chord.body["options"]["link_error"][0]["task"] = "tests.settle_later_errback"
    chord.body["options"]["link_error"][0]["args"] = ["root", "call_1"]
    chord.report(0, states.REVOKED)
    chord.report(1)
    assert bodies(conn) == []
    owed = outbox.settle_entry("root", "call_1")
    assert conn.zscore(fleet_keys.OUTBOX, owed) is not None, "the errback's entry survives"


def test_two_hundred_parts_at_once_send_one_body_with_every_trace(conn: redis.Redis) -> None:
    chord = Chord(200)
    start = threading.Barrier(200)

    def header_task(index: int) -> None:
        start.wait()
        chord.report(index)
        chord.report(index)  # and a redelivered copy

    threads = [threading.Thread(target=header_task, args=(i,)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert bodies(conn) == [[chord.trace_id(i) for i in range(200)]]


def test_every_join_key_has_a_ttl(conn: redis.Redis) -> None:
    ttl_s = chord_join.ttl_s(app.backend)
    chord = Chord(2)
    chord.report(0)
    (parts,) = chord.keys(conn)
    assert parts == chord_join.parts_key(app.backend, chord.group_id)
    assert 0 < conn.ttl(parts) <= ttl_s
    chord.report(1)
    (claim,) = chord.keys(conn)
    assert conn.get(claim) == "done"
    # the done marker outlives a late copy of a part (the redelivery window), not a day
    window_s = app.conf.broker_transport_options["visibility_timeout"]
    assert window_s < conn.ttl(claim) <= chord_join.done_ttl_s(app.backend) < ttl_s
    assert all(conn.ttl(k) > 0 for k in conn.scan_iter("celery-*")), "nothing kept for ever"


def test_a_failed_part_runs_the_errback_once_not_the_body(conn: redis.Redis) -> None:
    chord = Chord(3)
    chord.report(0)
    chord.report(1, states.FAILURE)
    chord.report(2)
    chord.report(1, states.FAILURE)
    assert bodies(conn) == []
    assert queued(conn, "tests.errback") == [["root"]], "Celery's errback path, once"
    body_id = chord.body["options"]["task_id"]
    meta = app.backend.get_task_meta(body_id)
    assert meta["status"] == states.FAILURE
    assert "root@explore-002" in str(meta["result"]), meta


def test_other_chords_keep_celerys_join(conn: redis.Redis) -> None:
    for chord in (Chord(None, task="bench.done"), Chord(None)):  # no size: an older sender
        app.backend.set_chord_size(chord.group_id, 1)
        chord.report(0)
        assert chord_join.parts_key(app.backend, chord.group_id) not in chord.keys(conn)
        assert queued(conn, chord.body["task"])[-1][0] == [
            {"trace_id": chord.trace_id(0), "outcome": "completed"}
        ], "Celery's join sent the body with the stored results"


# A run counts its part in the write that ends its trace (`chord_join.count_in_run`).


@pytest.fixture
def store(conn: redis.Redis, redis_url: str) -> Iterator[RedisStore]:
    with RedisStore.from_url(redis_url) as trace_store:
        yield trace_store


def run_ends(store: RedisStore, chord: Chord, index: int, redis_url: str) -> Context:
    """Header `index`'s run ends its trace, its part counted in that write; its request."""
    trace_id = chord.trace_id(index)
    store.create_trace(Trace(trace_id=trace_id, root_trace_id="root", task="branch"))
    request = chord.request(index)
    part = chord_join.count_in_run(app.backend, request, redis_url)
    assert part is not None and not part.applied
    write = TraceWrite(trace_id, "root").update(status="completed").extend(part)
    store.apply(write)
    assert part.applied, "the write counted it"
    return request


def ended(request: Context, chord: Chord, index: int) -> None:
    """The task returns: Celery reports its part as for any header."""
    app.backend.on_chord_part_return(request, states.SUCCESS, chord.result(index))


def test_a_part_counted_by_the_runs_last_write_counts_once(
    conn: redis.Redis, store: RedisStore, redis_url: str
) -> None:
    chord = Chord(3)
    request = run_ends(store, chord, 0, redis_url)
    ended(request, chord, 0)
    assert conn.hlen(chord_join.parts_key(app.backend, chord.group_id)) == 1
    chord.report(0)  # a redelivered copy after the run ended: reported the usual way
    chord.report(1)
    assert bodies(conn) == [], "two parts of three, whichever way they were counted"
    chord.report(2)
    assert bodies(conn) == [[chord.trace_id(i) for i in range(3)]]


def test_the_write_that_completes_the_chord_sends_the_body_through_its_task(
    conn: redis.Redis, store: RedisStore, redis_url: str
) -> None:
    chord = Chord(2)
    chord.report(1)
    request = run_ends(store, chord, 0, redis_url)
    part = getattr(request, chord_join.COUNTED_ATTR)
    assert part.reply is not None and len(part.reply) == 2, "the write claimed the body"
    owed = chord_join.owed_settlement(chord.body)
    assert conn.zscore(fleet_keys.OUTBOX, owed) is not None, "owed until the body is out"
    assert bodies(conn) == [], "a task that dies here leaves the call to the outbox"
    ended(request, chord, 0)
    assert bodies(conn) == [[chord.trace_id(0), chord.trace_id(1)]]
    assert conn.zscore(fleet_keys.OUTBOX, owed) is None
    assert chord.keys(conn) == [chord_join.claim_key(app.backend, chord.group_id)], "marked done"
    ended(request, chord, 0)  # Celery reporting the same request twice sends nothing more
    chord.report(0)
    assert len(bodies(conn)) == 1


def test_a_fenced_write_counts_nothing_and_the_part_is_reported_after(
    conn: redis.Redis, store: RedisStore, redis_url: str
) -> None:
    chord = Chord(1)
    trace_id = chord.trace_id(0)
    store.create_trace(Trace(trace_id=trace_id, root_trace_id="root", task="branch"))
    request = chord.request(0)
    part = chord_join.count_in_run(app.backend, request, redis_url)
    assert part is not None
    write = TraceWrite(trace_id, "root").update(status="completed").extend(part)
    with pytest.raises(LeaseLost):  # the lease went to another runner: the write is refused
        store.fenced(trace_id, "not-the-owner").apply(write)
    assert not part.applied
    assert chord.keys(conn) == [], "the refused write left no part"
    ended(request, chord, 0)
    assert bodies(conn) == [[trace_id]]


def test_a_store_on_another_redis_than_the_join_counts_no_part_in_the_run(
    conn: redis.Redis, redis_url: str
) -> None:
    chord = Chord(1)
    request = chord.request(0)
    assert chord_join.count_in_run(app.backend, request, redis_url + "1") is None
    # A cluster store: the join's keys are in the group's slots, never the trace's.
    assert chord_join.count_in_run(app.backend, request, redis_url, cluster=True) is None
    assert not hasattr(request, chord_join.COUNTED_ATTR)
    assert chord_join.count_in_run(app.backend, Context(id="t", args=["x"]), redis_url) is None


def test_a_join_part_needs_a_redis_store() -> None:
    part = chord_join.join_part(app.backend, Chord(1).request(0), states.SUCCESS, None)
    assert part is not None
    write = TraceWrite("t", "t").extend(part)
    with pytest.raises(ValueError, match="one extension"):
        write.extend(part)
    memory = MemoryStore()
    memory.create_trace(Trace(trace_id="t", root_trace_id="t", task="main"))
    with pytest.raises(TypeError, match="Redis store"):
        memory.apply(write.update(status="completed"))
    assert memory.get_trace("t").status == "queued", "refused before any op"


ERRBACKS: list[str] = []


@app.task(name="tests.recording_errback")
def recording_errback(parent_trace_id: str, tool_call_id: str, *_: Any) -> None:
    """As `fleet.collect_failed`, run inline: records that it ran."""
    ERRBACKS.append(tool_call_id)


@pytest.mark.parametrize(
    "error",
    [ConnectionForced("CONNECTION_FORCED - broker forced connection closure"), OSError("reset")],
)
def test_a_body_the_broker_refuses_while_away_stays_owed_in_one_line(
    conn: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    # make chaos (seeds 38 round 29, 40 round 30, 41 round 33): a RabbitMQ restart as the
    # last part came: "Chord body ... could not be sent" with its traceback, then the
    # errback, which resumed the parent through the same broker: "Errback
    # 'fleet.collect_failed' raised an exception", Celery's traceback. The call is owed to
    # the outbox already: the body's errback is not run, one line says so.
    ERRBACKS.clear()
    chord = Chord(1)
    chord.body["options"]["link_error"][0]["task"] = "tests.recording_errback"
    chord.body["options"]["link_error"][0]["args"] = ["root", "call_1"]

    def away(*_: Any, **__: Any) -> None:
        raise error

    monkeypatch.setattr(app.amqp, "_retry_publish", away)
    with caplog.at_level("WARNING", logger=chord_join.__name__):
        chord.report(0)

    assert ERRBACKS == [], "the errback would meet the broker away again"
    assert [r.exc_info for r in caplog.records if r.name == chord_join.__name__] == [None]
    owed = outbox.settle_entry("root", "call_1")
    assert conn.zscore(fleet_keys.OUTBOX, owed) is not None, "a sweeper settles the call"
    assert bodies(conn) == []


def test_a_body_that_cannot_be_sent_for_another_reason_fails_the_chord(
    conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    ERRBACKS.clear()
    chord = Chord(1)
    chord.body["options"]["link_error"][0]["task"] = "tests.recording_errback"
    chord.body["options"]["link_error"][0]["args"] = ["root", "call_1"]

    def refuse(*_: Any, **__: Any) -> None:
        raise ValueError("cannot encode")

    monkeypatch.setattr(app.amqp, "_retry_publish", refuse)
    chord.report(0)

    assert ERRBACKS == ["call_1"], "as Celery's join: its errback runs"
