"""The scale model's inputs, measured: an explore of 1,000 branches on real workers, one Redis.

    python bench/scale_bench.py [--branches 1000] [--repeat 3] [--workers 2] [--concurrency 100]

Starts its own redis-server (broker, result backend and store, as `fleet up` runs them) and
W worker processes, then per repeat submits a main agent exploring N branches on a scripted
model of 0 ms (each branch lists a folder, then answers: docs/performance.md's shape) and
prints, per run and as medians:

- branches/s: N over submit -> the root's `finished_at_ms`;
- Redis CPU per branch (us): the `INFO cpu` delta (user + sys, all threads) over the run;
- KiB per branch kept: `used_memory` less client buffers (Lua VM flushed) after the run,
  then after `compact_tree` packed the tree (what the owner check does once it is quiet).

Only a single node: the fleet's store does not run on Redis Cluster yet (issue 30, item 3;
docs/operations.md). Under load the wall times move 2-4x between runs; the per-branch CPU
and memory are the steadier numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.explore_bench import environment  # noqa: E402
from bench.harness import Meter, load, workers  # noqa: E402
from bench.runs import fleet_run  # noqa: E402
from fleet.client import Fleet  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.storage.redis_compact import compact_tree  # noqa: E402
from fleet.storage.redis_server import start_redis_server  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from workers.app import app  # noqa: E402


def kept_bytes(client: redis.Redis) -> int:
    """`used_memory` less the clients' buffers, with the Lua VM's garbage dropped first."""
    client.script_flush()
    info = client.info("memory")
    return int(info["used_memory"]) - int(info["mem_clients_normal"])


def one_run(fleet: Fleet, meter: Meter, pids: list[int], model: str, n: int) -> tuple[float, ...]:
    """branches/s, Redis CPU us per branch, KiB per branch kept before and after compaction."""
    before = kept_bytes(meter.client)
    sample = fleet_run(fleet, meter, pids, "survey the workspace", model)
    full = kept_bytes(meter.client) - before
    root = str(meter.client.zrange("fleet:open-trees", -1, -1)[0])
    compact_tree(meter.client, root, 7 * 24 * 3600)
    packed = kept_bytes(meter.client) - before
    cpu_us = sample.redis_cpu_s * 1e6 / n
    row = (n / sample.seconds, cpu_us, full / 1024 / n, packed / 1024 / n)
    print(
        f"  {row[0]:8.1f} branches/s   redis {row[1]:6.0f} us/br   "
        f"KiB/br {row[2]:5.2f} -> {row[3]:4.2f} compacted   ({sample.seconds:.2f} s)",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    """Start Redis and the workers, run the explores, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--branches", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"# single node, {args.workers} workers x {args.concurrency} threads; load {load()}")
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-")))
        env = environment(server.url, tmp, "http://127.0.0.1:9/v1")  # no HTTP model here
        fleet = Fleet.from_env(Settings.from_env(env))
        app.conf.broker_url = app.conf.result_backend = server.url
        procs = stack.enter_context(workers(env, "threads", args.concurrency, args.workers))
        client = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        meter, pids = Meter(client), [w.pid for w in procs]
        model = explore_script(tmp / "explore.yaml", args.branches)
        fleet_run(fleet, meter, pids, "warm up", explore_script(tmp / "warm.yaml", 10))
        rows = [one_run(fleet, meter, pids, model, args.branches) for _ in range(args.repeat)]
        medians = [statistics.median(column) for column in zip(*rows, strict=True)]
        print(
            f"# median of {args.repeat}: {medians[0]:.1f} branches/s, Redis {medians[1]:.0f} us"
            f" CPU per branch, {medians[2]:.2f} KiB per branch kept, {medians[3]:.2f} compacted;"
            f" load after {load()}"
        )


if __name__ == "__main__":
    main()
