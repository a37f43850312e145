"""The fleet on real Celery workers and a real Redis: explore as a chord, collect, stop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.client import Fleet
from tests.fleetkit import celery_fleet, explore_script, wait_until
from workers.patches import chord_join
from workers.patches.result_backend import SendOnlyRedisBackend

pytestmark = [
    pytest.mark.integration,
    # Celery's in-process test worker and result consumer leave kombu sockets to the GC.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture
def fleet(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    """A client and one in-process threads worker on a flushed Redis."""
    with celery_fleet(redis_url, tmp_path, monkeypatch) as fleet:
        yield fleet


def test_explore_runs_as_a_chord_and_collects_every_branch(fleet: Fleet, tmp_path: Path) -> None:
    model = explore_script(tmp_path / "m.yaml", 20)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed", trace.error
    collaborators = fleet.store.collaborators(trace.trace_id)
    assert len(collaborators) == 20
    assert {c.status for c in collaborators} == {"completed"}
    for c in collaborators:
        child = fleet.store.get_trace(c.trace_id)
        assert child.parent_trace_id == trace.trace_id and child.mode == "explore"
    tool_results = [m for m in fleet.store.messages(trace.trace_id) if m.role == "tool"]
    assert len(tool_results) == 1, "the chord body collected the explore exactly once"
    assert "20 branches, 20 completed" in (tool_results[0].content or "")


def test_dispatching_leaves_no_result_subscriptions(
    fleet: Fleet, tmp_path: Path, redis_client: redis.Redis
) -> None:
    model = explore_script(tmp_path / "m.yaml", 12)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed"
    assert redis_client.pubsub_channels("celery-task-meta-*") == []


def stored_results(conn: redis.Redis) -> list[dict[str, Any]]:
    """Every task result in the backend (`result_extended`: with the task's name)."""
    return [json.loads(conn.get(key) or "{}") for key in conn.scan_iter("celery-task-meta-*")]


def test_branches_and_body_store_no_result_and_the_fleet_join_leaves_only_its_mark(
    fleet: Fleet, tmp_path: Path, redis_client: redis.Redis
) -> None:
    model = explore_script(tmp_path / "m.yaml", 12)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed"  # the body ran: it wrote the explore's tool result
    time.sleep(0.5)  # what the body's task does after it settled (a stored result, once)
    assert stored_results(redis_client) == []
    (mark,) = redis_client.scan_iter("celery-taskset-meta-*")  # no parts, no `.s` size key
    assert mark.endswith(chord_join.CLAIM_SUFFIX) and redis_client.get(mark) == "done"
    assert redis_client.ttl(mark) > 0


def test_each_branch_counts_its_part_in_the_write_that_ends_it(
    fleet: Fleet, tmp_path: Path, redis_client: redis.Redis
) -> None:
    redis_client.script_flush()  # scripts are per server: run since this flush, or not
    model = explore_script(tmp_path / "m.yaml", 12)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed"
    assert len(fleet.store.collaborators(trace.trace_id)) == 12
    part_return = SendOnlyRedisBackend.fleet_join_script.sha
    assert redis_client.script_exists(part_return) == [False], "no part needed a report"


def test_a_plain_chord_keeps_celerys_join(fleet: Fleet, redis_client: redis.Redis) -> None:
    from celery import chord

    from workers.app import app

    def accumulate(*args: Any, **kwargs: Any) -> Any:  # Celery's builtin: returns its args
        return app.signature("celery.accumulate", args, kwargs, queue="fleet.main")

    header = [accumulate(i, index=0).set(immutable=True) for i in range(5)]
    body = chord(header, accumulate()).apply_async()

    def body_done() -> bool:
        raw = redis_client.get(f"celery-task-meta-{body.id}")
        return raw is not None and json.loads(raw)["status"] == "SUCCESS"

    wait_until(body_done, 30, "the plain chord's body")
    assert json.loads(redis_client.get(f"celery-task-meta-{body.id}") or "")["result"] == [
        [0, 1, 2, 3, 4]
    ]
    assert sum(r["name"] == "celery.accumulate" for r in stored_results(redis_client)) == 6
    # Celery marks its join done after the body's result is stored: a moment, or more when loaded.
    join = f"celery-taskset-meta-{body.parent.id}.c"
    wait_until(lambda: redis_client.get(join) == "done", 30, "Celery's join")


def test_a_raising_branch_leaves_its_siblings(fleet: Fleet, tmp_path: Path) -> None:
    model = explore_script(tmp_path / "m.yaml", 20, fail=7)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed"
    statuses = [c.status for c in fleet.store.collaborators(trace.trace_id)]
    assert statuses.count("completed") == 19 and statuses.count("failed") == 1
    failed = next(c for c in fleet.store.collaborators(trace.trace_id) if c.status == "failed")
    assert "branch exploded" in failed.summary


def test_stop_on_the_root_stops_every_descendant(fleet: Fleet, tmp_path: Path) -> None:
    model = explore_script(tmp_path / "m.yaml", 6, latency_ms=200, branch_turns=50)
    handle = fleet.submit("survey", model=model)
    wait_until(
        lambda: (
            len(fleet.store.children(handle.trace_id)) == 6
            and any(
                fleet.trace(c).status == "running" for c in fleet.store.children(handle.trace_id)
            )
        ),
        30,
        "branches to start",
    )
    fleet.stop(handle.trace_id)
    root = handle.wait(timeout_s=30)
    assert root.status == "stopped"
    wait_until(
        lambda: all(fleet.trace(c).is_terminal for c in fleet.store.children(handle.trace_id)),
        30,
        "every branch to end",
    )
    assert {fleet.trace(c).status for c in fleet.store.children(handle.trace_id)} == {"stopped"}


def test_task_messages_carry_ids_not_payloads(fleet: Fleet, tmp_path: Path) -> None:
    from workers.app import app

    assert app.conf.accept_content == ["json"]
    assert app.conf.task_serializer == "json"
    model = explore_script(tmp_path / "m.yaml", 2)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed"
