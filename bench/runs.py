"""One timed run of each column: the fleet, the plain chords, asyncio, and `fleet run`."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import chord
from celery.result import AsyncResult

from bench import peer_tasks, sleep_tasks
from bench.harness import Meter, Usage, quiesce
from fleet.client import Fleet
from fleet.storage.store import TraceStore
from workers.app import app


@dataclass(frozen=True)
class Sample:
    """One run: wall seconds, Redis commands, worker CPU seconds, peak extra worker RSS,
    Redis CPU seconds, and the Redis memory the run left behind (what its TTLs keep)."""

    seconds: float
    commands: int
    cpu_s: float
    rss_bytes: int
    redis_cpu_s: float = 0.0
    redis_bytes: int = 0


def _measured(
    meter: Meter, pids: list[int], start_and_wait: Callable[[], tuple[float, float]]
) -> Sample:
    """Run `start_and_wait` (-> start, end clock) under the meters, until the queues drain."""
    before, redis_cpu, redis_bytes = meter.total(), meter.redis_cpu_s(), meter.redis_bytes()
    meter.polls = 0
    with Usage(pids) as usage:
        start, end = start_and_wait()
        quiesce(meter.client)
    commands = meter.total() - before - meter.polls
    return Sample(
        end - start,
        commands,
        usage.cpu_s,
        usage.rss_peak - usage.rss_start,
        meter.redis_cpu_s() - redis_cpu,
        meter.redis_bytes() - redis_bytes,
    )


def fleet_run(fleet: Fleet, meter: Meter, pids: list[int], task: str, model: str) -> Sample:
    """Submit a root and wait for its `finished_at_ms`."""
    trace_ids: list[str] = []
    starts: list[float] = []

    def run() -> tuple[float, float]:
        start = time.time()
        handle = fleet.submit(task, model=model)
        trace_ids.append(handle.trace_id)
        starts.append(start)
        key = f"fleet:trace:{handle.trace_id}"

        def finished() -> float | None:
            value = meter.client.hget(key, "finished_at_ms")
            return None if value in (None, "null") else int(str(value)) / 1000

        return start, meter.wait(finished)

    sample = _measured(meter, pids, run)
    trace = fleet.trace(trace_ids[0])
    if trace.status != "completed":
        raise RuntimeError(f"fleet run ended {trace.status!r}: {trace.error}")
    if os.environ.get("BENCH_PHASES"):
        where = phases(fleet.store, trace_ids[0], int(starts[0] * 1000))
        print(f"#   phases (s): {where}", flush=True)
    return sample


def _body_time(meter: Meter, task_id: str) -> Callable[[], float | None]:
    key = f"celery-task-meta-{task_id}"

    def finished() -> float | None:
        raw = meter.client.get(key)
        if raw is None:
            return None
        meta = app.backend.decode_result(raw)
        return float(meta["result"]) if meta["status"] == "SUCCESS" else None

    return finished


def chord_run(meter: Meter, pids: list[int], n: int, latency_ms: int) -> Sample:
    """`chord(N x bench.sleep(2L), bench.done)`: the scripted rows' peer."""
    seconds = 2 * latency_ms / 1000
    header = [sleep_tasks.sleep.si(seconds).set(queue="fleet.explore") for _ in range(n)]
    return _chord_sample(meter, pids, header, sleep_tasks.done.s().set(queue="fleet.main"))


def durable_chord_run(meter: Meter, pids: list[int], n: int, latency_ms: int) -> Sample:
    """`chord(N x bench.durable_sleep(2L), bench.done)`: the plain chord plus each task's
    three store round trips (bench/floor_bench.py's floor)."""
    seconds = 2 * latency_ms / 1000
    header = [
        sleep_tasks.durable_sleep.si(seconds, str(i)).set(queue="fleet.explore") for i in range(n)
    ]
    return _chord_sample(meter, pids, header, sleep_tasks.done.s().set(queue="fleet.main"))


def rooted_chord_run(meter: Meter, pids: list[int], n: int, latency_ms: int) -> Sample:
    """`bench.sleep_root`: the fleet run's calls (the root's two too), the chord sent from a
    worker: the scripted rows' same-calls peer."""
    seconds = latency_ms / 1000
    return _rooted_sample(
        meter, pids, sleep_tasks.sleep_root, lambda body_id: (n, seconds, body_id)
    )


def http_chord_run(meter: Meter, pids: list[int], base_url: str, task: str, model: str) -> Sample:
    """`bench.http_root`: the same completions as the fleet run, in a plain chord."""
    return _rooted_sample(
        meter, pids, peer_tasks.http_root, lambda body_id: (base_url, model, task, body_id)
    )


def _rooted_sample(
    meter: Meter, pids: list[int], root: Any, args: Callable[[str], tuple[Any, ...]]
) -> Sample:
    """One measured root task that sends its chord from the worker; ends when the body ran."""
    body_id = str(uuid.uuid4())

    def run() -> tuple[float, float]:
        start = time.time()
        root.apply_async(args(body_id), queue="fleet.main", ignore_result=True)
        return start, meter.wait(_body_time(meter, body_id))

    sample = _measured(meter, pids, run)
    AsyncResult(body_id, app=app).forget()
    return sample


def bare_http_chord_run(meter: Meter, pids: list[int], base_url: str, n: int, model: str) -> Sample:
    """`chord(N x bench.http_branch, bench.done)` sent from here: no root calls, no worker send."""
    header = [
        peer_tasks.http_branch.si(base_url, model, f"Branch {i} of the survey").set(
            queue="fleet.explore"
        )
        for i in range(1, n + 1)
    ]
    return _chord_sample(meter, pids, header, sleep_tasks.done.s().set(queue="fleet.main"))


def _chord_sample(meter: Meter, pids: list[int], header: list[Any], body: Any) -> Sample:
    """One measured `chord(header, body)` sent from here, its pending results dropped after."""
    results: list[Any] = []

    def run() -> tuple[float, float]:
        start = time.time()
        results.append(chord(header, body).apply_async())
        return start, meter.wait(_body_time(meter, results[0].id))

    sample = _measured(meter, pids, run)
    # The group barrier registered every header result as pending, and nothing here drains
    # them: drop them now, so they unsubscribe while Redis still runs (Celery has no API).
    for mapping in app.backend._pending_results:
        for header_result in results[0].parent.results:
            mapping.pop(header_result.id, None)
    results.clear()
    gc.collect()
    return sample


def asyncio_run(n: int, latency_ms: int, root_calls: bool) -> float:
    """`gather` of N coroutines of 2 x sleep(L); with the root's two calls around it."""

    async def branch() -> None:
        for _ in range(2):
            await asyncio.sleep(latency_ms / 1000)

    async def main() -> None:
        if root_calls:
            await asyncio.sleep(latency_ms / 1000)
        await asyncio.gather(*(branch() for _ in range(n)))
        if root_calls:
            await asyncio.sleep(latency_ms / 1000)

    start = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - start


def cli_run(env: Mapping[str, str], model: str, *, inline: bool, task: str = "say hello") -> float:
    """Wall seconds of one `fleet run [--inline] --model MODEL TASK` process."""
    argv = [sys.executable, "-m", "fleetops.cli.main", "run", "--model", model, task]
    if inline:
        argv.append("--inline")
    start = time.perf_counter()
    done = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, timeout=120, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} exited {done.returncode}: {done.stderr!r}")
    return seconds


def phases(store: TraceStore, root_id: str, submitted_ms: int) -> str:
    """Where a fleet run's time went, from the tree's event stream (seconds after submit).

    Each mark is the first (or last) event of its kind, at the time the event was made:
    the root started, its first model turn stored, the children created (their `queued`
    entries), the first and last branch started, the last branch done, the collect (the
    root's tool result), the root resumed (running again), its final turn, the root done.
    A mark whose events the store does not write is left out.
    """
    events = [e for _, e in store.read_events(root_id, count=1_000_000)]
    root = [e for e in events if e.trace_id == root_id]
    kids = [e for e in events if e.trace_id != root_id]
    running = [e.at_ms for e in root if e.kind == "trace" and e.status == "running"]
    turns = [e.at_ms for e in root if e.kind == "message" and e.data.get("role") == "assistant"]
    starts = [e.at_ms for e in kids if e.kind == "trace" and e.status == "running"]
    marks = {
        "root started": running[:1],
        "first turn": turns[:1],
        "spawned": [e.at_ms for e in kids if e.kind == "collaborator" and e.status == "queued"],
        "first branch": starts and [min(starts)],
        "last branch": starts,
        "all done": [e.at_ms for e in kids if e.kind == "finish"],
        "collected": [
            e.at_ms for e in root if e.kind == "message" and e.data.get("role") == "tool"
        ][:1],
        "resumed": running[-1:],
        "final turn": turns[-1:],
        "root done": [e.at_ms for e in root if e.kind == "finish"][:1],
    }
    return "  ".join(f"{k} {(max(ms) - submitted_ms) / 1000:.3f}" for k, ms in marks.items() if ms)
