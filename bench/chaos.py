"""Randomised lifecycle: many trees, faults at random instants, and every tree must end.

    python bench/chaos.py --faults 500            # make chaos: >= 500 faults, ~15-25 min
    python bench/chaos.py --faults 8 --seed 3     # what CI runs (tests/test_chaos.py)

Each round submits `--trees` explores (4 branches, 2 looks each, 300 ms per model call) to
two `fleet worker` processes on an append-only Redis, then injects `--per-round` faults at
instants drawn from a seeded generator within the trees' first seconds: `fleet stop` of a
random tree, SIGKILL of a worker (a fresh one replaces it), a clean Redis restart, or a
Redis SIGKILL (append-only file, fsync every second: up to a second of writes is lost).
After each round every tree must end (root, every branch and every collaborator entry
terminal) within `--bound-s`; *stuck* counts those that did not; *duplicated* counts tool
results beyond one per call and model turns beyond the script. The same seed draws the
same faults at the same instants (what the machine does around them still varies).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.fault_rig import check_tree, survey_model, wait_for
from bench.faults import Rig, rig
from fleet.errors import FleetError, TraceNotFound
from fleet.storage.store import TraceStore
from fleetops.redis_server import start_redis_server

BRANCHES, TURNS, LATENCY_MS = 4, 2, 300
KINDS = ("stop", "worker-kill", "redis-restart", "redis-kill")
WEIGHTS = (5, 3, 1, 1)
CHAOS_ENV = {"FLEET_STUCK_AFTER_S": "5", "FLEET_OWNER_CHECK_INTERVAL_S": "1"}
"""The owner check a little quicker than its defaults (15 s, 5 s), so rounds stay short."""


@dataclass(frozen=True)
class Options:
    """How much chaos."""

    faults: int = 500
    trees: int = 4
    per_round: int = 3
    window_s: float = 3.0
    """Faults land at uniform instants within this long after the round's submissions."""
    bound_s: float = 90.0
    seed: int = 1
    weights: tuple[int, ...] = WEIGHTS
    """How often each of `KINDS` is drawn."""


@dataclass
class Table:
    """What the rounds left."""

    injected: Counter[str] = field(default_factory=Counter)
    trees: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    stuck: list[str] = field(default_factory=list)
    gone: int = 0
    """Trees whose root a Redis SIGKILL took with the last second of writes."""
    duplicated: int = 0
    slowest_s: float = 0.0

    def markdown(self) -> str:
        """The table docs/reliability.md records."""
        faults = ", ".join(f"{k} {self.injected[k]}" for k in KINDS)
        ends = ", ".join(f"{s} {n}" for s, n in sorted(self.ended.items()))
        rows = [
            "| faults injected | trees | ended (status) | gone | stuck | duplicated | slowest |",
            "|---|---|---|---|---|---|---|",
            f"| {sum(self.injected.values())} ({faults}) | {self.trees} | {ends} | {self.gone} "
            f"| {len(self.stuck)} | {self.duplicated} | {self.slowest_s:.1f} s |",
        ]
        return "\n".join(rows)


def tree_ended(store: TraceStore, root_id: str) -> bool:
    """Root, branches and the root's collaborator entries all terminal (or the root gone)."""
    try:
        traces = [store.get_trace(t) for t in [root_id, *store.children(root_id)]]
        entries = store.collaborators(root_id)
    except TraceNotFound:
        return True
    except redis.ConnectionError:  # Redis is coming back from a fault
        return False
    return all(t.is_terminal for t in traces) and all(
        e.status in ("completed", "failed", "stopped") for e in entries
    )


def describe(store: TraceStore, root_id: str) -> str:
    """A stuck tree, trace by trace: what an operator would look at first."""
    lines = [f"stuck tree {root_id}:"]
    for trace_id in [root_id, *store.children(root_id)]:
        trace = store.get_trace(trace_id)
        holder = store.lease_holder(trace_id)
        stop = store.stop_requested(trace_id)
        lines.append(
            f"  {trace_id} {trace.status} it={trace.iteration} lease={holder} stop={stop}"
            f" updated={trace.updated_at_ms} run={trace.run.model_dump(exclude_defaults=True)}"
        )
    for entry in store.collaborators(root_id):
        lines.append(f"  entry {entry.trace_id} {entry.status}")
    return "\n".join(lines)


def retried(action: Callable[[], str], attempts: int = 50) -> str:
    """`action`, again while Redis is coming back from a fault."""
    for _ in range(attempts - 1):
        try:
            return action()
        except redis.ConnectionError:
            time.sleep(0.2)
    return action()


class Chaos:
    """Injects the faults of one run into a rig."""

    def __init__(self, the_rig: Rig, options: Options, say: Callable[[str], None]) -> None:
        """Draw from `options.seed`."""
        self.say = say
        self.rig = the_rig
        self.options = options
        self.random = random.Random(options.seed)
        self.table = Table()

    def round(self, model: str) -> None:
        """Submit the round's trees, inject its faults at their instants, check every tree."""
        plan = sorted(
            (self.random.uniform(0, self.options.window_s), self._kind())
            for _ in range(self.options.per_round)
        )
        fleet = self.rig.fleet
        roots = [
            retried(lambda: fleet.submit("survey", model=model).trace_id)
            for _ in range(self.options.trees)
        ]
        started_s = time.monotonic()
        for at_s, kind in plan:
            time.sleep(max(0.0, started_s + at_s - time.monotonic()))
            self.say(f"  {kind} at {at_s:.2f} s")
            self._inject(kind, roots)
        self._replace_dead_workers()
        self._check(roots, started_s)

    def _kind(self) -> str:
        return self.random.choices(KINDS, self.options.weights)[0]

    def _inject(self, kind: str, roots: list[str]) -> None:
        self.table.injected[kind] += 1
        actions: dict[str, Callable[[], None]] = {
            "stop": lambda: self._stop(self.random.choice(roots)),
            "worker-kill": self._kill_worker,
            "redis-restart": self._restart_redis,
            "redis-kill": self._kill_redis,
        }
        actions[kind]()

    def _stop(self, root_id: str) -> None:
        with contextlib.suppress(FleetError, redis.ConnectionError, OSError):
            self.rig.fleet.stop(root_id)

    def _kill_worker(self) -> None:
        alive = [w for w in self.rig.workers if w.process.poll() is None]
        if alive:
            self.random.choice(alive).signal(signal.SIGKILL)

    def _restart_redis(self) -> None:
        self.rig.redis.restart()

    def _kill_redis(self) -> None:
        redis = self.rig.redis
        redis.server.process.kill()
        redis.server.process.wait()
        redis.server = start_redis_server(redis.port, redis.data_dir, appendonly=True)

    def _replace_dead_workers(self) -> None:
        for dead in [w for w in self.rig.workers if w.process.poll() is not None]:
            self.rig.replace(dead)

    def _check(self, roots: list[str], started_s: float) -> None:
        store = self.rig.observer
        for root_id in roots:
            self.table.trees += 1
            try:
                wait_for(
                    functools.partial(tree_ended, store, root_id), self.options.bound_s, root_id
                )
            except TimeoutError:
                self.table.stuck.append(root_id)
                self.say(describe(store, root_id))
                continue
            self.table.slowest_s = max(self.table.slowest_s, time.monotonic() - started_s)
            try:
                self.table.ended[store.get_trace(root_id).status] += 1
            except TraceNotFound:
                self.table.gone += 1
                continue
            check = check_tree(store, root_id, BRANCHES, TURNS)
            self.table.duplicated += check.duplicated + check.extra_turns


def run(options: Options, say: Callable[[str], None] = print) -> Table:
    """Rounds until `options.faults` faults were injected."""
    with rig(extra_env=CHAOS_ENV) as (the_rig, _):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        chaos = Chaos(the_rig, options, say)
        while sum(chaos.table.injected.values()) < options.faults:
            chaos.round(model)
            table = chaos.table
            say(
                f"{sum(table.injected.values())} faults, {table.trees} trees, "
                f"{len(table.stuck)} stuck, {table.duplicated} duplicated"
            )
        return chaos.table


def main(argv: list[str] | None = None) -> None:
    """Run and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=Options.faults)
    parser.add_argument("--trees", type=int, default=Options.trees)
    parser.add_argument("--per-round", type=int, default=Options.per_round)
    parser.add_argument("--bound-s", type=float, default=Options.bound_s)
    parser.add_argument("--seed", type=int, default=Options.seed)
    args = parser.parse_args(argv)
    options = Options(args.faults, args.trees, args.per_round, bound_s=args.bound_s, seed=args.seed)
    table = run(options)
    print(table.markdown())
    if table.stuck:
        print("stuck:", " ".join(table.stuck))
    sys.exit(1 if table.stuck or table.duplicated else 0)


if __name__ == "__main__":
    main()
