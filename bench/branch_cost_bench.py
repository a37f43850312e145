"""A fleet run against a plain Celery task making the same HTTP call, side by side (issue 40).

python bench/branch_cost_bench.py [--quick] [--repeat 3] [--samples 40] [--runs 300]

One redis-server, the local OpenAI-wire server at 0 ms (`bench/openai_server.py`, which
notes when each task's first request arrived and when an `agent` answer left), 2 worker
processes x 16 threads (`bench.harness.workers`). Every row alternates the two columns
within each repeat; the medians of the repeats are printed with their ratio:

- submit -> first request, p50/p90/p99: `Fleet.submit` of a one-turn task against
  `bench.http_once.apply_async` (one completion, the fleet's system prompt), each timed
  from the caller's call to the provider's receipt of the request;
- child dispatch, p50: a root's `agent` answer for 4 branches leaving the provider ->
  each branch's first request arriving, against `bench.http_root` (the same completion,
  then a chord of `bench.http_branch` sent from the task);
- one-turn runs/s: `--runs` queued while no worker consumes, then consumed: the last
  finish (`finished_at_ms`, the result's `date_done`) after the consumers were added;
- worker CPU per run over that drain, and Redis commands per run (`INFO commandstats`,
  commands inside Lua scripts count) from the first submission to the drain's end, the
  bench's own polls left out. `BENCH_COMMANDS=1` prints them by command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.explore_bench import HTTP_PROVIDER, environment  # noqa: E402
from bench.harness import Meter, Usage, load, openai_server, quiesce, workers  # noqa: E402
from bench.peer_tasks import http_once, http_root  # noqa: E402
from fleet.client import Fleet  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from workers.app import QUEUES, app  # noqa: E402

MODEL = "lat0"
BRANCHES = 4
POLL_S = 0.002


class Provider:
    """The fake provider's arrival log."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http = httpx.Client(timeout=30.0)

    def seen(self, clear: bool = False) -> dict[str, Any]:
        url = f"{self.base_url}/arrivals" + ("?clear" if clear else "")
        found: dict[str, Any] = self.http.get(url).json()
        return found

    def until(
        self, done: Callable[[dict[str, Any]], bool], timeout_s: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done(seen := self.seen()):
                return seen
            time.sleep(POLL_S)
        raise TimeoutError("the provider did not see the requests in time")


def first_request_s(provider: Provider, send: Callable[[str], object]) -> float:
    """Seconds from `send(task)` to the provider's receipt of the task's first request."""
    provider.seen(clear=True)
    task = f"one-turn probe {uuid.uuid4().hex}"
    start = time.time()
    send(task)
    seen = provider.until(lambda s: task in s["first"])
    return float(seen["first"][task]) - start


def dispatch_s(provider: Provider, send: Callable[[str], object]) -> list[float]:
    """Each branch's first request after the root's `agent` answer left, seconds."""
    provider.seen(clear=True)
    task = f"survey the workspace in {BRANCHES} branches ({uuid.uuid4().hex[:8]})"
    send(task)
    seen = provider.until(lambda s: s["count"] >= 2 + 2 * BRANCHES)
    time.sleep(0.2)  # the root's summary and the tree's end
    spawned = float(seen["spawned"][task])
    firsts = [seen["first"][f"Branch {i} of the survey"] for i in range(1, BRANCHES + 1)]
    return [float(first) - spawned for first in firsts]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Drain:
    """`runs` one-turn runs queued with no consumer, then drained: runs/s, CPU, commands."""

    def __init__(self, meter: Meter, pids: list[int], names: list[str]) -> None:
        self.meter, self.pids, self.names = meter, pids, names

    def consumers(self, on: bool) -> None:
        for queue in QUEUES:
            if on:
                app.control.add_consumer(queue, destination=self.names, reply=True)
            else:
                app.control.cancel_consumer(queue, destination=self.names, reply=True)

    def measure(
        self, queue_all: Callable[[], Callable[[], float | None]], runs: int
    ) -> dict[str, float]:
        self.consumers(False)
        before, by_name = self.meter.total(), by_command(self.meter.client)
        finished = queue_all()  # the submissions' commands count too
        with Usage(self.pids) as usage:
            start = time.time()
            self.consumers(True)
            while (end := finished()) is None:
                time.sleep(0.05)
            quiesce(self.meter.client)
        commands = self.meter.total() - before - self.meter.polls
        self.meter.polls = 0
        if os.environ.get("BENCH_COMMANDS"):  # where the commands went, per run
            spent = by_command(self.meter.client) - by_name
            print("#   " + " ".join(f"{k}={v / runs:.1f}" for k, v in spent.most_common()))
        return {
            "runs/s": runs / (end - start),
            "worker cpu ms/run": 1000 * usage.cpu_s / runs,
            "redis cmds/run": commands / runs,
        }


def by_command(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def fleet_queued(fleet: Fleet, meter: Meter, runs: int) -> Callable[[], float | None]:
    tag = uuid.uuid4().hex[:8]
    ids = [
        fleet.submit(f"one-turn {tag} {i}", model=f"{HTTP_PROVIDER}:{MODEL}").trace_id
        for i in range(runs)
    ]

    def finished() -> float | None:
        meter.polls += len(ids)
        with meter.client.pipeline(transaction=False) as pipe:
            for trace_id in ids:
                pipe.hget(f"fleet:trace:{trace_id}", "finished_at_ms")
            values = pipe.execute()
        if any(v in (None, "null") for v in values):
            return None
        return max(int(str(v)) for v in values) / 1000

    return finished


def plain_queued(base_url: str, meter: Meter, runs: int) -> Callable[[], float | None]:
    tag = uuid.uuid4().hex[:8]
    ids = [
        http_once.apply_async((base_url, MODEL, f"one-turn {tag} {i}"), queue="fleet.main").id
        for i in range(runs)
    ]

    def finished() -> float | None:
        meter.polls += len(ids)
        with meter.client.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.get(f"celery-task-meta-{task_id}")
            raws = pipe.execute()
        if any(r is None for r in raws):
            return None
        done = [datetime.fromisoformat(app.backend.decode_result(r)["date_done"]) for r in raws]
        return max(d.timestamp() for d in done)

    return finished


KINDS = ("fleet", "plain")


def row(name: str, fleet: list[float], plain: list[float], higher: bool) -> None:
    f, p = statistics.median(fleet), statistics.median(plain)
    ratios = sorted(a / b for a, b in zip(fleet, plain, strict=True) if b)
    spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios else "-"
    better = "higher is better" if higher else "lower is better"
    print(f"{name:28s} fleet {f:8.2f}  plain {p:8.2f}  ratio {f / p:5.2f}x", end="")
    print(f"  (repeats {spread}; {better})", flush=True)


@dataclass
class Columns:
    """What each column runs: its one-turn send, its spawn, its queued drain."""

    send: dict[str, Callable[[str], object]]
    spawn: dict[str, Callable[[str], object]]
    queued: dict[str, Callable[[], Callable[[], float | None]]]


def columns(fleet: Fleet, base_url: str, meter: Meter, runs: int) -> Columns:
    model = f"{HTTP_PROVIDER}:{MODEL}"

    def plain_root(task: str) -> object:
        return http_root.apply_async((base_url, MODEL, task, uuid.uuid4().hex), queue="fleet.main")

    return Columns(
        send={
            "fleet": lambda task: fleet.submit(task, model=model),
            "plain": lambda task: http_once.apply_async(
                (base_url, MODEL, task), queue="fleet.main"
            ),
        },
        spawn={"fleet": lambda task: fleet.submit(task, model=model), "plain": plain_root},
        queued={
            "fleet": lambda: fleet_queued(fleet, meter, runs),
            "plain": lambda: plain_queued(base_url, meter, runs),
        },
    )


def one_repeat(
    provider: Provider, cols: Columns, drain: Drain, samples: int, runs: int
) -> dict[str, dict[str, float]]:
    """Every row once, the columns alternated within each row."""
    firsts: dict[str, list[float]] = {k: [] for k in KINDS}
    children: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(samples):
        for kind in KINDS:
            firsts[kind].append(1000 * first_request_s(provider, cols.send[kind]))
    for _ in range(max(3, samples // 8)):
        for kind in KINDS:
            children[kind] += [1000 * s for s in dispatch_s(provider, cols.spawn[kind])]
    out: dict[str, dict[str, float]] = {k: {} for k in KINDS}
    for kind in KINDS:
        for q in (0.5, 0.9, 0.99):
            out[kind][f"submit->1st request p{int(q * 100)} ms"] = percentile(firsts[kind], q)
        out[kind]["child dispatch p50 ms"] = percentile(children[kind], 0.5)
        out[kind].update(drain.measure(cols.queued[kind], runs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1 repeat, 20 samples, 100 runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.samples, args.runs = 1, 20, 100
    print(f"# load average before: {load()}; repeat={args.repeat} samples={args.samples}", end="")
    print(f" runs={args.runs}; 2 workers x 16 threads, provider at 0 ms", flush=True)
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        base_url = stack.enter_context(openai_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        env = environment(server.url, tmp, base_url)
        fleet = Fleet.from_env(Settings.from_env(env))
        app.conf.broker_url = app.conf.result_backend = server.url
        procs = stack.enter_context(workers(env, "threads", 16, 2))
        client = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        provider, meter = Provider(base_url), Meter(client)
        drain = Drain(meter, [w.pid for w in procs], [w.name for w in procs])
        cols = columns(fleet, base_url, meter, args.runs)
        for kind in KINDS:  # warm-up: imports, connections, pools
            first_request_s(provider, cols.send[kind])
            dispatch_s(provider, cols.spawn[kind])
        repeats = [
            one_repeat(provider, cols, drain, args.samples, args.runs) for _ in range(args.repeat)
        ]
        print(f"# medians of {args.repeat} repeat(s); load average after: {load()}")
        for name in repeats[0]["fleet"]:
            fleet_values = [r["fleet"][name] for r in repeats]
            row(name, fleet_values, [r["plain"][name] for r in repeats], name == "runs/s")


if __name__ == "__main__":
    main()
