"""The fleet's run state (`fleet.runstate`): apart from the caller's metadata, field by field."""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.errors import LeaseLost
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.models import Trace, TracePatch
from fleet.runstate import RunPatch, RunState
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis.compact import compact_tree, tree_ids
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.storage.writes import TraceWrite
from fleet.testing import ScriptedModel, call, text
from tests.test_compaction import explore_tree

ROOT = Path(__file__).resolve().parents[1]


def a_trace(trace_id: str = "t1", **fields: Any) -> Trace:
    return Trace(trace_id=trace_id, root_trace_id=trace_id, task="x", **fields)


def test_every_patchable_field_is_a_run_state_field() -> None:
    assert set(RunPatch.__optional_keys__) == set(RunState.model_fields) - {"schema_version"}
    assert "run" not in TracePatch.__optional_keys__, "an update of the trace never writes it"


def test_readers_take_fields_they_do_not_know_and_records_that_lack_some() -> None:
    newer = RunState.model_validate({"schema_version": 9, "turn": 2, "from_the_future": [1]})
    assert (newer.schema_version, newer.turn) == (9, 2)
    older = RunState.model_validate({"turn": 1})
    assert older.transient_retries == 0 and older.waiting_on is None


def test_a_trace_hash_with_unknown_and_missing_run_fields_reads(store: TraceStore) -> None:
    store.create_trace(a_trace())
    if isinstance(store, RedisStore):  # a newer release wrote a field; no schema_version
        client = store.client
        client.hset(keys.trace("t1"), mapping={"r:from_the_future": '{"x":1}', "r:turn": "4"})
        client.hdel(keys.trace("t1"), "r:schema_version")
        assert store.get_trace("t1").run.turn == 4
        assert store.snapshot("t1").trace.run.turn == 4
    assert store.get_trace("t1").run.schema_version == 1


def test_run_fields_are_written_one_by_one_and_others_are_kept(store: TraceStore) -> None:
    store.create_trace(a_trace(metadata={"owner": "alice"}))
    store.update_run("t1", overloads=2)
    store.update_run("t1", waiting_on={"kind": "human", "tool_call_id": "c1"})
    store.update_trace("t1", status="waiting")
    store.update_run("t1", waiting_on=None, approved_call="c1")
    trace = store.get_trace("t1")
    assert (trace.run.overloads, trace.run.waiting_on, trace.run.approved_call) == (2, None, "c1")
    assert trace.metadata == {"owner": "alice"} and trace.status == "waiting"


def test_the_run_state_is_never_written_as_a_whole_or_with_a_stranger(store: TraceStore) -> None:
    store.create_trace(a_trace())
    with pytest.raises(ValueError, match="field by field"):
        store.update_trace("t1", **{"run": {"turn": 3}})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'schema_version'"):
        store.update_run("t1", **{"schema_version": 7})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.update_run("t1", turn="many")  # type: ignore[arg-type]
    assert store.get_trace("t1").run == RunState()


def test_two_writers_reading_the_same_trace_both_land(store: TraceStore) -> None:
    """The race of whole-dict metadata writes: both read, both write; neither undoes the other."""
    store.create_trace(a_trace())
    seen_by_a, seen_by_b = store.get_trace("t1"), store.get_trace("t1")
    store.update_run("t1", overloads=seen_by_a.run.overloads + 1)  # a provider pause
    store.update_run("t1", owner_heals=seen_by_b.run.owner_heals + 1)  # the owner check
    run = store.get_trace("t1").run
    assert (run.overloads, run.owner_heals) == (1, 1)


@pytest.mark.integration
def test_concurrent_writers_of_different_fields_all_land_on_redis(
    redis_client: redis.Redis,
) -> None:
    store = RedisStore(redis_client)
    store.create_trace(a_trace())
    rounds = 200
    barrier = threading.Barrier(3)

    def writer(write: Callable[[int], None]) -> None:
        barrier.wait()
        for i in range(1, rounds + 1):
            write(i)

    writes: list[Callable[[int], None]] = [
        lambda i: store.update_run("t1", transient_retries=i),
        lambda i: store.update_run("t1", owner_heals=i),
        lambda i: store.update_trace("t1", metadata={"n": i}),  # the caller's own field
    ]
    threads = [threading.Thread(target=writer, args=(write,)) for write in writes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trace = store.get_trace("t1")
    assert (trace.run.transient_retries, trace.run.owner_heals) == (rounds, rounds)
    assert trace.metadata == {"n": rounds}


def test_a_lapsed_runner_cannot_write_the_run_state(store: TraceStore) -> None:
    store.create_trace(a_trace())
    assert store.acquire_lease("t1", "runner-a", 60_000)
    fenced = store.fenced("t1", "runner-a")
    fenced.update_run("t1", transient_retries=1)
    store.release_lease("t1", "runner-a")  # it lapsed; another runner takes the trace
    assert store.acquire_lease("t1", "runner-b", 60_000)
    with pytest.raises(LeaseLost):
        fenced.update_run("t1", transient_retries=5)
    with pytest.raises(LeaseLost):
        fenced.apply(TraceWrite("t1", "t1").update(None, status="failed").update_run(turn=9))
    trace = store.get_trace("t1")
    assert (trace.status, trace.run.transient_retries, trace.run.turn) == ("queued", 1, 0)


def test_a_run_state_field_lands_with_the_status_it_goes_with(store: TraceStore) -> None:
    store.create_trace(a_trace())
    write = TraceWrite("t1", "t1").update(None, status="completed").update_run(stop_reason="done")
    store.apply(write)
    trace = store.get_trace("t1")
    assert (trace.status, trace.run.stop_reason) == ("completed", "done")


def test_compaction_carries_the_run_state(redis_db: redis.Redis, tmp_path: Path) -> None:
    local = explore_tree(redis_db, tmp_path, branches=3)
    root = local.run("survey", model="m")
    store = local.store
    before = {t: store.get_trace(t).run for t in tree_ids(redis_db, root.trace_id)}
    assert before[root.trace_id].stop_reason == "final_answer"
    assert compact_tree(redis_db, root.trace_id, 3600).packed == 4
    after = {t: RedisStore(redis_db).get_trace(t).run for t in tree_ids(redis_db, root.trace_id)}
    assert after == before


# -- the caller's metadata --------------------------------------------------------------


def delegating(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    task = next(str(m["content"]) for m in messages if m["role"] == "user")
    if messages[-1]["role"] == "tool":
        return text("done")
    return text("sub done") if task == "sub" else call("agent", task="sub")


def test_a_whole_tree_leaves_the_callers_metadata_as_it_was_given(
    store: TraceStore, tmp_path: Path
) -> None:
    settings = Settings(workspace=tmp_path, env={})
    model = ScriptedModel(function=delegating)
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"m": model})
    given = {"ticket": "T-1", "stop_reason": "mine", "turn": "mine", "waiting_on": None}
    root = InProcessFleet(runtime).run("go", model="m", metadata=given)
    assert root.status == "completed"
    assert store.get_trace(root.trace_id).metadata == given
    assert (root.run.stop_reason, root.run.turn) == ("final_answer", 0)
    (child,) = store.children(root.trace_id)
    assert store.get_trace(child).metadata == {}
    assert store.get_trace(child).run.stop_reason == "final_answer"


# -- no fleet code reads or writes a trace's metadata -----------------------------------

MESSAGE_LIKE = {"m", "message", "note", "dist", "inbox", "result"}
"""Bases whose `.metadata` is a message's (or a package's, an inbox note's, a tool result's),
never a trace's."""
CALLERS_DATA = {
    ("fleet/batch/file.py", "wire"),
    ("fleet/batch/file.py", "entry"),
    ("fleet/batch/run.py", "entry"),
    ("fleet/conversation/roots.py", "spec"),
    ("fleetops/serve/submission.py", "body"),
}
"""Where the caller's metadata passes through on its way to the trace, untouched."""
A2A_REQUEST = {("fleetops/a2a/executor.py", "context"), ("fleetops/a2a/resume.py", "artifact")}
"""An A2A request's own metadata (a2a-sdk's `RequestContext.metadata`: the skill the
caller picks) and an A2A artifact's (the root's trace id, for the client), never a trace's."""
LEFT_TO_ANOTHER_ISSUE = {("fleet/experiences/retrieval.py", "trace")}
"""The `user:`/`project:` experience scopes read from a root's metadata: issue 39 item 3
(scope bound by the operator at submission) replaces this read."""


def metadata_uses() -> set[tuple[str, str]]:
    """Every `X.metadata` in fleet/, workers/ and fleetops/ as (file, X), messages left out."""
    found = set()
    for package in ("fleet", "workers", "fleetops"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr == "metadata":
                    base = ast.unparse(node.value)
                    if base not in MESSAGE_LIKE:
                        found.add((str(path.relative_to(ROOT)), base))
    return found


def test_no_fleet_code_reads_or_writes_a_traces_metadata() -> None:
    assert metadata_uses() == CALLERS_DATA | A2A_REQUEST | LEFT_TO_ANOTHER_ISSUE


def test_no_update_writes_metadata() -> None:
    """`metadata=` is passed to a Message, a tool result, a trace's creation; never an update."""
    writes = []
    for package in ("fleet", "workers", "fleetops"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and any(k.arg == "metadata" for k in node.keywords):
                    name = ast.unparse(node.func).rsplit(".", 1)[-1]
                    if name in {"update_trace", "update_trace_and_emit", "update", "model_copy"}:
                        writes.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert writes == []


def test_a_submission_sets_no_run_state_field_through_its_metadata(tmp_path: Path) -> None:
    """`Fleet.submit` (the client `fleet run`, `fleet mcp` and batches go through)."""
    from fleet.client import Fleet
    from tests.security.test_attack_forged_run_state import FORGED
    from tests.test_batch import MODEL, ThreadBackend, memory_runtime

    runtime = memory_runtime(tmp_path, ScriptedModel([text("ok")]))
    backend = ThreadBackend(runtime)
    try:
        handle = Fleet(runtime, backend).submit("go", model=MODEL, metadata=FORGED)
        done = handle.wait(timeout_s=30)
    finally:
        backend.pool.shutdown(wait=True)
    assert done.status == "completed" and done.metadata == FORGED
    own = RunState(stop_reason="final_answer", scheduled=False, budgeted=False)  # create_root's
    assert done.run == own


def test_the_typed_options_of_a_submission_are_its_only_way_in(tmp_path: Path) -> None:
    from fleet.client import Fleet
    from tests.test_batch import MODEL, ThreadBackend, memory_runtime

    runtime = memory_runtime(tmp_path, ScriptedModel([text("ok")]))
    backend = ThreadBackend(runtime)
    try:
        handle = Fleet(runtime, backend).submit("go", model=MODEL, human_timeout_s=60)
        done = handle.wait(timeout_s=30)
    finally:
        backend.pool.shutdown(wait=True)
    assert done.run.human_timeout_s == 60 and done.metadata == {}


def test_the_page_reads_no_traces_metadata() -> None:
    """The page's scripts read a message's or a tool result's metadata, never a trace's."""
    found = []
    for path in sorted((ROOT / "fleetops/serve/static").glob("*.js")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in re.finditer(r"([\w.]+)\.metadata\b", line):
                if match.group(1) not in {"message", "result"}:
                    found.append(f"{path.name}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"human_timeout_s": 0}, "human_timeout_s must be at least 1"),
        ({"batch_api": True}, "has no batch API"),
    ],
)
def test_a_typed_option_out_of_place_is_a_one_line_error(
    tmp_path: Path, options: dict[str, Any], problem: str
) -> None:
    from fleet.client import Fleet
    from fleet.errors import ConfigError
    from tests.test_batch import MODEL, ThreadBackend, memory_runtime

    runtime = memory_runtime(tmp_path, ScriptedModel([text("ok")]))
    with pytest.raises(ConfigError, match=problem) as raised:
        Fleet(runtime, ThreadBackend(runtime)).submit("go", model=MODEL, **options)
    assert "\n" not in str(raised.value)
    assert runtime.store.list_traces() == [], "nothing written"
