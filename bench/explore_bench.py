"""Explore through the fleet vs a plain Celery chord vs asyncio, on one machine.

python bench/explore_bench.py [--sizes 10,100,1000] [--latencies 0,200] [--pool threads]
                              [--concurrency C] [--workers W] [--repeat R] [--quick]

Starts its own redis-server and worker process(es) (the fleet's Celery app and queues, plus
`bench.sleep_tasks` via `-I`), then for each N and model latency L measures:

- fleet: a main agent exploring N branches with a scripted model of L ms per call; each
  branch makes 2 calls (list_dir, then answer); the root makes 2 (spawn, summarise).
  Wall time from submit to the root trace's `finished_at_ms`.
- chord: `chord(N x bench.sleep(2L), bench.done)` on the same Redis and workers; wall time
  from send to the body's own clock.
- asyncio: `gather` of N coroutines each doing 2 x sleep(L) in this process (the ideal).
  `ideal` adds the root's two calls around it (L + gather + L): the same simulated calls
  as the fleet run, which can never beat 4L.

Redis commands are the INFO commandstats delta over a run (the bench's own polling
subtracted), divided by N.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import chord
from celery._state import _set_task_join_will_block

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import sleep_tasks  # noqa: E402
from fleet.client import Fleet  # noqa: E402
from fleet.redis_server import start_redis_server  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from tests.procs import WorkerProcess, wait_for_workers  # noqa: E402
from workers.app import QUEUES, app  # noqa: E402

POLL_S = 0.01
RUN_TIMEOUT_S = 600.0
TARGETS = (
    # (latency_ms, n or None for any, versus, max ratio)
    (0, None, "chord", 3.0),
    (200, 100, "ideal", 2.0),
    (200, 1000, "chord", 1.5),
)


@dataclass(frozen=True)
class Row:
    n: int
    latency_ms: int
    fleet_s: float
    chord_s: float
    asyncio_s: float
    ideal_s: float
    fleet_cmds: float
    chord_cmds: float

    def ratio(self, versus: str) -> float:
        base = {"chord": self.chord_s, "asyncio": self.asyncio_s, "ideal": self.ideal_s}[versus]
        return self.fleet_s / base if base > 0 else float("inf")

    def verdicts(self) -> str:
        found = []
        for latency_ms, n, versus, limit in TARGETS:
            if latency_ms == self.latency_ms and n in (None, self.n):
                ok = self.ratio(versus) <= limit
                found.append(f"{'PASS' if ok else 'MISS'}(<={limit:g}x {versus})")
        return " ".join(found) or "-"


# -- processes -----------------------------------------------------------------


@contextmanager
def workers(
    redis_url: str, workspace: Path, pool: str, concurrency: int, count: int
) -> Iterator[list[WorkerProcess]]:
    env = {
        **os.environ,
        "FLEET_REDIS_URL": redis_url,
        "FLEET_BROKER_URL": redis_url,
        "FLEET_WORKSPACE": str(workspace),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
    }
    started: list[WorkerProcess] = []
    with ExitStack() as stack:
        for i in range(count):
            name = f"bench{i}.{os.getpid()}@{socket.gethostname()}"
            argv = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker"]
            argv += ["-I", "bench.sleep_tasks", "-Q", ",".join(QUEUES), "-E"]
            argv += ["-P", pool, "-c", str(concurrency), "-n", name, "--loglevel", "WARNING"]
            log_path = Path(tempfile.mkstemp(prefix="bench-worker-", suffix=".log")[1])
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(stack.enter_context(WorkerProcess(process, name, log_path)))
        wait_for_workers(app, [w.name for w in started], timeout_s=60)
        yield started


# -- measurements -----------------------------------------------------------------


class Meter:
    """Counts Redis commands over a block, minus the ones this bench sent to poll."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.polls = 0

    def total(self) -> int:
        stats = self.client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    def wait(self, done: Callable[[], float | None], timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Poll `done` (one Redis command) until it returns an end time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.polls += 1
            end = done()
            if end is not None:
                return end
            time.sleep(POLL_S)
        raise TimeoutError(f"run did not finish in {timeout_s} s")


def quiesce(client: redis.Redis) -> None:
    """Wait until every queue is empty, then a little more for trailing bookkeeping."""
    while any(client.llen(q) for q in QUEUES):
        time.sleep(0.05)
    time.sleep(0.3)


def phases(fleet: Fleet, root_id: str, start_s: float) -> str:
    """Where a fleet run's time went, from the stored timestamps (seconds after submit)."""
    store = fleet.runtime.store
    root = store.get_trace(root_id)
    kids = [store.get_trace(c) for c in store.children(root_id)]
    starts = [store.messages(k.trace_id)[0].created_at_ms for k in kids]
    ends = [k.finished_at_ms or 0 for k in kids]
    marks = {
        "spawned": min(k.created_at_ms for k in kids),
        "all spawned": max(k.created_at_ms for k in kids),
        "first branch started": min(starts),
        "all started": max(starts),
        "first done": min(ends),
        "all done": max(ends),
        "root done": root.finished_at_ms or 0,
    }
    return "  ".join(f"{name} {ms / 1000 - start_s:.2f}" for name, ms in marks.items())


def fleet_run(fleet: Fleet, meter: Meter, model: str) -> tuple[float, int]:
    before = meter.total()
    meter.polls = 0
    start = time.time()
    handle = fleet.submit("survey the workspace", model=model)
    key = f"fleet:trace:{handle.trace_id}"

    def finished() -> float | None:
        value = meter.client.hget(key, "finished_at_ms")
        return None if value in (None, "null") else int(str(value)) / 1000

    end = meter.wait(finished)
    trace = fleet.trace(handle.trace_id)
    if trace.status != "completed":
        raise RuntimeError(f"fleet run ended {trace.status!r}: {trace.error}")
    quiesce(meter.client)
    commands = meter.total() - before - meter.polls
    if os.environ.get("BENCH_PHASES"):
        print(f"#   phases (s): {phases(fleet, handle.trace_id, start)}", flush=True)
    return end - start, commands


def chord_run(meter: Meter, n: int, latency_ms: int) -> tuple[float, int]:
    before = meter.total()
    meter.polls = 0
    seconds = 2 * latency_ms / 1000
    header = [sleep_tasks.sleep.si(seconds).set(queue="fleet.explore") for _ in range(n)]
    body = sleep_tasks.done.s().set(queue="fleet.main")
    start = time.time()
    result = chord(header, body).apply_async()
    key = f"celery-task-meta-{result.id}"

    def finished() -> float | None:
        raw = meter.client.get(key)
        if raw is None:
            return None
        meta = app.backend.decode_result(raw)
        return float(meta["result"]) if meta["status"] == "SUCCESS" else None

    end = meter.wait(finished)
    quiesce(meter.client)
    commands = meter.total() - before - meter.polls
    # The group barrier registered every header result as pending, and nothing here drains
    # them: drop them now, so they unsubscribe while Redis still runs (Celery has no API).
    for mapping in app.backend._pending_results:
        for header in result.parent.results:
            mapping.pop(header.id, None)
    del result
    gc.collect()
    return end - start, commands


def asyncio_run(n: int, latency_ms: int, root_calls: bool) -> float:
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


def measure(fleet: Fleet, meter: Meter, models: Path, n: int, latency_ms: int, repeat: int) -> Row:
    model = explore_script(models / f"explore-{n}-{latency_ms}.yaml", n, latency_ms=latency_ms)
    fleet_s, fleet_cmds, chord_s, chord_cmds = [], [], [], []
    for _ in range(repeat):
        seconds, cmds = fleet_run(fleet, meter, model)
        fleet_s.append(seconds)
        fleet_cmds.append(cmds / n)
        seconds, cmds = chord_run(meter, n, latency_ms)
        chord_s.append(seconds)
        chord_cmds.append(cmds / n)
    med = statistics.median
    return Row(
        n=n,
        latency_ms=latency_ms,
        fleet_s=med(fleet_s),
        chord_s=med(chord_s),
        asyncio_s=med(asyncio_run(n, latency_ms, False) for _ in range(repeat)),
        ideal_s=med(asyncio_run(n, latency_ms, True) for _ in range(repeat)),
        fleet_cmds=med(fleet_cmds),
        chord_cmds=med(chord_cmds),
    )


# -- output -------------------------------------------------------------------------

HEADER = (
    f"{'N':>5} {'L ms':>5} {'fleet s':>8} {'chord s':>8} {'asyncio s':>9} {'ideal s':>8} "
    f"{'f/chord':>7} {'f/asyncio':>9} {'f/ideal':>7} {'cmds/br':>8} {'chord cmds/t':>12}  targets"
)


def format_row(row: Row) -> str:
    return (
        f"{row.n:>5} {row.latency_ms:>5} {row.fleet_s:>8.3f} {row.chord_s:>8.3f} "
        f"{row.asyncio_s:>9.3f} {row.ideal_s:>8.3f} {row.ratio('chord'):>7.2f} "
        f"{row.ratio('asyncio'):>9.2f} {row.ratio('ideal'):>7.2f} {row.fleet_cmds:>8.1f} "
        f"{row.chord_cmds:>12.1f}  {row.verdicts()}"
    )


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    return f"{os.cpu_count()} cpus ({cpu}), Python {platform.python_version()}, {platform.system()}"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- main ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=ints, default=[10, 100, 1000])
    parser.add_argument("--latencies", type=ints, default=[0, 200])
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork", "gevent"])
    # Defaults: the layout docs/performance.md recommends (a process per core, 100 threads).
    parser.add_argument("--concurrency", type=int, default=100, help="threads per worker")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="sizes 10,100, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeat = [10, 100], 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = f"pool={args.pool} concurrency={args.concurrency} workers={args.workers}"
    print(f"# {machine()}\n# {config} repeat={args.repeat} (medians)", flush=True)
    print(f"# load average before: {load()}", flush=True)
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        (tmp / "workspace").mkdir()
        for name in ("README.md", "setup.cfg", "main.py"):
            (tmp / "workspace" / name).write_text("x\n")
        settings = Settings.from_env(
            {"FLEET_REDIS_URL": server.url, "FLEET_WORKSPACE": str(tmp / "workspace")}
        )
        fleet = Fleet.from_env(settings)  # sends through an app of its own
        # The chord and the worker ping go through the workers' app: point it at this Redis.
        app.conf.broker_url = settings.broker_url
        app.conf.result_backend = settings.redis_url
        stack.enter_context(
            workers(server.url, tmp / "workspace", args.pool, args.concurrency, args.workers)
        )
        # As in a worker: senders never block on results, so the backend must not
        # subscribe to each header task's result channel.
        _set_task_join_will_block(True)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        meter = Meter(client)
        measure(fleet, meter, tmp, 10, 0, 1)  # warm-up: imports, connections, pools
        print(HEADER, flush=True)
        for latency_ms in args.latencies:
            for n in args.sizes:
                row = measure(fleet, meter, tmp, n, latency_ms, args.repeat)
                print(format_row(row), flush=True)
        print(f"# load average after: {load()} (other processes share these cores)")
        client.close()


if __name__ == "__main__":
    main()
