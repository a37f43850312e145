"""The root's chord dispatch, as its worker pays for it: CPU per child.

python bench/dispatch_bench.py [--children 100 500] [--rounds 7] [--against TREE]
python bench/dispatch_bench.py --profile 500 > out.prof

In one process, on a real Redis (a private redis-server), `CeleryDispatcher.dispatch` of an
explore of `--children` branches is timed the way a worker's root runs it (no result
waits: `_set_task_join_will_block`): its CPU (`time.process_time`) per child, the median of
`--rounds` dispatches of each size (the queues emptied between them).

`--against TREE` (a checkout of another commit, e.g. `git archive main | tar -x -C TREE`)
compares: each round runs this file once in this tree and once in TREE, alternated, each a
fresh process with this tree's venv (`--tree` puts a tree first on `sys.path`), and the
medians of both are printed side by side.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def request(n: int) -> Any:
    """An explore of `n` children of one root, as `Runner` hands it to the dispatcher."""
    from fleet.models import Trace
    from fleet.runtime import SpawnRequest

    children = tuple(
        Trace(
            trace_id=f"root@explore-{i:03d}-20250101T000000-001",
            root_trace_id="root",
            parent_trace_id="root",
            mode="explore",
            preset="explore",
            task=f"Read the module number {i} and summarise what its public functions do",
            name=f"explore-{i:03d}",
            parent_tool_call_id="call_1",
        )
        for i in range(1, n + 1)
    )
    return SpawnRequest("root", "root", "call_1", "agent", "explore", children)


def measure(sizes: list[int], rounds: int) -> dict[int, list[float]]:
    """CPU us per child of each dispatch, `rounds` per size, sizes alternated."""
    import redis
    from celery._state import _set_task_join_will_block

    from fleetops.redis_server import start_redis_server
    from workers.app import app
    from workers.dispatch import CeleryDispatcher

    runtime: Any = SimpleNamespace(trees=None)  # no schedule: a chord
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    with start_redis_server() as server, redis.Redis.from_url(server.url) as client:
        app.conf.broker_url = app.conf.result_backend = server.url
        _set_task_join_will_block(True)
        requests = {n: request(n) for n in sizes}
        CeleryDispatcher().dispatch(runtime, request(10))  # warm-up: connections, imports
        for _ in range(rounds):
            for n in sizes:
                client.flushdb()
                start = time.process_time()
                CeleryDispatcher().dispatch(runtime, requests[n])
                samples[n].append((time.process_time() - start) * 1e6 / n)
    return samples


def profile(n: int) -> None:
    """A cProfile of ten dispatches of `n` children, as pstats text on stdout."""
    import pstats

    profiler = cProfile.Profile()
    original = time.process_time
    profiler.enable()
    measure([n], 10)
    profiler.disable()
    time.process_time = original
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(60)


def one_round(tree: Path, sizes: list[int]) -> dict[int, float]:
    """One dispatch per size in a fresh process running on `tree`."""
    command = [sys.executable, __file__, "--tree", str(tree), "--rounds", "3", "--json"]
    out = subprocess.run(
        [*command, "--children", *map(str, sizes)], check=True, capture_output=True, text=True
    ).stdout
    return {int(k): v for k, v in json.loads(out).items()}


def compare(against: Path, sizes: list[int], rounds: int) -> None:
    trees = {"this": HERE, "against": against}
    rows: dict[str, dict[int, list[float]]] = {k: {n: [] for n in sizes} for k in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            for n, us in one_round(tree, sizes).items():
                rows[name][n].append(us)
    print(f"# CPU us per child, medians of {rounds} alternated processes (each: median of 3)")
    print(f"# this={HERE} against={against}")
    for n in sizes:
        this, other = (statistics.median(rows[k][n]) for k in trees)
        spread = {k: f"{min(rows[k][n]):.0f}-{max(rows[k][n]):.0f}" for k in trees}
        print(
            f"N={n:5d}  against {other:6.1f} ({spread['against']})  "
            f"this {this:6.1f} ({spread['this']})  ratio {this / other:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another tree to alternate with")
    parser.add_argument("--tree", type=Path, default=HERE, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile N children")
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    if args.against:
        compare(args.against.resolve(), args.children, args.rounds)
        return
    if args.profile:
        profile(args.profile)
        return
    samples = measure(args.children, args.rounds)
    medians = {n: statistics.median(s) for n, s in samples.items()}
    if args.json:
        print(json.dumps(medians))
        return
    print(f"# CeleryDispatcher.dispatch, CPU us per child, medians of {args.rounds}")
    for n, us in medians.items():
        print(f"N={n:5d}  {us:6.1f} us  ({min(samples[n]):.0f}-{max(samples[n]):.0f})")


if __name__ == "__main__":
    main()
