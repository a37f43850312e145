"""The records' contract between releases (`fleet.models.Record`, docs/operations.md "Upgrading").

What this release writes by default carries no field release 0.1.0 lacks; a field a newer
release wrote is kept (and written back where a record is rewritten whole); a field a record
lacks takes its default; a record for a newer schema is refused in one line, alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import ClassVar

import pytest
import redis

from fleet.errors import NewerRecord
from fleet.experiences.model import Experience
from fleet.memory.model import Entry
from fleet.models import SCHEMA_VERSION, Collaborator, Event, Message, Record, Trace
from fleet.storage import keys, outbox
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.batch_types import CallStatus
from fleet.storage.inbox_types import Posted
from fleet.storage.store import TraceStore
from fleet.storage.writes import TraceWrite

NEWER = SCHEMA_VERSION + 1


def test_a_trace_at_its_defaults_is_written_as_release_0_1_0_wrote_it() -> None:
    dumped = Trace(trace_id="t", root_trace_id="t", task="x").model_dump(mode="json")
    assert "memory" not in dumped and "schema_version" not in dumped
    # release 0.1.0's Trace fields and the run state, no other: 0.1.0 refuses any field it
    # does not know, so `run` (in Redis: `r:{name}` fields) makes 0.1.0 -> 0.2.0 stop the world
    assert set(dumped) <= set(Trace.model_fields) - {"memory", "schema_version"}


def test_a_trace_bound_to_memory_says_which_schema_reads_it() -> None:
    trace = Trace(trace_id="t", root_trace_id="t", task="x", memory=["user:alice"])
    dumped = json.loads(trace.model_dump_json())
    assert dumped["memory"] == ["user:alice"] and dumped["schema_version"] == 2
    read = Trace.model_validate_json(trace.model_dump_json())
    assert read.model_dump_json() == trace.model_dump_json()


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (Message, {"trace_id": "t", "role": "user", "content": "hi"}),
        (Collaborator, {"name": "a", "trace_id": "t@a"}),
        (Event, {"kind": "trace", "trace_id": "t"}),
        (Posted, {"sender": "bob", "content": "hi"}),
        (CallStatus, {"state": "queued"}),
        (Experience, {"id": "e1", "scope": "user:bob", "condition": "c", "rule": "r"}),
        (
            Entry,
            {"namespace": "user:bob", "key": "k", "value": 1, "version": 1}
            | {"updated_at_ms": 1, "writer": "operator"},
        ),
    ],
)
def test_a_field_of_a_newer_release_is_kept_through_a_rewrite(
    model: type[Record], data: dict[str, object]
) -> None:
    text = json.dumps({**data, "from_the_future": {"x": [1]}})
    record = model.model_validate_json(text)
    rewritten = json.loads(record.model_copy(update={}).model_dump_json())
    assert rewritten["from_the_future"] == {"x": [1]}


def test_a_record_missing_a_field_takes_its_default() -> None:
    trace = Trace.model_validate_json('{"trace_id": "t", "root_trace_id": "t", "task": "x"}')
    assert trace.memory == [] and trace.schema_version == 1


@pytest.mark.parametrize("model", [Trace, Message, Collaborator, Event])
def test_a_record_for_a_newer_schema_is_refused_in_one_line(model: type[Trace]) -> None:
    data: dict[str, object] = {"trace_id": "t", "root_trace_id": "t", "task": "x"}
    data |= {"role": "user", "name": "a"}
    data |= {"kind": "trace", "schema_version": NEWER}
    fields = {k: v for k, v in data.items() if k in model.model_fields}
    with pytest.raises(NewerRecord, match=f"schema {NEWER}; this one reads up to") as caught:
        model.model_validate(fields)
    assert "\n" not in str(caught.value)


def test_an_update_never_invents_a_field(store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="t", root_trace_id="t", task="x"))
    with pytest.raises(ValueError, match="'from_the_future' is not a field"):
        store.update_trace("t", from_the_future=1)  # type: ignore[call-arg]


@pytest.mark.integration
def test_a_trace_hash_field_of_a_newer_release_stays_in_redis(redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client)
    store.create_trace(Trace(trace_id="t1", root_trace_id="t1", task="x"))
    redis_client.hset(keys.trace("t1"), "from_the_future", json.dumps({"a": 1}))
    store.update_trace("t1", status="running")
    snapshot = store.snapshot("t1")
    assert snapshot.trace.status == "running"
    assert (snapshot.trace.model_extra or {})["from_the_future"] == {"a": 1}
    assert redis_client.hget(keys.trace("t1"), "from_the_future") == '{"a": 1}'


@pytest.mark.integration
def test_an_event_this_release_cannot_read_is_left_out_alone(redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client)
    store.emit("r1", Event(kind="trace", trace_id="r1"))
    newer = {"kind": "a_kind_from_the_future", "trace_id": "r1"}
    redis_client.xadd(keys.events("r1"), {"e": json.dumps(newer)})
    store.emit("r1", Event(kind="finish", trace_id="r1"))
    assert [e.kind for _, e in store.read_events("r1")] == ["trace", "finish"]


def test_a_collaborator_entry_rewritten_keeps_a_newer_field() -> None:
    store = MemoryStore()
    entry = Collaborator.model_validate({"name": "a", "trace_id": "p@a", "priority": 7})
    store.put_collaborator("p", entry)
    (read,) = store.collaborators("p")
    store.put_collaborator("p", read.model_copy(update={"status": "completed"}))
    (done,) = store.collaborators("p")
    assert done.status == "completed" and (done.model_extra or {})["priority"] == 7


@pytest.mark.parametrize(
    ("entry", "owed"),
    [
        ("a_kind_from_the_future t1 c1", None),  # left for a worker of the newer release
        ("spawn t1", []),  # a format older than any supported release: dropped
    ],
)
def test_an_outbox_entry_of_an_unknown_kind_waits_for_a_release_that_knows_it(
    entry: str, owed: list[str] | None
) -> None:
    assert outbox.runs_for(MemoryStore(), entry) == owed


def test_fleet_version_names_the_release_and_its_schemas() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("fleet 0.2.0 ") and f"record schema {SCHEMA_VERSION}" in out


def test_a_collaborator_field_added_later_is_written_only_when_set() -> None:
    # As a release that adds `Collaborator.priority` (default 0) lists it in SINCE.
    class Later(Collaborator):
        SINCE: ClassVar[dict[str, int]] = {"priority": 3}
        priority: int = 0

    plain = json.loads(Later(name="a", trace_id="p@a").model_dump_json())
    assert "priority" not in plain and "schema_version" not in plain
    set_ = json.loads(Later(name="a", trace_id="p@a", priority=2).model_dump_json())
    assert set_["priority"] == 2 and set_["schema_version"] == 3


def test_a_collaborator_entry_names_its_remote_task_only_when_it_has_one() -> None:
    plain = json.loads(Collaborator(name="a", trace_id="p@a").model_dump_json())
    assert "remote_id" not in plain and "schema_version" not in plain
    entry = Collaborator(name="r", trace_id="p@r", type="remote", remote_id="agent://x/1")
    remote = json.loads(entry.model_dump_json())
    assert remote["remote_id"] == "agent://x/1" and remote["schema_version"] == 2


def test_an_update_of_the_whole_run_state_is_refused(store: TraceStore) -> None:
    store.create_trace(Trace(trace_id="t", root_trace_id="t", task="x"))
    with pytest.raises(ValueError, match="field by field"):
        store.update_trace("t", run={})  # type: ignore[call-arg]


@pytest.mark.integration
def test_a_run_state_field_of_a_newer_release_stays_in_redis(redis_client: redis.Redis) -> None:
    store = RedisStore(redis_client)
    store.create_trace(Trace(trace_id="t1", root_trace_id="t1", task="x"))
    redis_client.hset(keys.trace("t1"), "r:from_the_future", json.dumps([1, 2]))
    store.update_run("t1", turn=3)
    store.update_trace("t1", status="running")
    assert store.snapshot("t1").trace.run.turn == 3, "read, the stranger ignored"
    assert redis_client.hget(keys.trace("t1"), "r:from_the_future") == "[1, 2]"


# What a newer release added to an entry, in the forms cjson would change: an empty list, an
# integer beyond a double, a float, a string of JSON punctuation and escapes, non-ASCII.
NEWER_ENTRY_FIELDS = (
    '"from_the_future":{"tags":[],"big":12345678901234567890,"ratio":0.1,'
    '"text":"a \\"}]{[,:\\\\ é","nested":[[],{"k":[1,{}]}]},"also":[]'
)


@pytest.mark.parametrize("how", ["alone", "in_the_childs_write", "among_siblings"])
def test_an_entry_keeps_a_newer_releases_fields_when_its_child_ends(
    store: TraceStore, how: str
) -> None:
    # The entry a newer release announced; the child's end rebuilds it from the child
    # (`fleet.lifecycle.entries.mirrored`) and must not drop what this release does not know.
    for trace_id in ("p", "p@a", "p@b"):
        store.create_trace(Trace(trace_id=trace_id, root_trace_id="p", task="x"))
    announced = '{"name":"a","trace_id":"p@a","status":"running",' + NEWER_ENTRY_FIELDS + "}"
    store.put_collaborator("p", Collaborator.model_validate_json(announced))
    ended = Collaborator(name="a", trace_id="p@a", status="completed", summary='"}]{')
    if how == "alone":
        store.put_collaborator_and_emit("p", "p", ended, Event(kind="collaborator", trace_id="p@a"))
    elif how == "in_the_childs_write":
        write = TraceWrite("p@a", "p").update(Event(kind="finish", trace_id="p@a"))
        store.apply(write.put_collaborator("p", ended))
    else:
        sibling = Collaborator(name="b", trace_id="p@b", status="failed")
        store.apply(
            TraceWrite("p", "p").put_collaborator("p", ended).put_collaborator("p", sibling)
        )
    entries = {e.trace_id: e for e in store.collaborators("p")}
    done = entries["p@a"]
    assert done.status == "completed" and done.summary == '"}]{'
    assert done.model_extra == json.loads("{" + NEWER_ENTRY_FIELDS + "}")
    if isinstance(store, RedisStore):  # kept byte for byte, not re-encoded
        raw = str(store._client.hget(keys.collaborators("p"), "p@a"))
        assert raw.endswith("," + NEWER_ENTRY_FIELDS + "}"), raw
        assert store._client.lrange(keys.collaborator_order("p"), 0, -1)[0] == "p@a"


@pytest.mark.integration
def test_an_entry_field_nested_deeper_than_cjson_reads_is_kept_too(
    redis_client: redis.Redis,
) -> None:
    store = RedisStore(redis_client)
    deep = "[" * 1200 + "]" * 1200  # cjson refuses past 1000 levels: read raw instead
    announced = '{"name":"a","trace_id":"p@a","status":"running","from_the_future":' + deep + "}"
    redis_client.hset(keys.collaborators("p"), "p@a", announced)
    store.put_collaborator("p", Collaborator(name="a", trace_id="p@a", status="completed"))
    raw = str(redis_client.hget(keys.collaborators("p"), "p@a"))
    assert raw.endswith(',"from_the_future":' + deep + "}") and '"completed"' in raw
