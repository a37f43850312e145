"""A worker's task events, as an event consumer receives them: all there, in batches."""

from __future__ import annotations

import base64
import json
import random
import string
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.app import trace as celery_trace
from celery.utils.saferepr import saferepr

from fleet.client import Fleet
from tests.fleetkit import explore_script, wait_until
from workers import patches
from workers.patches.events import EVENT_FLUSH_INTERVAL_S, result_repr

BRANCHES = 12


@pytest.fixture
def fleet(worker_fleet: Fleet) -> Fleet:
    return worker_fleet


def event_messages(pubsub: Any) -> list[list[dict[str, Any]]]:
    """The task events of each event message received so far (kombu's fanout on Redis)."""
    batches = []
    while (raw := pubsub.get_message(timeout=0.01)) is not None:
        if raw["type"] != "pmessage":
            continue
        envelope = json.loads(raw["data"])
        body = envelope["body"]
        if envelope["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        events = json.loads(body)
        events = events if isinstance(events, list) else [events]
        batches.append([e for e in events if e["type"].startswith("task-")])
    return [b for b in batches if b]


@pytest.mark.integration
def test_every_task_event_arrives_and_they_come_batched(
    fleet: Fleet, worker_url: str, tmp_path: Path
) -> None:
    with redis.Redis.from_url(worker_url) as conn, conn.pubsub() as pubsub:
        pubsub.psubscribe("*celeryev*")
        root = fleet.submit("survey", model=explore_script(tmp_path / "m.yaml", BRANCHES))
        assert root.wait(timeout_s=60).status == "completed"
        done_s = time.monotonic()
        batches: list[list[dict[str, Any]]] = []
        kinds: dict[str, set[str]] = defaultdict(set)

        def every_task_received_started_and_succeeded() -> bool:
            for batch in event_messages(pubsub):
                batches.append(batch)
                for event in batch:
                    kinds[event["uuid"]].add(event["type"])
            ended = {"task-received", "task-started", "task-succeeded"}
            runs = [u for u, k in kinds.items() if "task-received" in k]
            # the root, its branches, the chord body, the resume
            return len(runs) >= BRANCHES + 3 and all(kinds[u] >= ended for u in runs)

        wait_until(every_task_received_started_and_succeeded, 10.0, "every task's events")
        tail_s = time.monotonic() - done_s
    worker_events = [e for b in batches for e in b if e["type"] != "task-sent"]
    worker_batches = [b for b in batches if b[0]["type"] != "task-sent"]
    assert len(worker_events) >= 3 * (BRANCHES + 3)
    assert len(worker_batches) < len(worker_events) / 2, "published in batches"
    assert tail_s < 10 * EVENT_FLUSH_INTERVAL_S + 2.0, "the last ones did not wait for more"


def test_a_results_shown_repr_is_celerys_saferepr() -> None:
    rng = random.Random(14)
    plain = string.ascii_letters + string.digits + " @._-:'\"\\\n\té€{}"
    results: list[Any] = [
        {"trace_id": "root@explore-001-1700000000000-001", "outcome": "completed"},
        {"k": "x" * 2000},
        None,
        [1, "a"],
        {"n": 1},
        {1: "a"},
        "text",
    ]
    for _ in range(5_000):
        results.append(
            {
                "".join(rng.choice(plain) for _ in range(rng.randint(0, 10))): "".join(
                    rng.choice(plain) for _ in range(rng.randint(0, 40))
                )
                for _ in range(rng.randint(0, 3))
            }
        )
    for result in results:
        assert result_repr(result, 1024) == saferepr(result, 1024), result
    patches.configure(())  # what configuring the app does with every patch on
    assert celery_trace.saferepr is result_repr
