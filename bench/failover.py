"""Sentinel failover mid-explore: the master is SIGKILLed, a sentinel promotes its replica.

    python bench/failover.py --runs 20           # the large suite (also `faults.py`'s
                                                 # `failover` scenario)
    python bench/failover.py --runs 20 --replica-behind-s 1   # `failover-lag`

Each run starts a fresh group (primary, replica, two sentinels, quorum 1, down after 1 s),
two `fleet worker`s whose store, limiter, broker and result backend all reach the master
through the sentinels (`sentinel://...;sentinel://...`, FLEET_REDIS_SENTINEL_MASTER), and
a client on the same URL. An explore of 40 branches (3 looks each, 300 ms per model
call) is submitted; once 4 branches are past their first turn the master is killed.
With `--replica-behind-s S` the replica is frozen for S seconds first (SIGSTOP, SIGCONT
after the kill): the master acknowledges S seconds of writes the promoted replica never
got, the worst case of asynchronous replication.

A run *ended* when the client's `wait` returned the root ended and every trace of the tree
is terminal; *completed* when it ended completed with every branch completed, collected
once. A tree may also end failed with the error that says which write was lost (the
replica missed the last acknowledged writes: Redis replication is asynchronous). *Lost*:
not ended within RUN_TIMEOUT_S, or a trace left open (stuck). *Recovery* is from the kill
until the root ended; *promotion* from the kill until the sentinels named the new master.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fault_rig import (
    TreeCheck,
    Worker,
    check_tree,
    start_worker,
    survey_model,
    wait_consuming,
    wait_for,
)
from fleet import owners
from fleet.client import Fleet
from fleet.errors import FleetError
from fleet.models import now_ms
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.owner_index import owner_index
from tests.redis_topologies import MASTER_NAME, SentinelGroup, sentinel_group

BRANCHES, TURNS, LATENCY_MS = 40, 3, 300
RUN_TIMEOUT_S = 120.0
"""The bound docs/reliability.md states for a tree to end after the master dies."""
WORKERS, CONCURRENCY = 2, 8
SENTINELS = 2
SETTLE_S = 15.0
"""How long after its root ended every branch must have ended too."""
STUCK_AFTER_S = 5.0
"""FLEET_STUCK_AFTER_S of the run: a tree quiet this long is walked by the owner check."""


@dataclass
class Outcome:
    """One run."""

    ended: bool
    completed: bool
    stuck: list[str]
    recovery_s: float
    promotion_s: float
    detail: str
    missed_bytes: int = 0
    """The master's replication offset past the replica's last acknowledgement at the kill:
    at most what the promoted replica lacks (a replica acknowledges once a second)."""
    duplicated: int = 0


@dataclass
class FailoverRow:
    """The scenario's row: how many runs ended, completed, failed clearly, were lost."""

    name: str = f"Sentinel failover, master SIGKILL ({BRANCHES} branches)"
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def runs(self) -> int:
        """Runs done."""
        return len(self.outcomes)

    @property
    def completed(self) -> int:
        """Runs whose tree completed, every branch collected once."""
        return sum(o.completed for o in self.outcomes)

    @property
    def failed(self) -> int:
        """Runs whose tree ended failed, with an error (nothing left open)."""
        return sum(o.ended and not o.completed and not o.stuck for o in self.outcomes)

    @property
    def lost(self) -> int:
        """Runs that did not end in time, or left a trace open."""
        return sum(not o.ended or bool(o.stuck) for o in self.outcomes)

    def cells(self) -> list[str]:
        """scenario, runs, completed, failed (ended, an error), lost, duplicated, times."""
        done = self.outcomes
        recovery = [o.recovery_s for o in done if o.ended]
        promotion = [o.promotion_s for o in done]
        counts = [self.runs, self.completed, self.failed, self.lost]
        counts.append(sum(o.duplicated for o in done))
        times = [max(recovery, default=0.0), statistics.median(recovery) if recovery else 0.0]
        times.append(max(promotion, default=0.0))
        return [self.name, *map(str, counts), *(f"{t:.1f}" for t in times)]

    @property
    def notes(self) -> list[str]:
        """Why each run that did not complete did not."""
        return [o.detail for o in self.outcomes if not o.completed]


HEADER = [
    "scenario",
    "runs",
    "completed",
    "failed, clear error",
    "lost or stuck",
    "duplicated",
    "max end s",
    "median end s",
    "max promotion s",
]


@contextlib.contextmanager
def failover_rig(
    directory: Path, sentinels: int = SENTINELS
) -> Iterator[tuple[SentinelGroup, Fleet, RedisStore, Path]]:
    """A fresh group, workers and a client on it; everything stopped at the end."""
    with sentinel_group(directory / "redis", sentinels=sentinels) as group:
        workspace = directory / "workspace"
        workspace.mkdir()
        env = {
            "FLEET_REDIS_URL": group.url,
            "FLEET_BROKER_URL": group.url,
            "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME,
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_ALLOW_SCRIPTED": "1",
            "FLEET_STUCK_AFTER_S": str(STUCK_AFTER_S),
        }
        fleet = Fleet.from_env(Settings.from_env({**os.environ, **env}))
        observer = RedisStore.from_url(group.url, MASTER_NAME)
        workers: list[Worker] = []
        try:
            workers += [start_worker(env, CONCURRENCY) for _ in range(WORKERS)]
            wait_consuming(observer, [w.name for w in workers])
            yield group, fleet, observer, workspace
        finally:
            for worker in workers:
                worker.stop()
            observer.close()
            if isinstance(fleet.store, RedisStore):
                fleet.store.close()


def one_run(directory: Path, replica_behind_s: float = 0.0, sentinels: int = SENTINELS) -> Outcome:
    """A fresh rig, one explore, the master killed under it (the replica that far behind)."""
    with failover_rig(directory, sentinels) as (group, fleet, observer, workspace):
        model = survey_model(workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        root_id = fleet.submit("survey", model=model).trace_id
        wait_for(lambda: _under_way(observer, root_id) >= 4, 90, "4 branches under way")
        old_port = group.master_port()
        assert old_port is not None
        killed_s = time.monotonic() + replica_behind_s
        missed_bytes = group.kill_primary(replica_behind_s)
        promotion_s = group.wait_promoted(old_port)
        try:
            root = fleet.wait(root_id, timeout_s=RUN_TIMEOUT_S)
        except (TimeoutError, FleetError) as exc:
            return Outcome(False, False, [], 0.0, promotion_s, f"{root_id}: {exc}", missed_bytes)
        recovery_s = time.monotonic() - killed_s
        outcome = _judge(observer, root_id, recovery_s, promotion_s, root.error)
        outcome.missed_bytes = missed_bytes
        return outcome


def _under_way(store: RedisStore, root_id: str) -> int:
    return sum(store.get_trace(c).iteration >= 1 for c in store.children(root_id))


def _judge(
    store: RedisStore, root_id: str, recovery_s: float, promotion_s: float, error: str | None
) -> Outcome:
    """Whether the whole tree ended, and nothing is left without an owner."""
    tree = [root_id, *store.children(root_id)]

    def open_traces() -> list[str]:
        return [t for t in tree if not store.get_trace(t).is_terminal]

    # A branch may end a moment after its root did (a stop reaching it between turns).
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not open_traces(), SETTLE_S, "every branch to end")
    still_open = open_traces()
    check: TreeCheck = check_tree(store, root_id, BRANCHES, TURNS)
    found = owners.check(store, owner_index(store), now_ms(), 0, forget=False)
    stuck = still_open + [r.trace.trace_id for r in found]
    detail = f"{root_id}: {check.detail}" + (f"; stuck {stuck}" if stuck else "")
    ended = not still_open
    return Outcome(
        ended,
        check.completed,
        stuck,
        recovery_s,
        promotion_s,
        detail if error is None else f"{detail}; error: {error}",
        duplicated=check.duplicated + check.extra_turns,
    )


def run(
    runs: int,
    say: Callable[[str], None] = print,
    replica_behind_s: float = 0.0,
    sentinels: int = SENTINELS,
) -> FailoverRow:
    """`runs` runs, a line said after each."""
    row = FailoverRow()
    if replica_behind_s:
        row.name = f"{row.name}, replica {replica_behind_s:g} s behind"
    if sentinels != SENTINELS:
        row.name = f"{row.name}, {sentinels} sentinels"
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="fleet-failover-") as name:
            try:
                outcome = one_run(Path(name), replica_behind_s, sentinels)
            except Exception as exc:  # a harness step timed out: count it lost, go on
                why = f"{type(exc).__name__}: {exc}"
                outcome = Outcome(False, False, [], 0.0, 0.0, why)
        row.outcomes.append(outcome)
        say(
            f"run {i + 1}: ended={outcome.ended} completed={outcome.completed}"
            f" end {outcome.recovery_s:.1f} s promotion {outcome.promotion_s:.1f} s"
            f" unacknowledged by the replica {outcome.missed_bytes} B"
            + ("" if outcome.completed else f" ({outcome.detail})")
        )
    return row


def markdown(row: FailoverRow) -> str:
    """The row for docs/reliability.md's fault table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join([*lines, "| " + " | ".join(row.cells()) + " |"])


def main(argv: list[str] | None = None) -> None:
    """Parse, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--replica-behind-s",
        type=float,
        default=0.0,
        help="freeze the replica this long before the kill: acknowledged writes are lost",
    )
    parser.add_argument("--sentinels", type=int, default=SENTINELS, help="1 to 3 (quorum 1)")
    args = parser.parse_args(argv)
    row = run(args.runs, replica_behind_s=args.replica_behind_s, sentinels=args.sentinels)
    print(f"\n{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(markdown(row))


if __name__ == "__main__":
    main()
