"""How long `fleet stop` takes to end a tree whose model calls take 20 s, and whether the
provider sees the calls in flight cancelled.

python bench/stop_bench.py [--instants 20] [--latency-ms 20000] [--branches 5] [--seed 1]
                           [--inline | --batch-api [--poll-s 1.0]]

Starts its own redis-server, a local provider and one worker (threads), then for each of
`--instants` trees: submits a root that explores `--branches` branches (the root's call,
then each branch's two, then the root's answer: all of them slow), stops it at a random
instant within the tree's life, and measures from calling `Fleet.stop` to every trace of
the tree being terminal. It checks that no child was created after the stop landed, and
asks the provider which requests were in flight when the stop was called: each must end
cancelled (the client closed it), and it reports when the provider saw the last one go.

- default: live calls on a worker, to `bench.openai_server` (OpenAI wire, every call
  `--latency-ms` long; it notes a client that closes its connection).
- `--inline`: the trees run in this process (`InProcessFleet` on the same Redis, the stop
  from another thread through `lifecycle.stop_subtree`, as `fleet stop` from another
  terminal does).
- `--batch-api`: every call is parked in a provider batch (`tests.fake_batch`'s OpenAI
  Batch API server, batches answered `--latency-ms` after creation; the worker polls every
  `--poll-s`). In flight means a batch running at the stop: it holds only this tree's
  calls, so the poller must cancel it at the provider (docs/batch.md).

Prints one line per instant, then p50 and max of both times. The issue-41 target: every
trace terminal within 1.5 s; the provider sees every live request in flight cancelled.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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
from fleet.testing import Script  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fake_batch import OpenAIBatchServer  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from workers.app import app  # noqa: E402

TARGET_S = 1.5
POLL_S = 0.01
SETTLE_S = 15.0
"""How long after the tree ended the bench waits for the provider to see a cut."""


@dataclass
class Instant:
    """One stop: how long it took and what the provider saw."""

    after_s: float
    took_s: float
    """`Fleet.stop` called -> every trace of the tree terminal."""
    traces: int
    late_children: int
    """Children created after the stop landed."""
    in_flight: int
    """Requests (batches) the provider held when the stop was called, or got after it."""
    cancelled: int
    """How many of them ended cancelled by the client."""
    cut_s: float | None
    """`Fleet.stop` called -> the provider saw the last of them go (None: none in flight)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instants", type=int, default=20)
    parser.add_argument("--latency-ms", type=int, default=20_000)
    parser.add_argument("--branches", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--inline", action="store_true")
    mode.add_argument("--batch-api", action="store_true")
    parser.add_argument("--poll-s", type=float, default=1.0)
    return parser.parse_args(argv)


def all_ended(store: TraceStore, root: str) -> bool:
    traces = store.get_traces(subtree(store, root))
    return all(t.is_terminal for t in traces)


def late_children(store: TraceStore, root: str, stopped_at_ms: int) -> int:
    """Children created after the stop landed."""
    traces = store.get_traces(subtree(store, root))
    return sum(1 for t in traces[1:] if t.created_at_ms > stopped_at_ms)


class LiveProvider:
    """`bench.openai_server`: which requests it held at the stop, and when each ended."""

    def __init__(self, base_url: str) -> None:
        self.arrivals = f"{base_url}/arrivals"

    def requests(self, clear: bool = False) -> list[list[Any]]:
        url = self.arrivals + ("?clear" if clear else "")
        with urllib.request.urlopen(url, timeout=10) as answer:
            return list(json.load(answer)["requests"])

    def at_stop(self) -> float:
        return time.time()

    def settle(self, stopped_at: float) -> tuple[int, int, float | None]:
        """(in flight at or after the stop, cancelled of them, stop -> the last cut s)."""
        deadline = time.monotonic() + SETTLE_S
        while any(r[2] is None for r in self.requests()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        held = [r for r in self.requests(clear=True) if r[2] is None or r[2] > stopped_at]
        cut = [r for r in held if r[3]]
        last = max((r[2] - stopped_at for r in cut), default=None)
        return len(held), len(cut), last


class BatchProvider:
    """`tests.fake_batch`'s Batch API server: the batches running at the stop and after."""

    def __init__(self, server: OpenAIBatchServer) -> None:
        self.server = server
        self._running: set[str] = set()
        self._known: set[str] = set()

    def at_stop(self) -> float:
        """Note the batches running now (and all there are); the clock."""
        server = self.server
        with server.lock:
            self._known = set(server.batches)
            self._running = {i for i, b in server.batches.items() if not server.ended(b)}
        return time.monotonic()

    def settle(self, stopped_at: float) -> tuple[int, int, float | None]:
        """(batches running at or made after the stop, cancelled of them, stop -> last)."""
        server = self.server
        with server.lock:
            watched = self._running | (set(server.batches) - self._known)
        seen: dict[str, float | None] = {}  # stop -> cancelled s; None: answered first
        deadline = time.monotonic() + SETTLE_S
        while len(seen) < len(watched) and time.monotonic() < deadline:
            with server.lock:
                for batch_id in watched - set(seen):
                    if batch_id in server.cancelled:
                        seen[batch_id] = time.monotonic() - stopped_at
                    elif server.ended(server.batches[batch_id]):
                        seen[batch_id] = None
            time.sleep(POLL_S)
        cut = [s for s in seen.values() if s is not None]
        return len(watched), len(cut), max(cut, default=None)


Provider = LiveProvider | BatchProvider


def one_instant(
    fleet: Fleet,
    provider: Provider,
    start: Callable[[], str],
    stop: Callable[[str], object],
    after_s: float,
) -> Instant:
    """Start a tree, stop it `after_s` later, and measure."""
    root = start()
    time.sleep(after_s)
    stopped_at_ms, at_stop = now_ms(), provider.at_stop()
    began = time.monotonic()  # `fleet stop` itself included
    stop(root)
    while not all_ended(fleet.store, root):
        if time.monotonic() - began > 120:
            raise RuntimeError(f"tree {root!r} did not end within 120 s of the stop")
        time.sleep(POLL_S)
    took_s = time.monotonic() - began
    in_flight, cancelled, cut_s = provider.settle(at_stop)
    return Instant(
        after_s,
        took_s,
        len(subtree(fleet.store, root)),
        late_children(fleet.store, root, stopped_at_ms),
        in_flight,
        cancelled,
        cut_s,
    )


def batch_setup(
    args: argparse.Namespace, stack: ExitStack, env: dict[str, str], tmp: Path
) -> tuple[dict[str, str], BatchProvider]:
    """The Batch API server and the worker environment that parks every call there."""
    path = explore_script(tmp / "brain.yaml", args.branches).removeprefix("scripted:")
    script = Script.parse(yaml.safe_load(Path(path).read_text()), path)
    server = stack.enter_context(OpenAIBatchServer(script, delay_s=args.latency_ms / 1000))
    config = Path(env["FLEET_CONFIG"])
    providers = {"batchy": {"kind": "openai", "base_url": f"{server.url}/v1", "batch_api": True}}
    models = {"batchy": {"provider": "batchy", "name": "fake-model"}}
    config.write_text(yaml.safe_dump({"providers": providers, "models": models}))
    poll = {"FLEET_BATCH_POLL_S": str(args.poll_s), "FLEET_BATCH_FLUSH_S": str(args.poll_s / 2)}
    return {**env, **poll}, BatchProvider(server)


def starters(
    args: argparse.Namespace, stack: ExitStack, env: dict[str, str], server_url: str
) -> tuple[Fleet, Callable[[], str], Callable[[str], object]]:
    """The client, how a tree starts and how it is stopped: on a worker, or in process."""
    fleet = Fleet.from_env(Settings.from_env(env))
    task = f"survey the workspace in {args.branches} branches"
    if args.batch_api:
        app.conf.broker_url = app.conf.result_backend = server_url
        stack.enter_context(workers(env, "threads", 16, 1))
        return (
            fleet,
            lambda: fleet.submit(task, model="batchy", batch_api=True).trace_id,
            fleet.stop,
        )
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
    call_s = args.latency_ms / 1000 + (2 * args.poll_s if args.batch_api else 0.0)
    life_s = 4 * call_s  # root call, two per branch, the root's answer
    mode = "batch-api" if args.batch_api else "inline" if args.inline else "worker"
    print(f"# {machine()}\n# {mode} (threads -c 16 where a worker), calls of {args.latency_ms} ms")
    print(f"# {args.branches} branches; load average before: {load()}", flush=True)
    results: list[Instant] = []
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        base_url = stack.enter_context(openai_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        env = environment(server.url, tmp, base_url)
        provider: Provider = LiveProvider(base_url)
        if args.batch_api:
            env, provider = batch_setup(args, stack, env, tmp)
        fleet, start, stop = starters(args, stack, env, server.url)
        for i in range(args.instants):
            found = one_instant(fleet, provider, start, stop, rng.uniform(0.2, life_s))
            results.append(found)
            cut = "-" if found.cut_s is None else f"{found.cut_s:.3f} s"
            print(
                f"instant {i + 1:2d}: stop at {found.after_s:5.1f} s -> all {found.traces} "
                f"terminal in {found.took_s:.3f} s; in flight {found.in_flight}, cancelled "
                f"{found.cancelled}, last seen going {cut}; children after the stop: "
                f"{found.late_children}",
                flush=True,
            )
    report(results)


def report(results: list[Instant]) -> None:
    """p50 and max of both times, against the targets."""
    times = [r.took_s for r in results]
    cuts = [r.cut_s for r in results if r.cut_s is not None]
    worst = max(times)
    print(
        f"# stop -> every trace terminal: p50 {statistics.median(times):.3f} s, max "
        f"{worst:.3f} s over {len(times)} instants (target <= {TARGET_S} s: "
        f"{'met' if worst <= TARGET_S else 'MISSED'}); children created after a stop: "
        f"{sum(r.late_children for r in results)}"
    )
    held, cancelled = sum(r.in_flight for r in results), sum(r.cancelled for r in results)
    line = f"# in flight at the stop: {held}, seen cancelled by the provider: {cancelled}"
    if cuts:
        line += f"; stop -> provider saw the last go: p50 {statistics.median(cuts):.3f} s, "
        line += f"max {max(cuts):.3f} s over {len(cuts)} instants with calls in flight"
    print(line)


if __name__ == "__main__":
    main()
