"""The owner check (`fleet.owners`): which traces nothing moves, on every store."""

from __future__ import annotations

from typing import Any

import pytest

from fleet import owners
from fleet.models import Event, Message, Trace, now_ms
from fleet.owners import Fail, Rearm, Resend, Settle
from fleet.storage import outbox
from fleet.storage.owner_index import owner_index
from fleet.storage.store import TraceStore

QUIET_MS = 10_000
LONG_AGO = 60_000
"""How long ago the traces below last changed: well past `QUIET_MS`."""


def put(store: TraceStore, trace_id: str, *, age_ms: int = LONG_AGO, **fields: Any) -> Trace:
    at = now_ms() - age_ms
    root = trace_id.split("@")[0]
    parent = trace_id.rpartition("@")[0] or None
    data: dict[str, Any] = {"trace_id": trace_id, "root_trace_id": root, "parent_trace_id": parent}
    data |= {"task": "do", "created_at_ms": at, "updated_at_ms": at, **fields}
    if parent:
        data |= {"mode": "explore", "parent_tool_call_id": data.get("parent_tool_call_id", "c1")}
    trace = Trace.model_validate(data)
    store.create_trace(trace)
    return trace


def open_call(store: TraceStore, trace_id: str, call_id: str = "c1") -> None:
    store.append_message(Message(trace_id=trace_id, role="user", content="go"))
    call = {"id": call_id, "type": "function", "function": {"name": "agent", "arguments": "{}"}}
    store.append_message(Message(trace_id=trace_id, role="assistant", tool_calls=[call]))


def remedies(store: TraceStore, root: str = "r") -> list[tuple[str, str]]:
    found = owners.unowned(store, owner_index(store), root, now_ms(), QUIET_MS)
    return sorted((r.kind, r.trace.trace_id) for r in found)


def test_a_queued_root_with_nothing_for_it_is_resent(store: TraceStore) -> None:
    put(store, "r")
    assert remedies(store) == [("resend", "r")]


def test_a_run_entry_in_the_outbox_owns_a_queued_trace(store: TraceStore) -> None:
    put(store, "r")
    store.outbox_put(outbox.run_entry("r"), now_ms() + 5_000)
    assert remedies(store) == []


def test_a_trace_changed_lately_is_left_alone(store: TraceStore) -> None:
    put(store, "r", age_ms=1_000)
    assert remedies(store) == []


def test_a_lease_owns_a_running_trace_and_its_loss_is_found(store: TraceStore) -> None:
    put(store, "r", status="running")
    assert remedies(store) == [("resend", "r")]
    store.acquire_lease("r", "worker-1", 60_000)
    assert remedies(store) == []


def test_a_lapsed_lease_is_the_sweepers_to_recover(store: TraceStore) -> None:
    put(store, "r", status="running")
    store.acquire_lease("r", "worker-1", 1)
    wait_ms = now_ms() + 5
    while now_ms() < wait_ms:  # the lease's 1 ms runs out
        pass
    assert remedies(store) == [], "in the lease index: the sweeper re-enqueues it"


def test_live_children_own_a_waiting_parent(store: TraceStore) -> None:
    put(store, "r", status="waiting")
    open_call(store, "r")
    put(store, "r@b1", status="running")
    store.acquire_lease("r@b1", "worker-1", 60_000)
    put(store, "r@b2", status="completed")
    assert remedies(store) == []


def test_a_parent_whose_children_all_ended_is_settled(store: TraceStore) -> None:
    put(store, "r", status="waiting")
    open_call(store, "r")
    put(store, "r@b1", status="completed")
    put(store, "r@b2", status="failed")
    found = owners.unowned(store, owner_index(store), "r", now_ms(), QUIET_MS)
    assert [(type(r), r.trace.trace_id) for r in found] == [(Settle, "r")]
    assert isinstance(found[0], Settle) and found[0].tool_call_id == "c1"
    store.outbox_put(outbox.settle_entry("r", "c1"), now_ms())
    assert remedies(store) == [], "a pending settle entry owns it"


def test_a_waiting_parent_whose_spawn_was_lost_is_resent(store: TraceStore) -> None:
    put(store, "r", status="waiting")
    open_call(store, "r")
    assert remedies(store) == [("resend", "r")], "resumed: the orphaned call is healed"


def test_a_person_owns_a_trace_waiting_on_them(store: TraceStore) -> None:
    put(store, "r", status="waiting", run={"waiting_on": {"question": "?"}})
    assert remedies(store) == []


def test_metadata_naming_a_person_owns_nothing(store: TraceStore) -> None:
    """The caller's metadata is not the run state: a forged `waiting_on` there hides nothing."""
    put(store, "r", status="waiting", metadata={"waiting_on": {"question": "?"}})
    open_call(store, "r")
    assert remedies(store) == [("resend", "r")]


def test_a_person_owns_a_trace_waiting_for_their_approval(store: TraceStore) -> None:
    waiting = {"kind": "approval", "tool_call_id": "c1", "tool": "bash", "question": "approve?"}
    put(store, "r", status="waiting", run={"waiting_on": waiting})
    open_call(store, "r")  # the call waiting for approval has no result, and no children
    assert remedies(store) == [], "owned by the person, not resent (which would heal the call)"


def test_a_stopped_tree_nobody_runs_is_finished(store: TraceStore) -> None:
    put(store, "r", status="waiting")
    open_call(store, "r")
    put(store, "r@b1")
    store.request_stop("r")
    store.request_stop("r@b1")
    found = owners.unowned(store, owner_index(store), "r", now_ms(), QUIET_MS)
    assert [(r.kind, r.trace.trace_id) for r in found] == [("stop", "r@b1"), ("stop", "r")]


def test_a_stopped_parent_ends_after_a_child_that_still_moves(store: TraceStore) -> None:
    """The root's stop waits for a child changed lately; its finish event comes last."""
    put(store, "r", status="waiting")
    open_call(store, "r")
    put(store, "r@b1", status="running", age_ms=1_000)  # changed lately: something may move it
    put(store, "r@b2", status="running")
    for trace_id in ("r", "r@b1", "r@b2"):
        store.request_stop(trace_id)
    assert remedies(store) == [("stop", "r@b2")], "not the root while r@b1 may still move"
    store.update_trace("r@b1", status="stopped")
    store.update_trace("r@b2", status="stopped")
    assert remedies(store) == [("stop", "r")]


def test_a_trace_healed_too_often_fails(store: TraceStore) -> None:
    put(store, "r", run={"owner_heals": owners.MAX_HEALS})
    found = owners.unowned(store, owner_index(store), "r", now_ms(), QUIET_MS)
    assert [type(r) for r in found] == [Fail]
    assert "lost: queued" in found[0].why


def test_check_skips_moving_trees_and_forgets_ended_ones(store: TraceStore) -> None:
    index = owner_index(store)
    for root in ("moving", "ended", "stuck"):
        store.track_tree(root)
    put(store, "moving")
    store.emit("moving", Event(kind="trace", trace_id="moving", status="queued"))
    put(store, "ended", status="completed")
    put(store, "stuck")
    found = owners.check(store, index, now_ms(), QUIET_MS)
    assert [(type(r), r.trace.trace_id) for r in found] == [(Resend, "stuck")]
    assert sorted(index.open_trees(10)) == ["moving", "stuck"]


def test_a_tree_whose_root_is_gone_leaves_the_index(store: TraceStore) -> None:
    index = owner_index(store)
    store.track_tree("never-created")
    assert owners.check(store, index, now_ms(), QUIET_MS) == []
    assert index.open_trees(10) == []


def test_one_claim_per_interval(store: TraceStore) -> None:
    index = owner_index(store)
    assert index.claim_check("a", 60_000)
    assert not index.claim_check("b", 60_000)


@pytest.mark.integration
def test_doctor_lists_a_trace_without_an_owner(redis_url: str, redis_client: Any) -> None:
    from fleet.settings import Settings
    from fleet.storage.backends.redis.store import RedisStore
    from fleetops.doctor import check_owners

    settings = Settings.from_env({"FLEET_REDIS_URL": redis_url, "FLEET_STUCK_AFTER_S": "10"})
    assert check_owners(settings).status == "ok"
    store = RedisStore(redis_client)
    store.track_tree("r")
    put(store, "r")
    check = check_owners(settings)
    assert check.status == "warn" and "1 without an owner: r (queued" in check.detail
    assert owner_index(store).open_trees(10) == ["r"], "the doctor only reads"


def test_a_parents_settle_entry_does_not_own_a_child_nobody_runs(store: TraceStore) -> None:
    # Found by bench/chaos.py: a recovered sibling left the call's settle entry, which
    # waits for this branch to end; its re-sent task was discarded (revoked by a stop).
    put(store, "r", status="waiting")
    open_call(store, "r")
    put(store, "r@b1", status="running")
    store.outbox_put(outbox.settle_entry("r", "c1"), now_ms() + 60_000)
    assert remedies(store) == [("resend", "r@b1")], "the parent is owned by the entry"


def test_the_watch_list_owns_a_remote_child_waiting_on_its_task(store: TraceStore) -> None:
    from fleet.storage.remote_watch import REMOTE_WATCH

    put(store, "r", status="waiting")
    open_call(store, "r")
    call = {"agent": "reviewer", "state": "sent", "task_id": "t-1"}
    put(store, "r@remote-1", status="waiting", mode="remote", run={"remote_call": call})
    assert remedies(store) == [("resend", "r@remote-1")]  # no poller watches it: run it again
    store.capability(REMOTE_WATCH).watch("r@remote-1", now_ms())
    assert remedies(store) == []


def test_the_check_visits_every_open_tree_past_a_page(store: TraceStore) -> None:
    # More open trees than one page (and than the listpack ZSCAN returns whole): each is
    # checked, the newest too (the check used to read only the `page_size` oldest).
    trees, page_size = 150, 40
    roots = [f"20261128T0000{n:03d}-{n:06x}" for n in range(trees)]
    for root in roots:
        store.track_tree(root)
        put(store, root)

    found = owners.check(store, owner_index(store), now_ms(), QUIET_MS, page_size)

    assert sorted(r.trace.trace_id for r in found) == sorted(roots)
    assert {type(r) for r in found} == {Resend}
    pages = list(owner_index(store).open_tree_pages(page_size))
    assert sorted(r for page in pages for r in page) == sorted(roots), "each root once"


def test_a_wait_on_a_person_whose_deadline_left_the_index_is_rearmed(
    store: TraceStore,
) -> None:
    # make chaos, seed 40 round 11: a Cluster master killed lost the index of waits' entry
    # (it lives apart from the trace), and an approval with a 3 s timeout waited for ever
    deadline = now_ms() - 1_000
    waiting = {"kind": "approval", "tool_call_id": "c1", "question": "?", "deadline_ms": deadline}
    put(store, "r", status="waiting", run={"waiting_on": waiting})
    open_call(store, "r")

    (remedy,) = owners.unowned(store, owner_index(store), "r", now_ms(), QUIET_MS)
    assert isinstance(remedy, Rearm) and remedy.deadline_ms == deadline
    store.index_human_wait("r", remedy.deadline_ms)  # what the owner check applies
    assert store.expired_human_waits(now_ms()) == ["r"], "the sweeper times it out now"
    assert remedies(store) == [], "indexed: the person and the deadline own it again"
