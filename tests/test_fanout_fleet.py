"""Bounded fan-out and fair sharing on a real Celery worker and Redis (scripted models)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.client import Fleet
from fleet.models import Trace
from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import celery_fleet, client, explore_script, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WORKER_THREADS = 16


@pytest.fixture
def fleet(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    """A client and one in-process threads worker on a flushed Redis."""
    with celery_fleet(redis_url, tmp_path, monkeypatch, WORKER_THREADS) as fleet:
        yield fleet


class RunningSampler:
    """Counts a root's children in status `running`, over and over, in a thread."""

    def __init__(self, fleet: Fleet, root_id: str) -> None:
        self.fleet, self.root_id = fleet, root_id
        self.peak = 0
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        store = self.fleet.store
        while not self._done.is_set():
            # One read of every child (a MULTI): read one by one, a branch that ended and
            # the one that took its slot could both be counted, on a loaded machine.
            children = store.get_traces(store.children(self.root_id))
            running = sum(child.status == "running" for child in children)
            self.peak = max(self.peak, running)
            self.samples += 1

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_events(fleet: Fleet, root_id: str) -> dict[str, int]:
    """How often each trace of the tree was set `running` (a handed-back run is set twice)."""
    counts: dict[str, int] = {}
    for _, event in fleet.store.read_events(root_id, count=100_000):
        if event.kind == "trace" and event.status == "running":
            counts[event.trace_id] = counts.get(event.trace_id, 0) + 1
    return counts


def run_started_ms(fleet: Fleet, root_id: str) -> dict[str, int]:
    """When each trace of the tree was (last) set running."""
    return {
        event.trace_id: event.at_ms
        for _, event in fleet.store.read_events(root_id, count=100_000)
        if event.kind == "trace" and event.status == "running"
    }


@pytest.mark.serial
def test_max_concurrent_bounds_running_branches_and_no_slot_waits(
    fleet: Fleet, tmp_path: Path
) -> None:
    branches, window, latency_ms = 100, 10, 30
    model = explore_script(tmp_path / "m.yaml", branches, latency_ms=latency_ms)
    handle = fleet.submit("survey", model=model, max_concurrent=window)
    sampler = RunningSampler(fleet, handle.trace_id)
    try:
        trace = handle.wait(timeout_s=120)
    finally:
        sampler.stop()
    assert trace.status == "completed", trace.error
    statuses = [c.status for c in fleet.store.collaborators(trace.trace_id)]
    assert statuses == ["completed"] * branches
    assert sampler.samples > 20
    assert 1 <= sampler.peak <= window, sampler.peak
    # Every branch ran in one go (never handed back), and its task took its two model calls
    # and little more: waiting for the window held no worker slot.
    counts = run_events(fleet, trace.trace_id)
    children = [fleet.trace(c) for c in fleet.store.children(trace.trace_id)]
    assert [counts.get(c.trace_id) for c in children] == [1] * branches
    started = run_started_ms(fleet, trace.trace_id)
    held_s = [((c.finished_at_ms or 0) - started[c.trace_id]) / 1000 for c in children]
    print(f"branch run: max {max(held_s):.2f} s for 2 calls of {latency_ms} ms")
    assert max(held_s) < 2 * latency_ms / 1000 + 1.0


def test_an_explore_wider_than_max_branches_is_refused_to_the_model(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_MAX_BRANCHES", "5")
    from workers.runtime import reset_runtime

    reset_runtime()
    model = explore_script(tmp_path / "m.yaml", 6)
    trace = fleet.submit("survey", model=model).wait(timeout_s=60)
    assert trace.status == "completed"
    assert fleet.store.children(trace.trace_id) == []
    refusal = next(m for m in fleet.store.messages(trace.trace_id) if m.role == "tool")
    assert "6 branches asked for, at most 5 per explore call (max_branches)" in (
        refusal.content or ""
    )


def elapsed_s(trace: Trace) -> float:
    assert trace.finished_at_ms is not None
    return (trace.finished_at_ms - trace.created_at_ms) / 1000


@pytest.fixture
def two_workers(redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Fleet]:
    """Two worker processes of 8 threads each, and a client."""
    env = {"FLEET_WORKSPACE": str(tmp_path)}
    with (
        start_worker(redis_url, concurrency=8, env_extra=env) as first,
        start_worker(redis_url, concurrency=8, env_extra=env) as second,
    ):
        wait_for_workers(redis_url, [first.name, second.name], timeout_s=60)
        fleet = client(fleet_settings(redis_url, tmp_path))
        yield fleet
        assert isinstance(fleet.store, RedisStore)
        fleet.store.close()


BIG = 300


def test_an_interactive_tree_is_not_starved_by_a_big_batch_tree(
    two_workers: Fleet, tmp_path: Path
) -> None:
    fleet = two_workers
    # Model latency dominates both trees, as it does with real models (and CPU noise on a
    # shared CI machine matters less).
    small = explore_script(tmp_path / "small.yaml", 3, latency_ms=500)
    # Medians of three runs each: a shared CI machine's noise hits single runs.
    idle_s = statistics.median(
        elapsed_s(fleet.submit("quick look", model=small).wait(60)) for _ in range(3)
    )
    # Real models vary: without jitter every batch branch would end in the same instant and
    # free the slots in waves a whole call apart.
    big = explore_script(tmp_path / "big.yaml", BIG, latency_ms=250, jitter_ms=500)
    batch = fleet.submit("survey everything", model=big, priority="batch")
    wait_until(
        lambda: len(fleet.store.children(batch.trace_id)) == BIG,
        60,
        "the batch tree to spawn its branches",
    )
    time.sleep(0.3)  # let the branches fill the workers' slots and the queue
    runs = [fleet.submit("quick look", model=small).wait(60) for _ in range(3)]
    assert {r.status for r in runs} == {"completed"}
    assert not fleet.trace(batch.trace_id).is_terminal, "the batch tree was still running"
    busy_s = statistics.median(elapsed_s(r) for r in runs)
    print(f"3-branch tree: idle {idle_s:.2f} s, beside a big batch tree {busy_s:.2f} s")
    assert busy_s <= 1.5 * idle_s, (busy_s, idle_s)
    fleet.stop(batch.trace_id)
