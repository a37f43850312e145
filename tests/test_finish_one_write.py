"""A child's end and its parent's entry are one write.

`make chaos` (seed 39, round 7: a stop between two Redis SIGKILLs) left a stopped tree
whose root's entry for its stopped branch said `running` for ever: `finish` without a
caller's write (the stop path, the owner check's `end_stopped`) wrote the child's status,
then the entry, and the store lost the second. Now both go in one write, as a runner's
finish already did: whatever cuts the finish cuts both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet import lifecycle
from tests.test_lifecycle import parent_with_calls


def test_a_childs_end_and_its_entry_are_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")
    child_id = request.child_ids[0]
    store = runtime.store
    writes: list[str] = []
    depth = [0]

    def recorded(name: str) -> Any:
        original = getattr(store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                writes.append(name)  # a write of its own (not one inside another)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for name in ("apply", "put_collaborator", "put_collaborator_and_emit", "emit"):
        monkeypatch.setattr(store, name, recorded(name))

    lifecycle.finish(runtime, child_id, "stopped", error="stop requested", reason="stop")

    assert writes == ["apply"], "a cut between two writes could leave the entry running"
    entries = {c.trace_id: c.status for c in store.collaborators(parent.trace_id)}
    assert (store.get_trace(child_id).status, entries[child_id]) == ("stopped", "stopped")


def test_stop_subtree_ends_each_queued_child_with_its_entry(tmp_path: Path) -> None:
    runtime, parent, (request,) = parent_with_calls(tmp_path, "c1")

    lifecycle.stop_subtree(runtime, parent.trace_id)

    entries = {c.trace_id: c.status for c in runtime.store.collaborators(parent.trace_id)}
    assert entries == dict.fromkeys(request.child_ids, "stopped")
    events = [e for _, e in runtime.store.read_events(parent.root_trace_id)]
    finishes = [e.trace_id for e in events if e.kind == "finish"]
    assert finishes[-1] == parent.trace_id and set(request.child_ids) <= set(finishes)
