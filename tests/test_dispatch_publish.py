"""The chord of an explore as it reaches Redis: stamped, sent in one pipeline, unsubscribed."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import chord
from celery._state import _set_task_join_will_block, _task_stack
from celery.canvas import Signature
from celery.signals import before_task_publish

from fleet.limits.trees import DEFAULT_SCHEDULE
from fleet.models import Trace
from fleet.runtime import SpawnRequest
from workers.app import MAX_RUN_S, SOFT_LIMIT_S, app, one_pipeline
from workers.dispatch import CeleryDispatcher, run_signature, trace_schedule
from workers.patches import chord_join
from workers.patches.chords import send_chord

pytestmark = pytest.mark.integration

NO_TREES = SimpleNamespace(trees=None)
"""The one part of a runtime the dispatcher reads: trees without a schedule (chords)."""


@pytest.fixture
def sender(redis_url: str, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """The workers' app on this Redis, sending as a worker does (no result waits)."""
    app.conf.broker_url = app.conf.result_backend = redis_url
    redis_client.delete("fleet.explore", "fleet.main")
    _set_task_join_will_block(True)
    yield redis_client
    _set_task_join_will_block(False)
    redis_client.delete("fleet.explore", "fleet.main")


def request(n: int) -> SpawnRequest:
    children = tuple(
        Trace(
            trace_id=f"root@explore-{i:03d}",
            root_trace_id="root",
            parent_trace_id="root",
            mode="explore",
            preset="explore",
            task=f"branch {i}",
            name=f"explore-{i:03d}",
            parent_tool_call_id="call_1",
        )
        for i in range(1, n + 1)
    )
    return SpawnRequest("root", "root", "call_1", "agent", "explore", children)


def queued(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The kombu envelopes waiting in a queue, oldest first."""
    return [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]


def commands(client: redis.Redis) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in client.info("commandstats").items()}


def test_every_header_task_carries_the_tree_stamps(sender: redis.Redis) -> None:
    CeleryDispatcher().dispatch(NO_TREES, request(3))  # type: ignore[arg-type]
    messages = queued(sender, "fleet.explore")
    assert [m["headers"]["argsrepr"].split("'")[1] for m in messages] == [
        "root@explore-001",
        "root@explore-002",
        "root@explore-003",
    ]
    for message in messages:
        headers = message["headers"]
        # What revoke_by_stamped_headers and request.stamps read.
        assert headers["stamps"] == {"parent_trace_id": "root", "root_trace_id": "root"}
        assert sorted(headers["stamped_headers"]) == ["parent_trace_id", "root_trace_id"]
        body = json.loads(base64.b64decode(message["body"]))
        collect = body[2]["chord"]
        assert collect["task"] == "fleet.collect" and collect["args"] == ["root", "call_1"]
        # What the fleet's join (workers.patches.chord_join) needs: runs store no result, the size.
        assert headers["ignore_result"] is True
        assert collect["options"]["chord_size"] == 3
        assert collect["options"]["root_trace_id"] == "root"
        assert collect["options"]["link_error"][0]["options"]["parent_trace_id"] == "root"


class NotRead:
    """Trees whose schedule must not be read."""

    def schedule(self, root_trace_id: str) -> None:
        raise AssertionError(f"the schedule of {root_trace_id!r} was read")


def test_a_root_without_a_schedule_is_dispatched_without_reading_one(sender: redis.Redis) -> None:
    runtime = SimpleNamespace(trees=NotRead())
    CeleryDispatcher().dispatch(runtime, replace(request(2), scheduled=False))  # type: ignore[arg-type]
    assert len(queued(sender, "fleet.explore")) == 2
    with pytest.raises(AssertionError, match="was read"):  # not known: read, as before
        CeleryDispatcher().dispatch(runtime, request(2))  # type: ignore[arg-type]


def test_a_root_without_a_schedule_resumes_without_reading_one() -> None:
    runtime = SimpleNamespace(trees=NotRead())
    root = request(1).children[0].model_copy(update={"trace_id": "root", "parent_trace_id": None})
    unsaid = root.model_copy(update={"run": root.run.model_copy(update={"scheduled": None})})
    said = root.model_copy(update={"run": root.run.model_copy(update={"scheduled": False})})
    assert trace_schedule(runtime, said) == DEFAULT_SCHEDULE  # type: ignore[arg-type]
    for trace in (unsaid, request(1).children[0]):  # an earlier release's root; a child
        with pytest.raises(AssertionError, match="was read"):
            trace_schedule(runtime, trace)  # type: ignore[arg-type]


def test_the_header_goes_out_in_one_pipeline_without_subscriptions(sender: redis.Redis) -> None:
    before = commands(sender)
    CeleryDispatcher().dispatch(NO_TREES, request(40))  # type: ignore[arg-type]
    after = commands(sender)
    sent = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert sent.get("cmdstat_lpush") == 40  # every header message
    assert sent.get("cmdstat_publish") == 2  # their task-sent events, 32 per message
    assert "cmdstat_subscribe" not in sent, "the sender subscribed to header results"
    # The channels of this chord's tasks (the server's list is shared: an earlier module's
    # result consumer in this process may still be subscribed to its own).
    ids = {message["headers"]["id"] for message in queued(sender, "fleet.explore")}
    assert len(ids) == 40
    subscribed = set(sender.pubsub_channels("celery-task-meta-*"))
    assert not {f"celery-task-meta-{task_id}" for task_id in ids} & subscribed
    assert list(sender.scan_iter("celery-taskset-meta-*")) == [], (
        "no size key: see workers.patches.chord_join"
    )


def test_a_failing_block_sends_nothing(sender: redis.Redis) -> None:
    with pytest.raises(RuntimeError), one_pipeline(app):
        app.send_task("fleet.run_agent", args=("x",), queue="fleet.explore")
        raise RuntimeError("before the flush")
    assert sender.llen("fleet.explore") == 0


def test_every_header_task_has_its_task_sent_event_in_a_batch(sender: redis.Redis) -> None:
    with sender.pubsub() as pubsub:
        pubsub.psubscribe("*celeryev*")
        pubsub.get_message(timeout=1.0)  # the subscription's confirmation
        CeleryDispatcher().dispatch(NO_TREES, request(40))  # type: ignore[arg-type]
        batches = []
        while (raw := pubsub.get_message(timeout=0.5)) is not None:
            envelope = json.loads(raw["data"])
            batches.append(json.loads(base64.b64decode(envelope["body"])))
    assert [len(b) for b in batches] == [32, 8]
    events = [e for b in batches for e in b]
    assert {e["type"] for e in events} == {"task-sent"}
    ids = {m["headers"]["id"] for m in queued(sender, "fleet.explore")}
    assert {e["uuid"] for e in events} == ids
    assert all(e["args"].startswith("('root@explore-") for e in events)  # argsrepr, redacted
    assert all(e["queue"] == "fleet.explore" for e in events)


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def numbered(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`value` with every id numbered by first appearance."""
    ids: dict[str, str] = {}
    text = UUID.sub(lambda m: ids.setdefault(m.group(0), f"id{len(ids)}"), json.dumps(value))
    return list(json.loads(text))


def canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with their bodies decoded and every id numbered by first appearance."""
    return numbered([dict(m, body=json.loads(base64.b64decode(m["body"]))) for m in messages])


def celery_chord(header: list[Signature], body: Signature) -> None:
    """What `send_chord` stands for, sent the way Celery's canvas sends it."""
    with one_pipeline(app):
        chord(header, body).apply_async()


def fleet_chord(header: list[Signature], body: Signature) -> None:
    with one_pipeline(app):
        send_chord(app, header, body)


def collect_body(size: int, fleet_join: bool) -> Signature:
    options = {chord_join.SIZE_OPTION: size} if fleet_join else {}
    body = Signature("fleet.collect", args=("root", "call_1"), options=options)
    body.set(queue="fleet.main")
    body.link_error(Signature("fleet.collect_failed", args=("root",), immutable=True))
    return body


Sent = tuple[list[dict[str, Any]], Any, list[str], list[dict[str, Any]]]
"""The header messages (every priority's queue), the `.s` size key, every other key, the events."""

EVENT_CLOCK = ("timestamp", "clock", "local_received", "utcoffset", "pid")


def sent_by(send: Any, client: redis.Redis, make_header: Any, body: Signature, queue: str) -> Sent:
    """What one way of sending a chord leaves in Redis and says in its task-sent events."""
    client.flushdb()
    header = make_header()
    with client.pubsub() as pubsub:
        pubsub.psubscribe("*celeryev*")
        pubsub.get_message(timeout=1.0)  # the subscription's confirmation
        send(header, body)
        events = []
        while (raw := pubsub.get_message(timeout=0.2)) is not None:
            events += json.loads(base64.b64decode(json.loads(raw["data"])["body"]))
    lists = sorted(str(k) for k in client.keys(f"{queue}*"))
    messages = [m for key in lists for m in queued(client, key)]
    group_id = messages[0]["headers"]["group"]
    chord_size = client.get(f"celery-taskset-meta-{group_id}.s")
    # Not kombu's queue bindings: this process declares them once, whoever sends first.
    every = (str(k) for k in client.keys("*") if not str(k).startswith("_kombu.binding"))
    keys = sorted(UUID.sub("ID", k) for k in every)
    for event in events:
        for field in EVENT_CLOCK:
            event.pop(field, None)
    return canonical(messages), chord_size, keys, numbered(events)


def assert_same_chord(client: redis.Redis, make_header: Any, body: Signature) -> Sent:
    """`send_chord` and Celery's canvas sent the same: returns what `send_chord` sent."""
    celery = sent_by(celery_chord, client, make_header, body.clone(), "fleet.explore")
    fleet = sent_by(fleet_chord, client, make_header, body.clone(), "fleet.explore")
    assert fleet[0] == celery[0]  # headers, properties, the body with the frozen chord body
    assert fleet[1] == celery[1]  # the chord's size key (Celery's join) or none
    assert fleet[2] == celery[2]  # and no other key
    assert fleet[3] == celery[3]  # a task-sent event per header, with the same fields
    assert len(fleet[3]) == len(fleet[0])
    return fleet


@pytest.mark.parametrize(("size", "fleet_join"), [(1, False), (3, False), (3, True)])
def test_send_chord_sends_what_a_celery_chord_sends(
    sender: redis.Redis, size: int, fleet_join: bool
) -> None:
    """Celery's join (a `.s` size key) or the fleet's (the size in the body, no key)."""
    children = request(size).children
    fleet = assert_same_chord(
        sender, lambda: [run_signature(c) for c in children], collect_body(size, fleet_join)
    )
    assert fleet[0][-1]["headers"]["group_index"] == size - 1
    assert fleet[0][0]["body"][2]["chord"]["options"]["link_error"][0]["task"] == (
        "fleet.collect_failed"
    )
    # The chord's size in the backend: Celery's key, or none for the fleet's join.
    assert fleet[1] == (None if fleet_join else str(size))


def test_headers_from_the_template_at_a_batch_priority(sender: redis.Redis) -> None:
    """A batch tree's headers go to the priority list of their queue, as Celery's do."""
    children = request(4).children
    fleet = assert_same_chord(
        sender,
        lambda: [run_signature(c, priority="batch") for c in children],
        collect_body(4, True),
    )
    assert {m["properties"]["priority"] for m in fleet[0]} == {6}
    assert sender.llen("fleet.explore") == 0  # all on kombu's list for priority 6


def test_headers_that_differ_from_the_first_are_sent_by_celery(sender: redis.Redis) -> None:
    """Other kwargs, options, task, or no stamps: each such header goes through send_task."""
    children = request(6).children

    def mixed() -> list[Signature]:
        header = [run_signature(c) for c in children]
        header[1] = run_signature(children[1], kwargs={"windowed": True})
        header[2] = run_signature(children[2], priority="batch")
        header[3] = run_signature(children[3], "fleet.resume_agent")
        header[4].options.pop("shadow")
        return header

    fleet = assert_same_chord(sender, mixed, collect_body(6, True))
    assert [m["headers"]["group_index"] for m in fleet[0]] == [0, 1, 3, 4, 5, 2]  # by list


def test_headers_sent_inside_a_task_carry_its_root_and_parent(sender: redis.Redis) -> None:
    """A worker's root dispatches from inside its task: Celery's root and parent ids."""
    task = app.tasks["celery.backend_cleanup"]
    task.push_request(id="the-parent-task", root_id="the-root-task", called_directly=False)
    _task_stack.push(task)
    try:
        children = request(3).children
        fleet = assert_same_chord(
            sender, lambda: [run_signature(c) for c in children], collect_body(3, True)
        )
    finally:
        _task_stack.pop()
        task.pop_request()
    assert {m["headers"]["root_id"] for m in fleet[0]} == {"the-root-task"}
    assert {m["headers"]["parent_id"] for m in fleet[0]} == {"the-parent-task"}


def test_headers_of_a_registered_task_carry_its_time_limits(sender: redis.Redis) -> None:
    """In a worker the header's task is registered: `send_task` adds its options."""
    import workers.tasks  # noqa: F401  (registers fleet.run_agent with its time limits)

    children = request(3).children
    fleet = assert_same_chord(
        sender, lambda: [run_signature(c) for c in children], collect_body(3, True)
    )
    assert {tuple(m["headers"]["timelimit"]) for m in fleet[0]} == {(MAX_RUN_S, SOFT_LIMIT_S)}


def test_a_publish_signal_receiver_sees_every_header(sender: redis.Redis) -> None:
    """With a receiver (an OTel instrumentation adds headers there), no template."""
    seen: list[str] = []

    def receiver(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers["id"])
        headers["traceparent"] = "00-trace-span-01"

    before_task_publish.connect(receiver, weak=False)
    try:
        children = request(3).children
        fleet = assert_same_chord(
            sender, lambda: [run_signature(c) for c in children], collect_body(3, True)
        )
    finally:
        before_task_publish.disconnect(receiver)
    assert len(seen) == 6  # three headers, sent twice
    assert all(m["headers"]["traceparent"] == "00-trace-span-01" for m in fleet[0])


def test_an_empty_header_sends_the_body_at_once(sender: redis.Redis) -> None:
    sent = []
    for send in (celery_chord, fleet_chord):
        sender.flushdb()
        send([], Signature("fleet.collect", args=("root", "call_1"), queue="fleet.main"))
        sent.append(canonical(queued(sender, "fleet.main")))
    assert sent[1] == sent[0]
    assert sent[1][0]["body"][0] == [[], "root", "call_1"]  # no results, then its own args
