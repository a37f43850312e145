"""The scale model's inputs, measured: an explore of 1,000 branches on real workers.

    python bench/scale_bench.py [--branches 1000] [--repeat 3] [--workers 2]
                                [--concurrency 100] [--only single|cluster]

Two set-ups, one after the other, each with its own redis-servers and W worker processes:

- single: one Redis is broker, result backend and store (as `fleet up` runs them);
- cluster: the store on a local 3-master Redis Cluster (FLEET_REDIS_CLUSTER=1), the broker
  and Celery's results on a single Redis beside it (kombu cannot use a cluster).

Per repeat it submits a main agent exploring N branches on a scripted model of 0 ms (each
branch lists a folder, then answers: docs/performance.md's shape) and prints:

- branches/s: N over submit -> the root's `finished_at_ms`;
- Redis CPU per branch (us), per node: the `INFO cpu` deltas (user + sys) over the run;
- KiB per branch kept by the store's nodes: `used_memory` less client buffers (Lua VM
  flushed) after the run, then after `compact_tree` packed the tree (what the owner check
  does once it is quiet).

On a shared 2-core VM the workers' CPU, not Redis, bounds the wall time: the per-branch CPU
and memory are the steadier numbers, and what a node count is worked out from.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.explore_bench import environment  # noqa: E402
from bench.harness import load, workers  # noqa: E402
from fleet.client import Fleet  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.storage import keys  # noqa: E402
from fleet.storage.backends.redis.compact import compact_tree  # noqa: E402
from fleet.storage.backends.redis.store import RedisStore  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from tests.redis_cluster import redis_cluster  # noqa: E402
from workers.app import app  # noqa: E402

POLL_S = 0.02
TIMEOUT_S = 900.0


@dataclass
class Rig:
    """One set-up: the client, the store's nodes, the broker's node (if apart)."""

    name: str
    fleet: Fleet
    store_nodes: list[redis.Redis]
    broker_node: redis.Redis | None


def cpu_s(node: redis.Redis) -> float:
    """CPU seconds a redis-server has used (user + sys, all threads)."""
    cpu = node.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def lease_expiries(rig: Rig) -> int:
    """Heals: runs re-enqueued after their lease lapsed, plus traces the owner check moved."""
    store = rig.fleet.store
    assert isinstance(store, RedisStore)
    counts = store.client.hmget(keys.COUNTERS, ["lease_expiries", "stuck_traces"])
    return sum(int(c or 0) for c in counts)


def kept_bytes(nodes: list[redis.Redis]) -> int:
    """`used_memory` less client buffers over the nodes, each one's Lua VM flushed first."""
    total = 0
    for node in nodes:
        node.script_flush()
        info = node.info("memory")
        total += int(info["used_memory"]) - int(info["mem_clients_normal"])
    return total


def one_run(rig: Rig, model: str, n: int) -> tuple[float, ...]:
    """branches/s, store CPU us/br (all nodes), KiB/br kept, compacted; prints per node."""
    nodes = rig.store_nodes + ([rig.broker_node] if rig.broker_node else [])
    expiries_before = lease_expiries(rig)
    cpu_before = [cpu_s(node) for node in nodes]
    bytes_before = kept_bytes(rig.store_nodes)
    start = time.time()
    handle = rig.fleet.submit("survey the workspace", model=model)
    deadline = time.monotonic() + TIMEOUT_S
    while (trace := rig.fleet.trace(handle.trace_id)).finished_at_ms is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rig.name}: the explore did not finish")
        time.sleep(POLL_S)
    seconds = trace.finished_at_ms / 1000 - start
    if trace.status != "completed":
        raise RuntimeError(f"{rig.name}: the explore ended {trace.status!r}: {trace.error}")
    per_node = [(cpu_s(node) - b) * 1e6 / n for node, b in zip(nodes, cpu_before, strict=True)]
    full = kept_bytes(rig.store_nodes) - bytes_before
    store = rig.fleet.store
    assert isinstance(store, RedisStore)
    compact_tree(store.client, handle.trace_id, keys.TRACE_TTL_S)
    packed = kept_bytes(rig.store_nodes) - bytes_before
    store_cpu = sum(per_node[: len(rig.store_nodes)])
    shown = " ".join(f"{us:5.0f}" for us in per_node)
    broker = " (last: broker + results)" if rig.broker_node else ""
    print(
        f"  {rig.name:7} {n / seconds:7.1f} branches/s   redis us/br per node [{shown}]{broker}"
        f"   KiB/br {full / 1024 / n:5.2f} -> {packed / 1024 / n:4.2f}   ({seconds:.2f} s,"
        f" {lease_expiries(rig) - expiries_before} healed)",
        flush=True,
    )
    return (n / seconds, store_cpu, full / 1024 / n, packed / 1024 / n)


@contextmanager
def single_rig(tmp: Path, args: argparse.Namespace) -> Iterator[Rig]:
    """One Redis for everything, and the workers."""
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        (tmp / "single").mkdir()
        env = environment(server.url, tmp / "single", "http://127.0.0.1:9/v1")
        yield stack.enter_context(_rig("single", env, server.url, None, args))


@contextmanager
def cluster_rig(tmp: Path, args: argparse.Namespace) -> Iterator[Rig]:
    """The store on 3 masters; broker and results on a single Redis."""
    with ExitStack() as stack:
        masters = stack.enter_context(redis_cluster())
        broker = stack.enter_context(start_redis_server())
        (tmp / "cluster").mkdir()
        env = environment(masters[0], tmp / "cluster", "http://127.0.0.1:9/v1")
        env |= {"FLEET_BROKER_URL": broker.url, "FLEET_REDIS_CLUSTER": "1"}
        env["FLEET_RESULT_BACKEND_URL"] = broker.url
        stack.callback(keys.use_cluster_layout, False)
        yield stack.enter_context(_rig("cluster", env, broker.url, masters, args))


@contextmanager
def _rig(
    name: str, env: dict[str, str], broker_url: str, masters: list[str] | None, args: Any
) -> Iterator[Rig]:
    with ExitStack() as stack:
        settings = Settings.from_env(env)
        fleet = Fleet.from_env(settings)
        app.conf.broker_url = broker_url
        app.conf.result_backend = settings.result_backend_url
        stack.enter_context(workers(env, "threads", args.concurrency, args.workers))
        urls = masters or [settings.redis_url]
        nodes = [stack.enter_context(redis.Redis.from_url(u, decode_responses=True)) for u in urls]
        broker = None
        if masters:
            broker = stack.enter_context(redis.Redis.from_url(broker_url, decode_responses=True))
        yield Rig(name, fleet, nodes, broker)


def main(argv: list[str] | None = None) -> None:
    """Each set-up in turn: a warm-up, then the repeats, then its medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--branches", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--only", choices=["single", "cluster"])
    args = parser.parse_args(argv)
    if args.only is None:  # each set-up in a process of its own (Celery's app caches pools)
        for only in ("single", "cluster"):
            subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:]), "--only", only])
        return
    print(f"# {args.workers} workers x {args.concurrency} threads; load {load()}")
    tmp = Path(tempfile.mkdtemp(prefix="scale-"))
    for make in [single_rig] if args.only == "single" else [cluster_rig]:
        with make(tmp, args) as rig:
            model = explore_script(tmp / f"{rig.name}.yaml", args.branches)
            one_run(rig, explore_script(tmp / f"{rig.name}-warm.yaml", 10), 10)
            rows = [one_run(rig, model, args.branches) for _ in range(args.repeat)]
        medians = [statistics.median(column) for column in zip(*rows, strict=True)]
        print(
            f"# {rig.name} median of {args.repeat}: {medians[0]:.1f} branches/s, store Redis"
            f" {medians[1]:.0f} us CPU per branch (all nodes), {medians[2]:.2f} KiB per branch"
            f" kept, {medians[3]:.2f} compacted; load {load()}",
            flush=True,
        )


if __name__ == "__main__":
    main()
