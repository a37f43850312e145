"""Lease fencing inside the store's writes, the per-process heartbeat, presence, the outbox."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import LeaseLost
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner
from fleet.models import Collaborator, Event, Message, WorkerPresence, now_ms
from fleet.storage.leases import LeaseKeeper
from fleet.storage.store import TraceStore
from fleet.storage.writes import TraceWrite
from fleet.testing import ScriptedModel
from tests.test_runner import make_fleet
from tests.test_store import make_trace, run_concurrently, user, wait_until

WRITES: dict[str, Callable[[TraceStore], Any]] = {
    "append_message": lambda s: s.append_message(user("t1")),
    "record_turn": lambda s: s.record_turn(
        "t1", user("t1"), Event(kind="message", trace_id="t1"), iteration=1
    ),
    "update_trace": lambda s: s.update_trace("t1", status="failed"),
    "update_trace_and_emit": lambda s: s.update_trace_and_emit(
        "t1", "t1", Event(kind="trace", trace_id="t1"), status="failed"
    ),
    "add_stats": lambda s: s.add_stats("t1", messages=1, cost_usd=0.5),
    "put_collaborator": lambda s: s.put_collaborator(
        "t1", Collaborator(name="c", trace_id="c1", status="completed")
    ),
    "emit": lambda s: s.emit("t1", Event(kind="trace", trace_id="t1")),
    "create_trace": lambda s: s.create_trace(make_trace("t1@child", parent_trace_id="t1")),
    "apply": lambda s: s.apply(
        TraceWrite("t1", "t1").append(user("t1")).update(status="failed").add_stats(messages=1)
    ),
    "append_collected": lambda s: s.append_collected(
        Message(trace_id="t1", role="tool", tool_call_id="call-1", content="x")
    ),
}


def state(store: TraceStore) -> tuple[Any, ...]:
    """Everything the writes above could change."""
    trace = store.get_trace("t1")
    return (
        trace.status,
        trace.stats,
        [m.content for m in store.messages("t1")],
        store.collaborators("t1"),
        len(store.read_events("t1")),
        store.children("t1"),
    )


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_fenced_write_succeeds_while_the_lease_is_ours(store: TraceStore, write: str) -> None:
    store.create_trace(make_trace("t1"))
    assert store.acquire_lease("t1", "me", 10_000)
    before = state(store)
    WRITES[write](store.fenced("t1", "me"))
    assert state(store) != before


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_fenced_write_after_a_takeover_is_rejected_and_changes_nothing(
    store: TraceStore, write: str
) -> None:
    store.create_trace(make_trace("t1"))
    assert store.acquire_lease("t1", "frozen", 50)
    fenced = store.fenced("t1", "frozen")
    wait_until(lambda: store.acquire_lease("t1", "survivor", 10_000))  # the lease lapsed
    before = state(store)
    with pytest.raises(LeaseLost, match="t1"):
        WRITES[write](fenced)
    assert state(store) == before
    WRITES[write](store)  # unfenced writers (collect, stop) are not affected


def test_a_fenced_write_without_any_lease_is_rejected(store: TraceStore) -> None:
    store.create_trace(make_trace("t1"))
    with pytest.raises(LeaseLost):
        store.fenced("t1", "nobody").append_message(user("t1"))
    assert store.messages("t1") == []


def test_beat_renews_every_lease_in_one_call_and_reports_lost_ones(store: TraceStore) -> None:
    for i in range(5):
        assert store.acquire_lease(f"t{i}", "me", 10_000)
    store.release_lease("t3", "me")
    assert store.acquire_lease("t3", "other", 10_000)
    leases = [(f"t{i}", "me") for i in range(5)]
    assert store.beat(leases, 60_000, None) == [True, True, True, False, True]
    assert store.expired_leases(now_ms() + 30_000) == ["t3"]  # the others: renewed to 60 s
    assert store.lease_holder("t3") == "other"
    assert store.lease_holder("t9") is None


def test_presence_lists_live_consumers_per_queue(store: TraceStore) -> None:
    a = WorkerPresence(node="a@h", queues=["fleet.main", "fleet.explore"])
    b = WorkerPresence(node="b@h", queues=["fleet.explore"])
    store.beat([], 60_000, a)
    store.beat([], 50, b)
    assert store.live_consumers("fleet.main") == ["a@h"]
    wait_until(lambda: store.live_consumers("fleet.explore") == ["a@h"])  # b's lapsed
    assert store.live_consumers("fleet.evaluate") == []
    store.drop_presence(a)
    assert store.live_consumers("fleet.main") == []


def test_outbox_gives_each_due_entry_to_one_caller_and_back_if_unfinished(
    store: TraceStore,
) -> None:
    now = now_ms()
    for i in range(20):
        store.outbox_put(f"run t{i}", now - 1)
    store.outbox_put("run later", now + 60_000)
    claims = run_concurrently(8, lambda _: store.outbox_claim(now, 500))
    claimed = [entry for batch in claims for entry in batch]
    assert sorted(claimed) == sorted(f"run t{i}" for i in range(20))
    assert store.outbox_claim(now, 500) == []  # pushed back by the claim
    for entry in claimed[1:]:
        store.outbox_done(entry)
    assert store.outbox_claim(now + 1_000, 500) == [claimed[0]]  # unfinished: due again


@pytest.mark.serial  # a 300 ms lease renewed by a thread: another process's CPU starves it
def test_one_keeper_renews_every_held_lease_and_flags_a_takeover(store: TraceStore) -> None:
    keeper = LeaseKeeper(store, ttl_ms=300)
    for i in range(3):
        assert store.acquire_lease(f"t{i}", "me", 300)
    before = _heartbeat_threads()
    with (
        keeper.hold("t0", "me") as first,
        keeper.hold("t1", "me") as second,
        keeper.hold("t2", "me"),
    ):
        deadline = now_ms() + 1_000
        wait_until(lambda: now_ms() > deadline, timeout_s=2)  # > 3 TTLs: renewed, not lapsed
        assert not store.acquire_lease("t0", "other", 10_000)
        store.release_lease("t1", "me")
        assert store.acquire_lease("t1", "other", 10_000)
        wait_until(second.lost.is_set)
        assert not first.lost.is_set()
        assert _heartbeat_threads() - before <= 1  # one for three leases (other keepers idle)
    keeper.stop()


def _heartbeat_threads() -> int:
    return sum(t.name == "fleet-leases" for t in threading.enumerate())


class FreezingModel(ScriptedModel):
    """Answers `step`; during the first call the runner "freezes" and loses its lease."""

    def __init__(self, store: TraceStore, trace_id: str, steps: list[Any]) -> None:
        super().__init__(steps)
        self.store = store
        self.trace_id = trace_id

    def complete(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        if len(self.requests) == 0:  # another runner takes over while we are away
            holder = self.store.lease_holder(self.trace_id)
            assert holder is not None
            self.store.release_lease(self.trace_id, holder)
            assert self.store.acquire_lease(self.trace_id, "survivor", 60_000)
        return super().complete(messages, tools, **kw)


def test_a_runner_that_lost_its_lease_during_the_model_call_writes_nothing(
    tmp_path: Path,
) -> None:
    local = make_fleet(tmp_path, ScriptedModel([]))
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    local.runtime.clients["test"] = FreezingModel(local.store, root.trace_id, ["the answer"])
    before = local.store.snapshot(root.trace_id)
    heartbeat = local.runtime.lease_keeper()
    heartbeat.interval_s = 3600.0  # no renewal notices the takeover: only the fence can

    result = Runner(local.runtime).run(root.trace_id)

    assert result.outcome == "lost"
    after = local.store.snapshot(root.trace_id)
    assert before.messages == []
    assert after.messages == []  # the first messages go with the first turn: none written
    assert after.trace.status == "running" and after.trace.iteration == 0
    assert after.trace.stats.messages == 0 and after.trace.stats.duration_ms == 0
    assert local.store.lease_holder(root.trace_id) == "survivor"
