"""A finished tree compacted on Redis: read back the same, continued, and hostile values refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from fleet import owners
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.models import Event, Trace, now_ms
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis import compact as redis_compact
from fleet.storage.backends.redis.compact import PACK_TRACE, compact_tree, tree_ids
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.compaction import PACKED_FIELD, PackError, TreeDict, pack, unpack
from fleet.storage.owner_index import owner_index
from fleet.testing import ScriptedModel, call, text

WEEK_S = 7 * 24 * 3600


def explore_tree(client: redis.Redis, tmp_path: Path, branches: int = 12) -> InProcessFleet:
    """A finished explore of `branches` on a RedisStore over `client` (scripted model)."""
    tasks = [f"Branch {i}" for i in range(branches)]

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        if messages[-1]["role"] == "tool":
            return text(f"found {task}" if task.startswith("Branch") else "summary")
        return (
            call("list_dir", path=".") if task.startswith("Branch") else call("agent", task=tasks)
        )

    model = ScriptedModel(function=answer)
    settings = Settings(workspace=tmp_path, env={})
    store = RedisStore(client)
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"m": model})
    return InProcessFleet(runtime)


def everything(store: RedisStore, root: str) -> dict[str, object]:
    """What readers see of a tree: every trace, its messages and collaborators, the events."""
    seen: dict[str, object] = {}
    for trace_id in tree_ids(store.client, root):
        trace = store.get_trace(trace_id).model_dump()
        seen[trace_id] = (trace, store.messages(trace_id), store.collaborators(trace_id))
    seen["events"] = store.read_events(root, count=100_000)
    return seen


def test_a_compacted_tree_reads_back_the_same(redis_db: redis.Redis, tmp_path: Path) -> None:
    local = explore_tree(redis_db, tmp_path)
    root = local.run("survey", model="m")
    store = local.store
    assert isinstance(store, RedisStore)
    before = everything(store, root.trace_id)
    assert compact_tree(redis_db, root.trace_id, 3600).packed == 13
    for trace_id in tree_ids(redis_db, root.trace_id):
        assert list(redis_db.hkeys(keys.trace(trace_id))) == [PACKED_FIELD]
        assert 0 < redis_db.ttl(keys.trace(trace_id)) <= 3600, "the retention, not 7 days"
    assert not redis_db.exists(keys.events(root.trace_id)), "the stream moved to its archive"
    assert not redis_db.exists(keys.collaborator_order(root.trace_id)), "folded into the pack"
    assert everything(store, root.trace_id) == before
    fresh = RedisStore(redis_db)  # another process: reads the tree dictionary from Redis
    assert everything(fresh, root.trace_id) == before
    assert compact_tree(redis_db, root.trace_id, 3600).packed == 0, "packed once"


def test_nothing_of_a_compacted_tree_outlives_its_retention(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    root = explore_tree(redis_db, tmp_path, branches=3).run("survey", model="m").trace_id
    family = [str(k) for k in redis_db.scan_iter(match=f"fleet:trace:{root}*", count=1000)]
    assert any(":collected:" in k for k in family), "the explore's call was collected"
    compact_tree(redis_db, root, 3600)
    left = [str(k) for k in redis_db.scan_iter(match=f"fleet:trace:{root}*", count=1000)]
    kept = {k: redis_db.ttl(k) for k in left}
    assert all(0 < ttl_s <= 3600 for ttl_s in kept.values()), kept


def test_a_compacted_tree_continues(redis_db: redis.Redis, tmp_path: Path) -> None:
    local = explore_tree(redis_db, tmp_path, branches=3)
    root = local.run("survey", model="m")
    compact_tree(redis_db, root.trace_id, 3600)
    events = len(local.store.read_events(root.trace_id, count=1000))
    local.runtime.clients["m"] = ScriptedModel([text("and more")])
    again = local.continue_trace(root.trace_id, "one more thing")
    assert again.status == "completed" and again.answer == "and more"
    assert [m.content for m in local.store.messages(root.trace_id)][-2:] == [
        "one more thing",
        "and more",
    ]
    assert len(local.store.collaborators(root.trace_id)) == 3, "the packed entries remain"
    after = local.store.read_events(root.trace_id, count=1000)
    assert len(after) > events, "the archived events came back into the stream, then new ones"
    assert compact_tree(redis_db, root.trace_id, 3600).packed == 1, "the thawed root packs again"
    assert [m.content for m in local.store.messages(root.trace_id)][-1] == "and more"


def test_only_ended_traces_are_packed(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="r", root_trace_id="r", task="t"))  # queued
    assert compact_tree(redis_db, "r", 3600).packed == 0
    assert PACKED_FIELD not in redis_db.hkeys(keys.trace("r"))


def test_a_hash_changed_since_read_is_not_packed(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="r", root_trace_id="r", task="t", status="completed"))
    stale = "status\0x\0"  # what a read before the last write would have seen
    packed = pack({"status": '"completed"'})
    assert PACK_TRACE(redis_db, [keys.trace("r")], [stale, packed, 60]) == 0
    assert store.get_trace("r").status == "completed"
    assert PACKED_FIELD not in redis_db.hkeys(keys.trace("r"))


def test_the_owner_check_compacts_an_ended_tree(redis_db: redis.Redis, tmp_path: Path) -> None:
    local = explore_tree(redis_db, tmp_path, branches=2)
    root = local.run("survey", model="m")
    store = local.store
    store.track_tree(root.trace_id)
    index = owner_index(store, retention_s=120)
    assert owners.check(store, index, now_ms() + 60_000, 1_000) == []
    assert index.open_trees(10) == []
    assert list(redis_db.hkeys(keys.trace(root.trace_id))) == [PACKED_FIELD]
    assert redis_db.ttl(keys.trace(root.trace_id)) <= 120


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("9:abc", "unknown version"),
        ("1:!!!not base64", "does not unpack"),
        ("1:" + "eJwLyS9ILMpMzSspSgUAHDcEKA==", "does not unpack"),  # not JSON
        (pack({"a": 1}), "not a hash of text fields"),  # type: ignore[dict-item]
        ("2:gone:0123456789ab:eJwDAAAAAAE=", "dictionary of tree 'gone' is gone"),
    ],
)
def test_hostile_packed_values_are_one_line_errors(value: str, problem: str) -> None:
    with pytest.raises(PackError, match=problem) as caught:
        unpack(value, lambda root: None)
    assert "\n" not in str(caught.value)


def test_a_dictionary_that_changed_is_refused() -> None:
    value = pack({"status": '"completed"'}, TreeDict("r", b"one dictionary"))
    with pytest.raises(PackError, match="is gone"):
        unpack(value, lambda root: TreeDict("r", b"another dictionary"))
    assert unpack(value, lambda root: TreeDict("r", b"one dictionary")) == {"status": '"completed"'}


def test_one_check_compacts_a_bounded_number_of_traces(
    redis_db: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleet.storage.owner_index.COMPACT_PER_CHECK", 3)
    local = explore_tree(redis_db, tmp_path, branches=2)
    first = local.run("survey", model="m").trace_id
    second = local.run("survey again", model="m").trace_id
    store = local.store
    for root in (first, second):
        store.track_tree(root)
    owners.check(store, owner_index(store), now_ms() + 60_000, 1_000)
    (left,) = owner_index(store).open_trees(10)  # one tree of 3 traces used the budget
    assert PACKED_FIELD not in redis_db.hkeys(keys.trace(left)), "left for the next check"
    owners.check(store, owner_index(store), now_ms() + 60_000, 1_000)
    assert owner_index(store).open_trees(10) == []
    for root in (first, second):
        assert list(redis_db.hkeys(keys.trace(root))) == [PACKED_FIELD]


def test_an_event_racing_the_archive_keeps_the_tree_open(
    redis_db: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = explore_tree(redis_db, tmp_path, branches=2)
    root = local.run("survey", model="m").trace_id
    store = local.store
    store.track_tree(root)
    real = redis_compact.packed_events
    late = Event(kind="trace", trace_id=root, status="completed")

    def with_a_write_between(entries: Any) -> str:
        store.emit(root, late)  # lands after the stream was read, before it is archived
        return real(entries)

    monkeypatch.setattr(redis_compact, "packed_events", with_a_write_between)
    assert owners.check(store, owner_index(store), now_ms() + 60_000, 1_000) == []
    assert owner_index(store).open_trees(10) == [root], "checked again"
    assert not redis_db.exists(keys.events_archive(root))
    assert store.read_events(root, count=1000)[-1][1] == late, "no event lost"
    monkeypatch.setattr(redis_compact, "packed_events", real)
    assert owners.check(store, owner_index(store), now_ms() + 60_000, 1_000) == []
    assert owner_index(store).open_trees(10) == []
    assert store.read_events(root, count=1000)[-1][1] == late


def test_a_stop_flag_packed_with_a_trace_is_cleared(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="r", root_trace_id="r", task="t", status="stopped"))
    store.request_stop("r")
    compact_tree(redis_db, "r", 3600)
    assert list(redis_db.hkeys(keys.trace("r"))) == [PACKED_FIELD]
    assert store.snapshot("r").stop_requested, "read from the packed fields"
    store.clear_stop("r")
    assert not store.snapshot("r").stop_requested and not store.stop_requested("r")
