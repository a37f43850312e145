"""What a spawn costs the store before its children are handed over, and what it keeps.

A root's `agent` answer on a task queue: the model turn is stored, refused whole if a stop
landed during the call (one script); the children are created with their outbox entry
(one script); the results' write carries the children's entries, the plan linking them
and the parent's wait, and reads the stop flag (one script). Nothing else before the
dispatcher. A worker killed between the two leaves the children with their outbox entry,
on Redis and in the memory twin alike.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.conversation.roots import TaskSpec, create_root
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner
from fleet.runtime import Runtime, SpawnRequest
from fleet.settings import Settings
from fleet.storage import outbox
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.storage.writes import PutCollaborator, TraceWrite
from fleet.testing import MemoryStore, ScriptedModel, call, calls, text
from tests.fleetkit import RecordingDispatcher
from tests.test_round_trips import CONFIG, MODEL, Killed, meter, turns, worker_runtime

pytestmark = pytest.mark.integration
__all__ = ["meter"]  # the fixture, used by name


class AtDispatch(RecordingDispatcher):
    """A task queue's dispatcher that notes this thread's round trips when handed children."""

    def __init__(self, trips: Counter[int]) -> None:
        super().__init__(children_survive_restart=True)
        self.trips, self.seen = trips, [-1]

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        self.seen[0] = self.trips[threading.get_ident()]
        super().dispatch(runtime, request)


def root_model(first: Callable[[], LLMResponse], on_answer: Callable[[], None]) -> Any:
    """The root answers `first` once, then sums up; each branch answers at once."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        if task.startswith("branch"):
            return text("found")
        if turns(messages) == 0:
            on_answer()
            return first()
        return text("summary")

    return ScriptedModel(function=respond)


def queue_runtime(store: TraceStore, tmp_path: Path, model: Any, queue: AtDispatch) -> Runtime:
    """A worker's runtime on a task queue (`worker_runtime`'s gate on Redis)."""
    if isinstance(store, RedisStore):
        runtime, _ = worker_runtime(store, tmp_path, model)
    else:
        runtime = Runtime.build(Settings(workspace=tmp_path, env={}), store, queue)
        runtime = replace(runtime, config=CONFIG, clients={MODEL: model})
    return replace(runtime, dispatcher=queue)


def explore(branches: int) -> LLMResponse:
    return call("agent", task=[f"branch {i}" for i in range(branches)])


@pytest.mark.parametrize("planned", [False, True], ids=["no plan", "a plan of an earlier turn"])
def test_a_spawn_makes_three_round_trips_between_the_answer_and_the_dispatch(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int], planned: bool
) -> None:
    me, answered = threading.get_ident(), [-1]
    store = RedisStore(redis_client)
    queue = AtDispatch(meter)

    def on_answer() -> None:
        answered[0] = meter[me]

    runtime = queue_runtime(store, tmp_path, root_model(lambda: explore(4), on_answer), queue)
    for _ in range(2):  # the first loads the scripts (NOSCRIPT, SCRIPT LOAD)
        queue.requests.clear()
        root = create_root(runtime, TaskSpec("survey", MODEL, mode="main"))
        if planned:  # a plan the run read with its lease: linked without a read of its own
            trace = store.get_trace(root.trace_id)
            trace.goals.add("map the code")
            store.update_trace(root.trace_id, goals=trace.goals)
        assert Runner(runtime).run(root.trace_id).outcome == "waiting"
    (request,) = queue.requests
    # The model turn (refused if a stop landed), the children with their outbox entry, the
    # results with the children's entries, the plan linking them and the wait: was 8.
    assert queue.seen[0] - answered[0] == 3
    parent = store.get_trace(root.trace_id)
    assert parent.status == "waiting"
    entries = store.collaborators(root.trace_id)
    assert [c.trace_id for c in entries] == list(request.child_ids)
    if planned:
        assert parent.goals.goals[0].sub_trace_ids == list(request.child_ids)
    entry = outbox.spawn_entry(root.trace_id, request.tool_call_id)
    assert entry not in store.outbox_claim(2**62, 1000), "done once handed over"


def test_a_goal_call_in_the_same_turn_is_read_before_the_children_are_linked(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int]
) -> None:
    store = RedisStore(redis_client)
    queue = AtDispatch(meter)

    def first() -> LLMResponse:
        return calls(
            ("goal", {"action": "add", "description": "map it"}), ("agent", {"task": ["a", "b"]})
        )

    runtime = queue_runtime(store, tmp_path, root_model(first, lambda: None), queue)
    root = create_root(runtime, TaskSpec("survey", MODEL, mode="main"))
    assert Runner(runtime).run(root.trace_id).outcome == "waiting"
    (request,) = queue.requests
    (goal,) = store.get_trace(root.trace_id).goals.goals
    assert goal.description == "map it" and goal.sub_trace_ids == list(request.child_ids)


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_worker_killed_between_the_children_and_the_turn_leaves_their_outbox_entry(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int], backend: str
) -> None:
    store: TraceStore = RedisStore(redis_client) if backend == "redis" else MemoryStore()
    queue = AtDispatch(meter)
    runtime = queue_runtime(store, tmp_path, root_model(lambda: explore(3), lambda: None), queue)
    root = create_root(runtime, TaskSpec("survey", MODEL, mode="main"))
    apply = store.apply

    def dies_at_the_turn(write: TraceWrite) -> Any:
        if any(isinstance(op, PutCollaborator) for op in write.ops):
            raise Killed
        return apply(write)

    store.apply = dies_at_the_turn  # type: ignore[method-assign]
    with pytest.raises(Killed):
        Runner(runtime).run(root.trace_id)
    store.apply = apply  # type: ignore[method-assign]
    children = store.children(root.trace_id)
    assert len(children) == 3 and queue.requests == []
    call_id = store.get_trace(children[0]).parent_tool_call_id or ""
    assert store.outbox_claim(2**62, 1000) == [outbox.spawn_entry(root.trace_id, call_id)]
    parent = store.get_trace(root.trace_id)
    assert parent.status == "running", "nothing of the turn"
    assert store.collaborators(root.trace_id) == []


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_a_stop_that_lands_during_the_spawning_call_creates_no_child(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int], backend: str
) -> None:
    """The model turn's own write is refused (no read of the flag): nothing of it is written."""
    store: TraceStore = RedisStore(redis_client) if backend == "redis" else MemoryStore()
    queue = AtDispatch(meter)
    roots: list[str] = []

    def stopped_meanwhile() -> LLMResponse:
        store.request_stop(roots[0])
        return explore(3)

    runtime = queue_runtime(store, tmp_path, root_model(stopped_meanwhile, lambda: None), queue)
    root = create_root(runtime, TaskSpec("survey", MODEL, mode="main"))
    roots.append(root.trace_id)
    assert Runner(runtime).run(root.trace_id).outcome == "stopped"
    assert store.get_trace(root.trace_id).status == "stopped"
    assert store.children(root.trace_id) == [] and queue.requests == []
    assert store.outbox_claim(2**62, 1000) == []
    assert store.messages(root.trace_id) == [], "nothing of the turn was written"
