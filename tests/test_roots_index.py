"""The front page's list of trees reads the index of roots (`fleet.storage.root_index`).

Read from the traces index, roots were found only among the newest 2,000 traces, branches
included: after a tree of more branches than that, every older tree was off the page (and
off every later page). Every store: memory, fakeredis, a real Redis.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessDispatcher
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.root_index import ROOTS
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, text
from fleetops.serve import listing

SCAN = 20
"""The old bound (2,000), made small: more branches than this are newer than the old root."""


def runtime_on(store: TraceStore, tmp_path: Path) -> Runtime:
    model = ScriptedModel([text("done")])
    return Runtime.build(
        Settings(workspace=tmp_path, env={}), store, InProcessDispatcher(), clients={"test": model}
    )


def branches(store: TraceStore, root: str, count: int, after_ms: int) -> None:
    for n in range(count):
        child = f"{root}@explore-{n:03d}-20261128000000-001"
        store.create_trace(
            Trace(
                trace_id=child,
                root_trace_id=root,
                parent_trace_id=root,
                mode="explore",
                task="b",
                created_at_ms=after_ms + n,
            )
        )


def ids(store: TraceStore, **query: str) -> tuple[list[str], str | None]:
    page = listing.list_traces(store, listing.TraceFilter.parse({"roots": "1", **query}))
    return [row["trace_id"] for row in page["traces"]], page["next"]


def test_trees_older_than_a_big_tree_stay_on_the_front_page(
    store: TraceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "SCAN_TRACES", SCAN)
    runtime = runtime_on(store, tmp_path)
    old = [create_root(runtime, TaskSpec(f"old {n}", model="test")).trace_id for n in range(3)]
    big = create_root(runtime, TaskSpec("big", model="test")).trace_id
    branches(store, big, SCAN + 5, store.get_trace(big).created_at_ms + 1)
    made = [store.get_trace(t) for t in (*old, big)]  # one ms may hold several: then by id
    newest_first = [t.trace_id for t in sorted(made, key=lambda t: (t.created_at_ms, t.trace_id))]
    newest_first.reverse()

    assert ids(store)[0] == newest_first
    seen, cursor = [], None
    while True:  # a page of one tree at a time, each once
        page, cursor = ids(store, limit="1", **({"cursor": cursor} if cursor else {}))
        seen += page
        if cursor is None:
            break
    assert seen == newest_first
    assert ids(store, q="old 1")[0] == [old[1]], "a filter reads roots past the branches too"


def test_a_root_whose_trace_is_gone_leaves_the_index(store: TraceStore) -> None:
    index = store.capability(ROOTS)
    store.create_trace(Trace(trace_id="kept", root_trace_id="kept", task="t", created_at_ms=5))
    index.add("kept", 5)
    index.add("expired", 6)  # its trace hash reached its TTL
    assert ids(store)[0] == ["kept"]
    assert index.page(10) == [(5, "kept")]


def test_the_index_pages_by_time_then_id_past_ties(store: TraceStore) -> None:
    index = store.capability(ROOTS)
    for root, at_ms in (("a", 7), ("b", 7), ("c", 7), ("d", 9), ("e", 3)):
        index.add(root, at_ms)
    assert index.page(2) == [(9, "d"), (7, "c")]
    assert index.page(2, (7, "c")) == [(7, "b"), (7, "a")]
    assert index.page(5, (7, "b")) == [(7, "a"), (3, "e")]
    assert index.page(5, (3, "e")) == []


def test_fleet_migrate_indexes_the_roots_created_before_the_index(store: TraceStore) -> None:
    from fleet.storage.backends.redis.store import RedisStore
    from fleetops.migrate import migrate

    if not isinstance(store, RedisStore):
        pytest.skip("`fleet migrate` works on Redis")
    for trace_id, at_ms in (("legacy-a", 10), ("legacy-b", 20), ("legacy-b@x-1", 30)):
        root = trace_id.split("@")[0]
        parent = None if root == trace_id else root
        made = Trace(trace_id=trace_id, root_trace_id=root, parent_trace_id=parent, task="t")
        store.create_trace(made.model_copy(update={"created_at_ms": at_ms}))
    assert ids(store)[0] == []

    assert migrate(store.client, dry_run=True).roots == 2
    assert ids(store)[0] == [], "a dry run writes nothing"
    done = migrate(store.client)

    assert done.roots == 2 and "2 root(s) indexed" in done.line(dry_run=False)
    assert ids(store)[0] == ["legacy-b", "legacy-a"]
