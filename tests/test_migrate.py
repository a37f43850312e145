"""`fleet migrate`: layout-1 traces (messages, stats, stop in keys of their own) moved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from fleet.models import Message, Trace
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleetops.migrate import migrate
from fleetops.migrate_runstate import migrate_run_state


def _old_trace(client: redis.Redis, store: RedisStore, trace_id: str) -> Trace:
    """A trace as the previous version left it: its hash, plus the three keys of its own."""
    trace = Trace(trace_id=trace_id, root_trace_id=trace_id, task="t", name="main")
    store.create_trace(trace)
    client.hset(keys.trace(trace_id), mapping={"last_sequence": "2", "head_sequence": "2"})
    messages = [
        Message(trace_id=trace_id, role="system", content="sys", sequence=1),
        Message(trace_id=trace_id, role="user", content="hello", sequence=2, parent_sequence=1),
    ]
    old = keys.legacy_messages(trace_id)
    client.hset(old, mapping={str(m.sequence): m.model_dump_json() for m in messages})
    client.hset(
        keys.legacy_stats(trace_id),
        mapping={"messages": 2, "prompt_tokens": 120, "completion_tokens": 7, "cost_usd": 0.0125},
    )
    client.set(keys.legacy_stop(trace_id), "1")
    return trace


def test_a_layout_1_trace_reads_whole_after_migrate(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    _old_trace(redis_db, store, "r1")
    assert store.messages("r1") == []  # what this version sees before the move

    assert migrate(redis_db, dry_run=True).messages == 2
    assert store.messages("r1") == []  # a dry run changes nothing
    done = migrate(redis_db)

    assert (done.traces, done.messages) == (1, 2)
    assert [m.content for m in store.messages("r1")] == ["sys", "hello"]
    stats = store.get_trace("r1").stats
    assert (stats.messages, stats.prompt_tokens, stats.completion_tokens) == (2, 120, 7)
    assert abs(stats.cost_usd - 0.0125) < 1e-12
    assert store.stop_requested("r1")
    legacy = [keys.legacy_messages("r1"), keys.legacy_stats("r1"), keys.legacy_stop("r1")]
    assert not any(redis_db.exists(key) for key in legacy)
    assert redis_db.ttl(keys.trace("r1")) > 0
    again = migrate(redis_db)
    assert (again.traces, again.messages) == (0, 0)  # idempotent


def test_what_the_new_version_wrote_meanwhile_is_kept(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    _old_trace(redis_db, store, "r2")
    new = Message(trace_id="r2", role="user", content="new", sequence=3, parent_sequence=2)
    redis_db.hset(keys.trace("r2"), "m:3", new.model_dump_json())
    redis_db.hset(keys.trace("r2"), "stats", '{"messages": 1, "prompt_tokens": 5}')

    migrate(redis_db)

    assert [m.content for m in store.messages("r2")] == ["sys", "hello", "new"]
    stats = store.get_trace("r2").stats
    assert (stats.messages, stats.prompt_tokens) == (3, 125)


def test_expired_traces_and_foreign_keys_are_left_alone(redis_db: redis.Redis) -> None:
    redis_db.hset(keys.legacy_messages("gone"), "1", "{}")
    redis_db.set("fleet:trace:not an id:messages", "x")  # hostile names: no id, no move
    redis_db.set(keys.legacy_messages("odd"), "a string, not a hash")
    RedisStore(redis_db).create_trace(
        Trace(trace_id="odd", root_trace_id="odd", task="t", name="main")
    )

    done = migrate(redis_db)

    assert (done.traces, done.expired, done.skipped) == (0, 1, 2)
    assert redis_db.exists(keys.legacy_messages("gone"))  # its TTL ends it
    assert redis_db.get("fleet:trace:not an id:messages") == "x"


@pytest.mark.integration
def test_fleet_migrate_prints_one_line(redis_client: redis.Redis, redis_url: str) -> None:
    _old_trace(redis_client, RedisStore(redis_client), "r3")
    env = {**os.environ, "FLEET_REDIS_URL": redis_url}
    command = [sys.executable, "-m", "fleetops.cli.main", "migrate"]

    dry = subprocess.run([*command, "--dry-run"], env=env, capture_output=True, text=True)
    real = subprocess.run(command, env=env, capture_output=True, text=True)

    assert dry.returncode == real.returncode == 0, dry.stderr + real.stderr
    moves = "1 trace(s) to the current layout (2 messages)"
    assert dry.stdout.strip() == f"would move {moves}; 1 root(s) to index"
    assert real.stdout.strip() == f"moved {moves}; 1 root(s) indexed"


def test_fleet_migrate_on_an_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_REDIS_URL": "redis://:pw-secret@127.0.0.1:1/0"}
    result = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "migrate"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "cannot reach Redis" in line and "pw-secret" not in line


def test_the_run_state_an_earlier_release_kept_in_metadata_is_lifted(
    redis_db: redis.Redis,
) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="r4", root_trace_id="r4", task="t", status="waiting"))
    waiting = {"kind": "human", "tool_call_id": "c1", "question": "which colour?"}
    old = {"waiting_on": waiting, "turn": 2, "context": "the caller's", "ticket": "T-9"}
    key = keys.trace("r4")
    redis_db.hdel(key, "r:schema_version")  # as the earlier release wrote it: no run state
    redis_db.hset(key, "metadata", json.dumps(old))

    assert migrate_run_state(redis_db, dry_run=True) == 1
    assert store.get_trace("r4").run.waiting_on is None, "a dry run changes nothing"
    assert migrate_run_state(redis_db) == 1
    assert migrate_run_state(redis_db) == 0, "lifted once"
    trace = store.get_trace("r4")
    assert (trace.run.waiting_on, trace.run.turn, trace.run.schema_version) == (waiting, 2, 0)
    assert trace.run.context is None, "a value that is not the fleet's stays where it was"
    assert trace.metadata == old


def test_traces_of_this_release_are_not_lifted(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    trace = Trace(trace_id="r5", root_trace_id="r5", task="t", metadata={"turn": 9})
    store.create_trace(trace)
    assert migrate_run_state(redis_db) == 0
    assert store.get_trace("r5").run.turn == 0
