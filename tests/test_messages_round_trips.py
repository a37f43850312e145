"""Messages cost a run no round trip of their own until one arrives (issue 40).

The inbox's newest entry comes back with `begin_run` and with each turn's write; the
`## Messages` block reads the inbox only when that says something arrived, the watcher
polls from its own thread, and a stop that lands as the last call returns is read by
the run's last write (refused whole: the trace ends `stopped`, its answer dropped).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.conversation.messages import ANNOUNCED_KEY, CHECK_MESSAGES, send
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import StopLanded
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner
from fleet.models import Message, Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.storage.writes import TraceWrite
from fleet.testing import ScriptedModel, call, text
from tests.fleetkit import RecordingDispatcher
from tests.test_round_trips import explorer, meter, spawned, worker_runtime

__all__ = ["meter"]  # the round-trip meter, a fixture of test_round_trips


def users(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages if m["role"] == "user"]


def recording_explorer(seen: list[tuple[list[str], list[str]]]) -> ScriptedModel:
    """`explorer(2)` that keeps each branch call's user texts and offered tool names."""
    inner = explorer(2)

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if any(str(m["content"]).startswith("branch") for m in messages if m["role"] == "user"):
            seen.append((users(messages), [t["function"]["name"] for t in tools]))
        answered: LLMResponse = inner.complete(messages, tools)
        return answered

    return ScriptedModel(function=respond)


@pytest.mark.integration
def test_a_message_waiting_for_a_branch_costs_its_run_one_read(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int]
) -> None:
    seen: list[tuple[list[str], list[str]]] = []
    store = RedisStore(redis_client)
    runtime, recorder = worker_runtime(store, tmp_path, recording_explorer(seen))
    first, second = spawned(runtime, recorder, 2).child_ids
    send(runtime, first, "look at the tests too", sender="lead")
    me = threading.get_ident()
    # Every connection opened again: what a loaded machine did once (the other threads held
    # the idle ones), and a new connection's handshake is redis-py's, not the run's.
    redis_client.connection_pool.disconnect()
    meter[me] = 0
    assert Runner(runtime).run(first).outcome == "completed"
    # begin_run, the inbox read (XRANGE), the note with the first messages, the turn's
    # write, the finish.
    assert meter[me] == 3 + 2
    (told, offered), (again, _) = seen
    assert any('1 new message from "lead"' in u for u in told) and CHECK_MESSAGES in offered
    assert sum("## Messages" in u for u in again) == 1, "announced once, not again"
    meter[me], seen[:] = 0, []
    assert Runner(runtime).run(second).outcome == "completed"
    assert meter[me] == 3, "no mail: no read of the inbox"
    assert seen and all(CHECK_MESSAGES not in offered for _, offered in seen)


@pytest.mark.integration
def test_a_message_sent_during_a_call_is_announced_before_the_next(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = RedisStore(redis_client)
    sender: list[Runtime] = []

    def mid_call(task: str, made: int) -> None:
        if task == "branch 0" and made == 0:  # from another thread, as `fleet send` would
            (child,) = [t for t in recorder.requests[0].child_ids if t.endswith("001")]
            mailer = threading.Thread(target=send, args=(sender[0], child, "hurry"))
            mailer.start()
            mailer.join()

    model = explorer(1, mid_call)
    runtime, recorder = worker_runtime(store, tmp_path, model)
    sender.append(runtime)
    (child,) = spawned(runtime, recorder, 1).child_ids
    assert Runner(runtime).run(child).outcome == "completed"
    stored = store.messages(child)
    [block] = [m for m in stored if ANNOUNCED_KEY in m.metadata]
    assert "hurry" in str(block.content)
    answers = [m for m in stored if m.role == "assistant"]
    assert block.sequence < answers[-1].sequence, "announced before the second call"


class StopsAsItAnswers:
    """A model whose last answer comes back just as someone stops the trace."""

    def __init__(self, store: TraceStore) -> None:
        self.store, self.trace_id = store, ""

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if not any(m["role"] == "tool" for m in messages):
            return call("list_dir", path=".")
        self.store.request_stop(self.trace_id)  # lands in the instant before the answer
        return text("the answer nobody may keep")


def test_a_stop_as_the_last_call_returns_ends_the_trace_stopped(
    store: TraceStore, tmp_path: Path
) -> None:
    stopper = StopsAsItAnswers(store)
    model = ScriptedModel(function=stopper.respond)
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(settings, store, RecordingDispatcher(), clients={"test": model})
    root = create_root(runtime, TaskSpec("look around", "test", mode="main"))
    stopper.trace_id = root.trace_id
    assert Runner(runtime).run(root.trace_id).outcome == "stopped"
    trace = store.get_trace(root.trace_id)
    assert trace.status == "stopped" and trace.answer is None
    assert trace.run.stop_reason == "stop"
    stored = store.messages(root.trace_id)
    assert not any("nobody may keep" in str(m.content) for m in stored), "the answer dropped"
    assert store.lease_holder(root.trace_id) is None


def trace_of(trace_id: str) -> Trace:
    return Trace.model_validate({"trace_id": trace_id, "root_trace_id": trace_id, "task": "do"})


def test_a_write_refused_for_a_stop_writes_nothing(store: TraceStore) -> None:
    store.create_trace(trace_of("t1"))
    note = Message(trace_id="t1", role="user", content="kept")
    assert store.apply(TraceWrite("t1", "t1").append(note).refused_if_stopped()).messages
    store.request_stop("t1")

    def ending() -> TraceWrite:
        late = TraceWrite("t1", "t1").append(note.model_copy(update={"content": "no"}))
        return late.update(None, status="completed")

    with pytest.raises(StopLanded):
        store.apply(ending().refused_if_stopped())
    assert [m.content for m in store.messages("t1")] == ["kept"]
    assert store.get_trace("t1").status == "queued"
    # Without the guard a write goes in as ever (a stop's own finish, a parent's entry).
    assert store.apply(ending()).messages
