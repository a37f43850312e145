"""What a one-turn run costs the store in commands, counted as `INFO commandstats` counts.

A worker's run of a new root that answers at once (`bench/branch_cost_bench.py`'s run):
`begin_run` (the lease, the running index, `running` and its event, the provider's pause,
the inbox's newest entry, the experiences' counter) and the write that ends it (the lease
check, the turn, the finish and their events, the usage, the lease's release). Commands
inside the scripts count. Not read: whether the tree has a budget (its root's record
says), the experiences' count at the counter the process holds, the TTLs its creation set
moments before.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet import lifecycle
from fleet.conversation.roots import TaskSpec, create_root
from fleet.limits.budget import Budget
from fleet.loop.runner import Runner
from fleet.models import Event
from fleet.runtime import Runtime
from fleet.storage import keys
from fleet.storage.backends.redis.compact import compact_tree
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.writes import TraceWrite
from fleet.testing import ScriptedModel, text
from tests.test_round_trips import MODEL, commands, worker_runtime

pytestmark = pytest.mark.integration

BEGIN_RUN = 9
"""EVALSHA; HGETALL, SET (the lease), ZADD (running), HSET, XADD, PTTL, XREVRANGE, GET."""
END_OF_RUN = 10
"""EVALSHA; GET (the fence), HMGET, XADD x2, DEL, ZREM, HINCRBY x2, HSET."""


def answering() -> Any:
    return ScriptedModel(function=lambda messages, tools: text("done"))


def run_counted(
    client: redis.Redis, runtime: Runtime, budget: Budget | None = None
) -> tuple[str, Counter[str]]:
    """A new root, and the commands its run sent (the counting's own `INFO` left out)."""
    root = create_root(runtime, TaskSpec("answer at once", MODEL, mode="main", budget=budget))
    before = commands(client)
    assert Runner(runtime).run(root.trace_id).outcome == "completed"
    spent = commands(client) - before
    spent["info"] -= 1
    return root.trace_id, +spent


def test_a_one_turn_run_sends_nineteen_commands(redis_client: redis.Redis, tmp_path: Path) -> None:
    store = RedisStore(redis_client)
    # No lease renewed meanwhile: the counts are the run's own.
    runtime, _ = worker_runtime(store, tmp_path, answering(), lease_ttl_ms=600_000)
    _, first = run_counted(redis_client, runtime)
    assert first["hlen"] == 1, "the process held no experiences yet: their count is read"
    _, spent = run_counted(redis_client, runtime)
    assert sum(spent.values()) == BEGIN_RUN + END_OF_RUN, spent
    assert spent["evalsha"] == 2 and spent["xadd"] == 3 and spent["hincrby"] == 2
    assert spent["exists"] == spent["hlen"] == spent["expire"] == 0


@pytest.mark.parametrize("budget", [Budget(tokens=10_000), None])
def test_begin_run_reads_a_budget_from_the_roots_record_or_else_looks(
    redis_client: redis.Redis, tmp_path: Path, budget: Budget | None
) -> None:
    store = RedisStore(redis_client)
    runtime, _ = worker_runtime(store, tmp_path, answering(), lease_ttl_ms=600_000)
    said = create_root(runtime, TaskSpec("said", MODEL, mode="main", budget=budget)).trace_id
    older = create_root(runtime, TaskSpec("older", MODEL, mode="main", budget=budget)).trace_id
    redis_client.hdel(keys.trace(older), keys.RUN_FIELD + "budgeted")  # an older release's
    for root, looked in ((said, 0), (older, 1)):
        before = commands(redis_client)
        snapshot = store.begin_run(root, "me", 60_000, lifecycle.starting(root))
        assert snapshot is not None and snapshot.budgeted is (budget is not None)
        assert (commands(redis_client) - before)["exists"] == looked, root


def test_a_write_moments_after_creation_keeps_the_ttl_its_creation_set(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = RedisStore(redis_client)
    runtime, _ = worker_runtime(store, tmp_path, answering(), lease_ttl_ms=600_000)
    root = create_root(runtime, TaskSpec("answer at once", MODEL, mode="main"))
    assert Runner(runtime).run(root.trace_id).outcome == "completed"
    for key in (keys.trace(root.trace_id), keys.events(root.trace_id)):
        assert keys.TRACE_TTL_S - 60 < redis_client.ttl(key) <= keys.TRACE_TTL_S, key


def test_a_write_after_compaction_gives_the_new_event_stream_its_ttl(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The events went to their archive: a thawed trace's status change refreshes the TTLs."""
    store = RedisStore(redis_client)
    runtime, _ = worker_runtime(store, tmp_path, answering(), lease_ttl_ms=600_000)
    root = create_root(runtime, TaskSpec("answer at once", MODEL, mode="main")).trace_id
    assert Runner(runtime).run(root).outcome == "completed"
    compact_tree(redis_client, root, keys.TRACE_TTL_S)
    assert not redis_client.exists(keys.events(root)), "archived"
    event = Event(kind="trace", trace_id=root, status="queued")
    store.apply(TraceWrite(root, root).update(event, status="queued"))
    assert redis_client.exists(keys.events(root))
    assert keys.TRACE_TTL_S - 60 < redis_client.ttl(keys.events(root)) <= keys.TRACE_TTL_S
