"""How long `fleet stop` takes to end a tree whose model calls take 20 s.

python bench/stop_bench.py [--instants 20] [--latency-ms 20000] [--branches 5] [--seed 1]
                           [--inline]

Starts its own redis-server, the local OpenAI-wire server (`bench.openai_server`, every
call `--latency-ms` long) and one worker (threads), then for each of `--instants` trees:
submits a root that explores `--branches` branches (the root's call, then each branch's two,
then the root's answer: all of them slow), stops it at a random instant within the tree's
life, and measures from calling `Fleet.stop` to every trace of the tree being terminal.
It checks that no child was created after the stop landed. With `--inline` the trees run
in this process instead (`InProcessFleet` on the same Redis, the stop from another thread
through `lifecycle.stop_subtree`, as `fleet stop` from another terminal does).

Prints one line per instant, then p50 and max. The issue-41 target: every trace terminal
within 1.5 s. The fake provider does not see the request cancelled: the cut call's thread
is abandoned, its connection ends when the provider answers (see fleet/loop/cut.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.explore_bench import HTTP_PROVIDER, environment  # noqa: E402
from bench.harness import load, openai_server, workers  # noqa: E402
from bench.report import machine  # noqa: E402
from fleet.client import Fleet  # noqa: E402
from fleet.control import subtree  # noqa: E402
from fleet.inprocess import InProcessFleet  # noqa: E402
from fleet.lifecycle import stop_subtree  # noqa: E402
from fleet.models import now_ms  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.storage.store import TraceStore  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from workers.app import app  # noqa: E402

TARGET_S = 1.5
POLL_S = 0.01


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instants", type=int, default=20)
    parser.add_argument("--latency-ms", type=int, default=20_000)
    parser.add_argument("--branches", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--inline", action="store_true")
    return parser.parse_args(argv)


def all_ended(store: TraceStore, root: str) -> bool:
    traces = store.get_traces(subtree(store, root))
    return all(t.is_terminal for t in traces)


def late_children(store: TraceStore, root: str, stopped_at_ms: int) -> int:
    """Children created after the stop landed."""
    traces = store.get_traces(subtree(store, root))
    return sum(1 for t in traces[1:] if t.created_at_ms > stopped_at_ms)


def one_instant(
    fleet: Fleet, start: Callable[[], str], stop: Callable[[str], object], after_s: float
) -> tuple[float, int, int]:
    """(stop -> all terminal s, traces in the tree, children created after the stop)."""
    root = start()
    time.sleep(after_s)
    stopped_at_ms = now_ms()
    began = time.monotonic()  # `fleet stop` itself included
    stop(root)
    while not all_ended(fleet.store, root):
        if time.monotonic() - began > 120:
            raise RuntimeError(f"tree {root!r} did not end within 120 s of the stop")
        time.sleep(POLL_S)
    took_s = time.monotonic() - began
    count = len(subtree(fleet.store, root))
    return took_s, count, late_children(fleet.store, root, stopped_at_ms)


def starters(
    args: argparse.Namespace, stack: ExitStack, env: dict[str, str], server_url: str
) -> tuple[Fleet, Callable[[], str], Callable[[str], object]]:
    """The client, how a tree starts and how it is stopped: on a worker, or in process."""
    fleet = Fleet.from_env(Settings.from_env(env))
    task = f"survey the workspace in {args.branches} branches"
    model = f"{HTTP_PROVIDER}:lat{args.latency_ms}"
    if not args.inline:
        app.conf.broker_url = app.conf.result_backend = server_url
        stack.enter_context(workers(env, "threads", 16, 1))
        return fleet, lambda: fleet.submit(task, model=model).trace_id, fleet.stop
    local = InProcessFleet.from_settings(Settings.from_env(env), redis=True)

    def start() -> str:
        before = {t.trace_id for t in fleet.store.list_traces(1000)}
        threading.Thread(target=local.run, args=(task,), kwargs={"model": model}).start()
        while True:
            new = [t for t in fleet.store.list_traces(1000) if t.trace_id not in before]
            roots = [t for t in new if t.parent_trace_id is None]
            if roots:
                return roots[0].trace_id
            time.sleep(POLL_S)

    return fleet, start, lambda root: stop_subtree(local.runtime, root)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    life_s = 4 * args.latency_ms / 1000  # root call, two per branch, the root's answer
    mode = "inline" if args.inline else "worker (threads -c 16)"
    print(f"# {machine()}\n# {mode}, calls of {args.latency_ms} ms, {args.branches} branches")
    print(f"# load average before: {load()}", flush=True)
    results = []
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        base_url = stack.enter_context(openai_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        env = environment(server.url, tmp, base_url)
        fleet, start, stop = starters(args, stack, env, server.url)
        for i in range(args.instants):
            after_s = rng.uniform(0.2, life_s)
            took_s, count, late = one_instant(fleet, start, stop, after_s)
            results.append((took_s, late))
            print(
                f"instant {i + 1:2d}: stop at {after_s:5.1f} s -> all {count} terminal in "
                f"{took_s:.3f} s; children created after the stop: {late}",
                flush=True,
            )
    report(results)


def report(results: list[tuple[float, int]]) -> None:
    """p50 and max of stop -> every trace terminal, against the target."""
    times = [t for t, _ in results]
    worst = max(times)
    print(
        f"# stop -> every trace terminal: p50 {statistics.median(times):.3f} s, max "
        f"{worst:.3f} s over {len(times)} instants (target <= {TARGET_S} s: "
        f"{'met' if worst <= TARGET_S else 'MISSED'}); children created after a stop: "
        f"{sum(late for _, late in results)}"
    )


if __name__ == "__main__":
    main()
