"""A soak: mixed trees at a steady rate for a long time; what grows is the result.

python -m bench.soak [--minutes 30] [--rate-per-min 30] [--workers 2] [--csv FILE]
                     [--memtrace DIR]

Two `fleet worker` processes on their own redis-server and a local OpenAI-wire server
(`bench.openai_server`, `--latency-ms` per call). Every 60 / `--rate-per-min` seconds one tree
is submitted, in turn: an explore of 3 branches, one of 8, a one-call answer. Finished trees
are compacted by the workers' owner check and leave Redis after `--retention-s`
(FLEET_RETENTION_S), so a fleet in a steady state holds a steady number of trees.

Every minute one row: each worker's RSS, open files and threads (/proc), Redis
`used_memory` and keys, the queues' depth, and over the trees that ended that minute the
p50/p99 of submit -> first model call and of the tree's duration. At the end, the slope of
each column over the run after the first `--warmup-min` minutes, per 10 minutes: what grows.
With `--memtrace DIR` the workers run under tracemalloc (`bench.memtrace`), a snapshot a
minute, to compare: `python -m bench.memtrace --compare DIR/PID-005.snap DIR/PID-030.snap`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.fault_rig import Redis, Worker, start_worker, temporary_directory, wait_for
from bench.harness import openai_server
from fleet.client import Fleet
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleetops.metrics import redis_queue_lengths
from workers.app import QUEUES

CELERY_RESULTS = "celery-task*-meta-*"
"""Celery's result keys (chord bodies' results, the join's claim markers): `result_expires`."""
TASKS = ("survey the workspace in 3 branches", "survey the workspace in 8 branches", "hello")


@dataclass
class Tree:
    """One submitted tree, until it ends."""

    root_id: str
    submitted_ms: int


@dataclass
class Soak:
    """The fleet under soak, what is in flight, and the rows so far."""

    fleet: Fleet
    client: redis.Redis
    workers: list[Worker]
    model: str
    latency_ms: int
    open: list[Tree] = field(default_factory=list)
    rows: list[dict[str, float]] = field(default_factory=list)
    ended: list[tuple[float, float]] = field(default_factory=list)
    """(submit -> first call ms, duration ms) of the trees ended since the last row."""
    failed: int = 0
    submitted: int = 0

    def submit(self) -> None:
        """The next tree of the mix."""
        task = TASKS[self.submitted % len(TASKS)]
        handle = self.fleet.submit(task, model=self.model)
        self.open.append(Tree(handle.trace_id, int(time.time() * 1000)))
        self.submitted += 1

    def collect(self) -> None:
        """Note the trees that ended (first call and duration read from the root)."""
        still = []
        for tree in self.open:
            root = self.fleet.trace(tree.root_id)
            if not root.is_terminal:
                still.append(tree)
                continue
            self.failed += root.status != "completed"
            first = next(
                (m for m in self.fleet.store.messages(tree.root_id) if m.role == "assistant"),
                None,
            )
            answered_ms = first.created_at_ms if first else root.updated_at_ms
            first_call_ms = answered_ms - self.latency_ms - tree.submitted_ms
            ended_ms = root.finished_at_ms or root.updated_at_ms
            self.ended.append((max(0.0, first_call_ms), ended_ms - tree.submitted_ms))
        self.open = still

    def row(self, minute: int) -> dict[str, float]:
        """This minute's row (and the ended trees' percentiles since the last one)."""
        row: dict[str, float] = {"minute": minute}
        for i, worker in enumerate(self.workers):
            row |= {f"w{i}_{k}": v for k, v in process_numbers(worker.pid).items()}
        memory = self.client.info("memory")
        row["redis_used_mb"] = round(int(memory["used_memory"]) / 2**20, 2)
        row["redis_keys"] = int(self.client.dbsize())
        row["redis_keys_no_ttl"] = sum(lasting(self.client).values())
        row["celery_result_keys"] = sum(1 for _ in self.client.scan_iter(CELERY_RESULTS, 1000))
        row["queued"] = sum(redis_queue_lengths(self.client, QUEUES).values())
        row["in_flight"] = len(self.open)
        row |= percentiles("first_call_ms", [f for f, _ in self.ended])
        row |= percentiles("tree_ms", [d for _, d in self.ended])
        row["ended"] = len(self.ended)
        row["load1"] = round(os.getloadavg()[0], 1)  # the machine's: what moves p99 here
        self.ended = []
        self.rows.append(row)
        return row


def lasting(client: redis.Redis, over_s: int = -1) -> dict[str, int]:
    """Keys with no TTL (or one above `over_s`), by shape (ids folded): what a steady fleet
    must not grow."""
    shapes: dict[str, int] = {}
    for key in client.scan_iter(count=1000):
        ttl_s = client.ttl(key)
        if ttl_s == -1 or (over_s >= 0 and ttl_s > over_s):
            shape = re.sub(r"\d{8}T\d{6}-[0-9a-f]+|[0-9a-f]{8,}|\d+", "N", str(key))
            shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


def process_numbers(pid: int) -> dict[str, float]:
    """RSS in MB, open files and threads of one process (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = int(fields["VmRSS"].split()[0])
    return {
        "rss_mb": round(rss_kb / 1024, 1),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
    }


def percentiles(name: str, values: list[float]) -> dict[str, float]:
    """p50 and p99 of `values` (0 when there are none)."""
    if len(values) < 2:
        only = values[0] if values else 0.0
        return {f"{name}_p50": only, f"{name}_p99": only}
    cuts = statistics.quantiles(values, n=100)
    return {f"{name}_p50": round(statistics.median(values)), f"{name}_p99": round(cuts[98])}


def slope_per_10_min(rows: list[dict[str, float]], column: str) -> float:
    """Least-squares slope of a column against the minute, times ten."""
    xs = [r["minute"] for r in rows]
    ys = [r[column] for r in rows]
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return 10 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


@contextlib.contextmanager
def soaking(options: argparse.Namespace) -> Iterator[Soak]:
    """Redis, the provider, the workers and a client, for the run."""
    server = Redis()
    with contextlib.ExitStack() as stack:
        stack.callback(server.close)
        workspace = stack.enter_context(temporary_directory())
        config_dir = stack.enter_context(temporary_directory())
        base_url = stack.enter_context(openai_server())
        config = config_dir / "fleet.yaml"
        config.write_text(
            json.dumps(
                {
                    "providers": {"local": {"kind": "openai", "base_url": base_url}},
                    "models": {"soak": {"provider": "local", "name": f"lat{options.latency_ms}"}},
                }
            )
        )
        env = {
            "FLEET_REDIS_URL": server.url,
            "FLEET_BROKER_URL": server.url,
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_CONFIG": str(config),
            "FLEET_RETENTION_S": str(options.retention_s),
        }
        launcher = ("bench.memtrace", options.memtrace) if options.memtrace else ()
        workers = [start_worker(env, options.concurrency, launcher) for _ in range(options.workers)]
        for worker in workers:
            stack.callback(worker.stop)
        observer = stack.enter_context(RedisStore.from_url(server.url))
        names = {w.name for w in workers}
        wait_for(lambda: names <= set(observer.live_consumers("fleet.explore")), 90, "workers")
        fleet = Fleet.from_env(Settings.from_env({**os.environ, **env}))
        client = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        yield Soak(fleet, client, workers, "soak", options.latency_ms)


def run(soak: Soak, options: argparse.Namespace) -> None:
    """Submit at the rate, note what ended, a row a minute (printed as it comes)."""
    started_s = time.monotonic()
    every_s = 60.0 / options.rate_per_min
    next_submit_s, minute = started_s, 1
    while minute <= options.minutes:
        now_s = time.monotonic()
        if now_s >= next_submit_s:
            soak.submit()
            next_submit_s += every_s
        if now_s >= started_s + 60 * minute:
            soak.collect()
            print(json.dumps(soak.row(minute)), flush=True)
            minute += 1
        time.sleep(min(0.2, max(0.0, next_submit_s - time.monotonic())))
        if soak.submitted % 5 == 0:
            soak.collect()


def main(argv: list[str] | None = None) -> int:
    """Soak, then print the slopes after the warm-up."""
    options = parse(argv)
    with soaking(options) as soak:
        run(soak, options)
        rows = [r for r in soak.rows if r["minute"] > options.warmup_min] or soak.rows
        columns = [c for c in rows[0] if c != "minute"]
        slopes = {c: round(slope_per_10_min(rows, c), 2) for c in columns}
        print(json.dumps({"slopes_per_10_min_after_warmup": slopes, "failed": soak.failed}))
        print(json.dumps({"keys_without_ttl": lasting(soak.client)}))
        longer = lasting(soak.client, over_s=10 * options.retention_s)
        print(json.dumps({"keys_kept_past_10x_retention": longer}))
        if options.csv:
            header = list(soak.rows[0])
            lines = [",".join(header)] + [",".join(str(r[h]) for h in header) for r in soak.rows]
            Path(options.csv).write_text("\n".join(lines) + "\n")
    return 0 if soak.failed == 0 else 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options."""
    parser = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--minutes", type=int, default=30)
    add("--warmup-min", type=int, default=1, help="minutes left out of the slopes")
    add("--rate-per-min", type=float, default=30.0, help="trees submitted per minute")
    add("--latency-ms", type=int, default=200, help="the provider's time per call")
    add("--workers", type=int, default=2)
    add("--concurrency", type=int, default=8)
    add("--retention-s", type=int, default=60, help="FLEET_RETENTION_S")
    add("--csv", help="also write every row to this CSV file")
    add("--memtrace", help="run the workers under tracemalloc, a snapshot a minute in this dir")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
