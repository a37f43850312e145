"""A child whose record a failover lost: its parent's call is settled, never raised on.

Found by bench/chaos.py (seed 41 round 23): a Cluster master killed took a branch's
record with its last writes; the chord body `fleet.collect` read the header results'
trace ids and raised `TraceNotFound` (a traceback), and so did its errback and each
sweep of the call's settle entry, every 10 s. The owner check meanwhile took the tree
for ended (a gone descendant read as a gone root) and dropped it from its index.
"""

from __future__ import annotations

from pathlib import Path

from fleet import lifecycle, owners
from fleet.children import after
from fleet.children.after import Call, Nothing, Resume
from fleet.runtime import Runtime
from fleet.storage import outbox
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.gone import GONE_ERROR, present
from tests.test_lifecycle import parent_with_calls


def lose(runtime: Runtime, trace_id: str) -> None:
    """The trace's record gone, as a killed master's last writes (its parent's index kept)."""
    store = runtime.store
    assert isinstance(store, MemoryStore)
    del store._traces[trace_id]


def test_a_chord_body_settles_a_gone_child_as_failed_and_resumes_the_parent(
    tmp_path: Path,
) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")
    lose(runtime, second)

    owed = after.settle_call(runtime, Call(parent.trace_id, "c1"), request.child_ids, "chord")

    assert owed == Resume(parent.trace_id)
    result = runtime.store.messages(parent.trace_id)[-1]
    assert result.role == "tool" and GONE_ERROR in str(result.content)
    entries = {
        e.trace_id: (e.status, e.summary) for e in runtime.store.collaborators(parent.trace_id)
    }
    assert entries[first] == ("completed", "done")
    assert entries[second][0] == "failed" and entries[second][1].startswith("gone")


def test_a_sweep_settles_from_the_store_without_the_gone_child(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")
    lose(runtime, second)

    owed = after.settle_from_store(runtime, Call(parent.trace_id, "c1"), "sweep")

    assert owed == Resume(parent.trace_id)
    assert runtime.store.messages(parent.trace_id)[-1].role == "tool"


def test_a_gone_child_of_a_call_the_parent_no_longer_waits_on_writes_nothing(
    tmp_path: Path,
) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")
    lose(runtime, second)
    before = len(runtime.store.messages(parent.trace_id))

    owed = after.settle_call(
        runtime, Call(parent.trace_id, "lost-call"), request.child_ids, "chord"
    )

    assert owed == Nothing()
    assert len(runtime.store.messages(parent.trace_id)) == before


def test_the_owner_check_keeps_a_tree_whose_waiting_parent_lost_a_child(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lifecycle.finish(runtime, first, "completed", answer="done", reason="final_answer")
    lose(runtime, second)

    assert not owners.tree_ended(runtime.store, parent.trace_id), "the parent still waits"
    assert owners.tree_ended(runtime.store, "no-such-root"), "a gone root: nothing to wait for"
    found, gone = present(runtime.store, [first, second])
    assert ([t.trace_id for t in found], gone) == ([first], [second])


def test_a_sweep_sends_nothing_for_a_gone_trace_and_drops_a_gone_parents_call(
    tmp_path: Path,
) -> None:
    # Each outbox entry naming a gone trace raised TraceNotFound in every sweeper's sweep,
    # claimed again 10 s later; a settle entry of a gone parent was deferred for ever.
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    first, second = request.child_ids
    lose(runtime, second)
    store = runtime.store

    assert outbox.runs_for(store, outbox.run_entry(second)) == []
    assert outbox.runs_for(store, outbox.spawn_entry(parent.trace_id, "c1")) == [first]
    lose(runtime, first)
    lose(runtime, parent.trace_id)
    assert after.settle_from_store(runtime, Call(parent.trace_id, "c1"), "sweep") == Nothing()
