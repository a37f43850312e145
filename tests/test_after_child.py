"""The after-child policy (`fleet.children.after`): its decision table, and both hosts."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from fleet import lifecycle
from fleet.children import after
from fleet.children.after import Call, Defer, Nothing, Resume, Settler
from fleet.children.settling import AlreadyCollected, Settled, Settlement, Waiting
from fleet.inprocess import apply_after_child
from tests.test_lifecycle import end_all, parent_with_calls

CALL = Call("root", "call_1")
TTL_MS = 30_000
NOW_MS = 1_000_000
SETTLERS: tuple[Settler, ...] = get_args(Settler)
DEFERRED = Defer("root", "call_1", NOW_MS + TTL_MS, ("root@explore-002",))

SETTLEMENTS: dict[str, Settlement] = {
    "settled, turn complete": Settled("root", "call_1", turn_complete=True),
    "settled, calls still open": Settled("root", "call_1", turn_complete=False),
    "waiting": Waiting(pending=("root@explore-002",)),
    "already collected": AlreadyCollected(),
}

# Every settlement kind x every settler: what is owed.
TABLE: dict[tuple[str, Settler], after.AfterChild] = {
    **{("settled, turn complete", by): Resume("root") for by in SETTLERS},
    **{("settled, calls still open", by): Nothing() for by in SETTLERS},
    **{("already collected", by): Nothing() for by in SETTLERS},
    ("waiting", "chord"): Nothing(),  # the re-sent branch settles when it ends
    ("waiting", "window"): Nothing(),  # the window's last child settles
    ("waiting", "inline"): Nothing(),  # healed when the parent runs on
    ("waiting", "errback"): DEFERRED,
    ("waiting", "recovery"): DEFERRED,
    ("waiting", "sweep"): DEFERRED,
}


def test_the_table_covers_every_settlement_and_settler() -> None:
    assert set(TABLE) == {(kind, by) for kind in SETTLEMENTS for by in SETTLERS}


@pytest.mark.parametrize(("kind", "by"), sorted(TABLE))
def test_decide(kind: str, by: Settler) -> None:
    decided = after.decide(SETTLEMENTS[kind], CALL, by, lease_ttl_ms=TTL_MS, at_ms=NOW_MS)
    assert decided == TABLE[(kind, by)]


def test_a_resume_names_the_settled_parent_not_the_call_asked_about() -> None:
    settled = Settled("parent", "call_9", turn_complete=True)
    decided = after.decide(settled, CALL, "chord", lease_ttl_ms=TTL_MS, at_ms=NOW_MS)
    assert decided == Resume("parent")


OWED_AFTER_RUN: list[tuple[str, bool, bool, tuple[Settler, ...]]] = [
    # outcome, recovered, windowed -> the settlements the run owes, in order
    ("completed", False, False, ()),  # its chord body settles
    ("failed", False, True, ("window",)),
    ("stopped", False, True, ("window",)),
    ("waiting", False, True, ()),  # not ended: it settles when it ends
    ("completed", True, False, ("recovery",)),
    ("completed", True, True, ("window", "recovery")),
    ("waiting", True, True, ("recovery",)),
    ("busy", True, False, ("recovery",)),  # another runner holds it: deferred
    ("lost", True, False, ("recovery",)),
    ("interrupted", True, True, ()),  # the store was away: a sweeper resumes it
    ("interrupted", False, False, ()),
    ("busy", False, True, ()),
]


@pytest.mark.parametrize(("outcome", "recovered", "windowed", "owed"), OWED_AFTER_RUN)
def test_what_a_run_owes_its_parents_call(
    outcome: str, recovered: bool, windowed: bool, owed: tuple[Settler, ...]
) -> None:
    assert after.owed_after_run(outcome, recovered=recovered, windowed=windowed) == owed


def test_settle_child_defers_a_recovered_child_while_a_sibling_runs(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")

    owed = after.settle_child(runtime, first, "recovery")

    assert isinstance(owed, Defer)
    assert (owed.parent_trace_id, owed.tool_call_id, owed.pending) == (
        parent.trace_id,
        "c1",
        (second,),
    )
    assert owed.due_ms >= runtime.settings.lease_ttl_ms
    assert after.settle_child(runtime, first, "window") == Nothing()


def test_settle_child_resumes_once_the_last_child_ended(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    end_all(runtime, request)
    first, second = request.child_ids

    assert after.settle_child(runtime, second, "window") == Resume(parent.trace_id)
    assert after.settle_child(runtime, first, "recovery") == Nothing(), "settled once"
    assert after.settle_child(runtime, parent.trace_id, "recovery") == Nothing(), "no parent"


def test_settle_call_resumes_only_after_the_turns_last_call(tmp_path: Path) -> None:
    runtime, parent, (one, two) = parent_with_calls(tmp_path, "c1", "c2")
    end_all(runtime, one)
    end_all(runtime, two)

    first = after.settle_call(runtime, Call(parent.trace_id, "c1"), one.child_ids, "chord")
    last = after.settle_call(runtime, Call(parent.trace_id, "c2"), two.child_ids, "chord")

    assert (first, last) == (Nothing(), Resume(parent.trace_id))


def test_the_in_process_host_refuses_a_deferral_it_could_not_keep() -> None:
    apply_after_child(Resume("root"))
    apply_after_child(Nothing())
    with pytest.raises(AssertionError, match="cannot be deferred"):
        apply_after_child(DEFERRED)


def test_settle_from_store_finds_the_calls_children(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    call = Call(parent.trace_id, "c1")
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")

    deferred = after.settle_from_store(runtime, call, "errback")
    lifecycle.finish(runtime, second, "failed", error="boom", reason="error")
    resumed = after.settle_from_store(runtime, call, "sweep")

    assert isinstance(deferred, Defer) and deferred.pending == (second,)
    assert resumed == Resume(parent.trace_id)


def test_a_call_whose_children_the_store_lost_settles_nothing_and_waits(tmp_path: Path) -> None:
    # Found by bench/chaos.py: a Cluster master killed before its replica had a spawn's
    # children, the chord's errback settled from the store, found none, and crashed on
    # `children[0]` (IndexError). Nothing to settle yet: the call stays owed, and the owner
    # check resumes the parent, whose resume heals the orphaned call.
    runtime, parent, _ = parent_with_calls(tmp_path, "c1")
    orphan = Call(parent.trace_id, "no-such-call")

    owed = after.settle_from_store(runtime, orphan, "errback")

    assert isinstance(owed, Defer) and owed.pending == ()
    assert runtime.store.messages(parent.trace_id)[-1].role != "tool", "nothing written"
