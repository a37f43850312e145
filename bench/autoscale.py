"""Autoscaling as it happens: worker replicas driven by KEDA's metric, scaled down under load.

python -m bench.autoscale [--trees 20] [--max-replicas 4] [--cycles 1] [--latency-s 5]

A burst of long explores (a local OpenAI-wire provider answering each call after
`--latency-s`) lands on a fleet of real `fleet worker` processes. Every `--poll-s` a scaler
reads what the ScaledObjects in deploy/k8s read, per queue: messages waiting in the queue +
traces whose runner holds a live lease (`fleetops.metrics`: `fleet_queue_length` +
`fleet_running_subagents`), and sets the replica count as the HPA behind KEDA does:
ceil(metric / threshold) within [min, max], up at once, down only after the metric asked for
fewer during `--down-after-s` (the manifests' stabilization window, shortened), one replica
per poll. A replica taken away gets the pod lifecycle: SIGTERM to the worker process, then
SIGKILL to its whole group if it has not exited after `--grace-s` (the manifests'
terminationGracePeriodSeconds). `--cycles 2` bursts again once the fleet is back at min.

Measured: seconds from the burst to `max` replicas consuming (scale-up); each drain's
SIGTERM -> exit seconds (and how many hit the grace); model calls beyond what the trees need
(turns re-run) and their tokens (paid twice); every tree completed, collected once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from bench.fault_rig import (
    FlakyProvider,
    Redis,
    Worker,
    check_tree,
    start_worker,
    temporary_directory,
    wait_for,
)
from fleet.client import Fleet
from fleet.models import now_ms
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleetops.metrics import redis_queue_lengths, running_by_queue
from workers.app import QUEUES

TOKENS_PER_CALL = 15
"""What the provider bills per call (FlakyProvider's usage: 10 prompt + 5 completion)."""


@dataclass
class Scaler:
    """The replicas of one worker Deployment and the HPA rule that sizes them."""

    env: dict[str, str]
    options: argparse.Namespace
    observer: RedisStore
    replicas: list[Worker] = field(default_factory=list)
    drains_s: list[float] = field(default_factory=list)
    killed_at_grace: int = 0
    handed_back: int = 0
    """Runs a replica held when it got SIGTERM (each must end on another replica)."""
    low_since_s: float | None = None
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds since start, metric, replicas) at each poll."""

    def metric(self, client: redis.Redis) -> int:
        """KEDA's value: queued + running over the fleet's queues."""
        queued = redis_queue_lengths(client, QUEUES)
        running = running_by_queue(client, now_ms())
        return sum(queued.values()) + sum(running[q] for q in QUEUES)

    def desired(self, metric: int) -> int:
        """ceil(metric / threshold) within [min, max]."""
        want = math.ceil(metric / int(self.options.threshold))
        return max(int(self.options.min_replicas), min(int(self.options.max_replicas), want))

    def poll(self, client: redis.Redis, started_s: float) -> None:
        """One look of the autoscaler: up at once, down after the stabilization window."""
        metric = self.metric(client)
        want, have = self.desired(metric), len(self.replicas)
        self.timeline.append((round(time.monotonic() - started_s, 1), metric, have))
        if want > have:
            self.low_since_s = None
            for _ in range(want - have):
                self.replicas.append(start_worker(self.env, self.options.concurrency))
        elif want < have:
            self.low_since_s = self.low_since_s or time.monotonic()
            if time.monotonic() - self.low_since_s >= self.options.down_after_s:
                self.terminate(self.replicas.pop())
        else:
            self.low_since_s = None

    def terminate(self, worker: Worker) -> None:
        """The kubelet's way: SIGTERM to the process, SIGKILL to all of it after the grace."""
        self.handed_back += self.runs_of(worker)
        began_s = time.monotonic()
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.process.wait(self.options.grace_s)
        except subprocess.TimeoutExpired:
            self.killed_at_grace += 1
            worker.kill()
        self.drains_s.append(round(time.monotonic() - began_s, 2))

    def runs_of(self, worker: Worker) -> int:
        """Traces whose lease this replica holds (a lease's owner is `host:pid:token`)."""
        client = self.observer.client
        owners = [client.get(keys.lease(str(t))) for t in client.zrange(keys.RUNNING, 0, -1)]
        return sum(1 for o in owners if o and str(o).split(":")[1] == str(worker.pid))

    def consuming(self) -> int:
        """Replicas whose heartbeat says they consume."""
        live = set(self.observer.live_consumers("fleet.explore"))
        return sum(1 for w in self.replicas if w.name in live)

    def stop_all(self) -> None:
        """The end of the run: every replica drained."""
        while self.replicas:
            self.terminate(self.replicas.pop())


def calls_needed(options: argparse.Namespace) -> int:
    """Model calls the trees need: each root asks for its branches, then sums up; each
    branch looks around `turns` times, then answers."""
    per_tree = 2 + int(options.branches) * (int(options.turns) + 1)
    return per_tree * int(options.trees) * int(options.cycles)


def burst(fleet: Fleet, options: argparse.Namespace) -> list[str]:
    """`--trees` explores submitted at once."""
    return [fleet.submit("survey", model="flaky").trace_id for _ in range(options.trees)]


def run_cycle(
    scaler: Scaler, fleet: Fleet, client: redis.Redis, options: argparse.Namespace
) -> tuple[list[str], float | None]:
    """One burst, scaled up and back down to min; the roots and the scale-up seconds."""
    started_s = time.monotonic()
    roots = burst(fleet, options)
    scale_up_s: float | None = None
    deadline_s = started_s + options.timeout_s
    while time.monotonic() < deadline_s:
        scaler.poll(client, started_s)
        full = scaler.consuming() >= options.max_replicas
        if scale_up_s is None and full:
            scale_up_s = round(time.monotonic() - started_s, 1)
        ended = all(fleet.trace(r).is_terminal for r in roots)
        if ended and len(scaler.replicas) == options.min_replicas:
            break
        time.sleep(options.poll_s)
    return roots, scale_up_s


@contextlib.contextmanager
def fleet_on(
    options: argparse.Namespace,
) -> Iterator[tuple[Scaler, Fleet, redis.Redis, FlakyProvider]]:
    """Redis, the provider, min replicas consuming, a client."""
    server = Redis()
    provider = FlakyProvider(options.branches, options.turns, options.latency_s)
    with contextlib.ExitStack() as stack:
        workspace = stack.enter_context(temporary_directory())
        config_dir = stack.enter_context(temporary_directory())  # outside the roots
        stack.callback(server.close)
        stack.callback(provider.close)
        env = {
            "FLEET_REDIS_URL": server.url,
            "FLEET_BROKER_URL": server.url,
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_CONFIG": str(provider.config(config_dir)),
        }
        fleet = Fleet.from_env(Settings.from_env({**os.environ, **env}))
        observer = stack.enter_context(RedisStore.from_url(server.url))
        scaler = Scaler(env, options, observer)
        stack.callback(scaler.stop_all)
        for _ in range(options.min_replicas):
            scaler.replicas.append(start_worker(env, options.concurrency))
        wait_for(lambda: scaler.consuming() == options.min_replicas, 90, "min replicas")
        client = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        yield scaler, fleet, client, provider


def report(
    options: argparse.Namespace,
    scaler: Scaler,
    fleet: Fleet,
    roots: list[str],
    calls: int,
    scale_ups_s: list[float | None],
) -> dict[str, object]:
    """What the run measured, as one JSON-able dict."""
    checks = [check_tree(fleet.store, r, options.branches, options.turns) for r in roots]
    rerun = calls - calls_needed(options)
    drains = scaler.drains_s
    return {
        "trees": len(roots),
        "completed": sum(c.completed for c in checks),
        "duplicated_results": sum(c.duplicated for c in checks),
        "extra_turns_written": sum(c.extra_turns for c in checks),
        "model_calls": calls,
        "model_calls_needed": calls_needed(options),
        "turns_rerun": rerun,
        "tokens_paid_twice": rerun * TOKENS_PER_CALL,
        "scale_up_s": scale_ups_s,
        "drains": len(drains),
        "runs_handed_back_at_sigterm": scaler.handed_back,
        "drain_s_max": max(drains, default=0.0),
        "drain_s_median": statistics.median(drains) if drains else 0.0,
        "killed_at_grace": scaler.killed_at_grace,
        "grace_s": options.grace_s,
        "peak_replicas": max((r for _, _, r in scaler.timeline), default=0),
        "not_completed": [c.detail for c in checks if not c.completed][:5],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the cycles and print the report (a line per poll with --verbose)."""
    options = parse(argv)
    roots: list[str] = []
    scale_ups: list[float | None] = []
    with fleet_on(options) as (scaler, fleet, client, provider):
        for _ in range(options.cycles):
            cycle_roots, scale_up_s = run_cycle(scaler, fleet, client, options)
            roots += cycle_roots
            scale_ups.append(scale_up_s)
        result = report(options, scaler, fleet, roots, provider.calls, scale_ups)
        if options.verbose:
            for at_s, metric, replicas in scaler.timeline:
                print(f"{at_s:7.1f} s  metric {metric:4d}  replicas {replicas}")
    print(json.dumps(result, indent=2))
    ok = result["completed"] == len(roots) and result["tokens_paid_twice"] == 0
    return 0 if ok and not result["killed_at_grace"] else 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options (defaults: a reduced run for a shared 2-core machine)."""
    parser = argparse.ArgumentParser(prog="bench.autoscale", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--trees", type=int, default=20)
    add("--branches", type=int, default=4)
    add("--turns", type=int, default=2, help="list_dir calls per branch before its answer")
    add("--latency-s", type=float, default=5.0, help="seconds the provider takes per call")
    add("--min-replicas", type=int, default=1)
    add("--max-replicas", type=int, default=4)
    add("--concurrency", type=int, default=8, help="each replica's -c")
    add("--threshold", type=int, default=8, help="KEDA's threshold: metric per replica")
    add("--poll-s", type=float, default=2.0, help="KEDA's pollingInterval (15 s in deploy/)")
    add("--down-after-s", type=float, default=10.0, help="the scale-down stabilization window")
    add("--grace-s", type=float, default=210.0, help="terminationGracePeriodSeconds")
    add("--cycles", type=int, default=1)
    add("--timeout-s", type=float, default=900.0)
    add("--verbose", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
