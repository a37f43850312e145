"""Fault injection: each fault × N explore runs, and what was lost, doubled, and how fast it healed.

    python bench/faults.py                  # every scenario, 20 runs each (make faults)
    python bench/faults.py --runs 2 --quick # what CI runs (shorter freeze and outage)
    python bench/faults.py --scenario freeze --runs 5

Each run is an explore of 8 branches (each looks around 3 times, 700 ms per model call) on
two workers with the default settings (5 s lease, 1 s sweep), and one fault in the middle
of it. A run is *completed* when the root and every branch completed and each branch was
collected once; *lost* when it did not end within the timeout; *duplicated* counts tool
results beyond one per tool call and model turns written beyond the script (a write from
a runner that was fenced out would show here). *Recovery* is from the fault (for Redis and
broker faults: from the moment the store is back) until every branch the fault interrupted
runs again (leased by a live runner, or ended).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fault_rig import (
    REPO,
    CutProxy,
    FlakyProvider,
    Redis,
    TreeCheck,
    Worker,
    check_tree,
    start_worker,
    survey_model,
    temporary_directory,
    wait_consuming,
    wait_for,
)
from fleet.client import Fleet
from fleet.errors import FleetError
from fleet.models import Trace
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleetops.redis_server import start_redis_server

BRANCHES, TURNS, LATENCY_MS = 8, 3, 700
RUN_TIMEOUT_S = 120.0
WORKERS, CONCURRENCY = 2, 8


@dataclass(frozen=True)
class Options:
    """How hard to push."""

    runs: int = 20
    freeze_s: float = 40.0
    outage_s: float = 20.0
    failure_rate: float = 0.3
    transient_retries: int = 3
    """Re-runs after provider errors (FLEET_TRANSIENT_RETRIES); CI uses 1 so that the
    provider-down run fails in seconds."""


@dataclass
class Row:
    """One scenario's table row."""

    name: str
    runs: int = 0
    completed: int = 0
    lost: int = 0
    duplicated: int = 0
    recovery_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fenced: int = 0
    """Runs of a worker that came back from a freeze and were refused by the lease fence."""

    def add(self, check: TreeCheck | None, recovery_s: float | None) -> None:
        """Count one run."""
        self.runs += 1
        if check is None:
            self.lost += 1
            return
        self.completed += check.completed
        self.lost += not check.completed
        self.duplicated += check.duplicated + check.extra_turns
        if not check.completed:
            self.notes.append(check.detail)
        if recovery_s is not None:
            self.recovery_s.append(recovery_s)

    def cells(self) -> list[str]:
        """The printed columns."""
        rec = self.recovery_s
        high = f"{max(rec):.1f}" if rec else "-"
        mid = f"{statistics.median(rec):.1f}" if rec else "-"
        counts = [self.runs, self.completed, self.lost, self.duplicated]
        return [self.name, *map(str, counts), high, mid]


HEADER = ["scenario", "runs", "completed", "lost", "duplicated", "max rec s", "median rec s"]


@dataclass
class Rig:
    """Redis, workers on it, a client, and a direct observer of the store."""

    redis: Redis
    workspace: Path
    env: dict[str, str]
    url: str
    """What workers and the client use (the proxy's, in the outage scenario)."""
    fleet: Fleet
    observer: RedisStore
    workers: list[Worker] = field(default_factory=list)
    last_recovery_s: float | None = None

    def add_worker(self) -> Worker:
        """Start one more worker and wait until it consumes."""
        worker = start_worker(self.env, CONCURRENCY)
        self.workers.append(worker)
        wait_consuming(self.observer, [worker.name])
        return worker

    def replace(self, dead: Worker) -> None:
        """A fresh worker instead of one the fault took."""
        dead.stop()
        self.workers.remove(dead)
        self.add_worker()


@contextlib.contextmanager
def rig(
    *, via_proxy: bool = False, extra_env: dict[str, str] | None = None, workers: int = WORKERS
) -> Iterator[tuple[Rig, CutProxy | None]]:
    """A fresh Redis (and proxy), `workers` workers, a client."""
    redis = Redis()
    proxy = CutProxy(redis.port) if via_proxy else None
    url = proxy.url if proxy else redis.url
    with temporary_directory() as workspace, contextlib.ExitStack() as stack:
        stack.callback(redis.close)
        if proxy:
            stack.callback(proxy.cut)
        env = {
            "FLEET_REDIS_URL": url,
            "FLEET_BROKER_URL": url,
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),  # the provider's fleet.yaml is outside
            "FLEET_ALLOW_SCRIPTED": "1",
            **(extra_env or {}),
        }
        fleet = Fleet.from_env(Settings.from_env({**os.environ, **env}))
        observer = RedisStore.from_url(redis.url)
        stack.callback(observer.close)
        the_rig = Rig(redis, workspace, env, url, fleet, observer)
        stack.callback(_stop_all, the_rig)
        for _ in range(workers):
            the_rig.workers.append(start_worker(env, CONCURRENCY))
        wait_consuming(observer, [w.name for w in the_rig.workers])
        yield the_rig, proxy


def _stop_all(the_rig: Rig) -> None:
    for worker in the_rig.workers:
        worker.stop()


# -- observing a run ------------------------------------------------------------------------


def branches(store: TraceStore, root_id: str) -> list[Trace]:
    """The root's children as they are now."""
    return [store.get_trace(c) for c in store.children(root_id)]


def held_by(store: TraceStore, root_id: str, pid: int) -> dict[str, str]:
    """Branch id -> lease owner, for the branches a runner in process `pid` holds."""
    owners = {b.trace_id: store.lease_holder(b.trace_id) for b in branches(store, root_id)}
    return {t: o for t, o in owners.items() if o and f":{pid}:" in o}


def wait_recovered(store: TraceStore, victims: dict[str, str], since_s: float) -> float:
    """Seconds from `since_s` until each victim branch is leased anew or ended."""
    pending = dict(victims)

    def recovered() -> bool:
        for trace_id, owner in list(pending.items()):
            holder = store.lease_holder(trace_id)
            if (holder and holder != owner) or store.get_trace(trace_id).is_terminal:
                del pending[trace_id]
        return not pending

    wait_for(recovered, RUN_TIMEOUT_S, "the interrupted branches to run again")
    return time.monotonic() - since_s


def wait_progress(store: TraceStore, before: dict[str, int], since_s: float) -> float:
    """Seconds from `since_s` until each branch in `before` advanced a turn or ended."""

    def advanced() -> bool:
        now = {t: store.get_trace(t) for t in before}
        return all(t.is_terminal or t.iteration > before[i] for i, t in now.items())

    wait_for(advanced, RUN_TIMEOUT_S, "the interrupted branches to advance")
    return time.monotonic() - since_s


def mid_run(store: TraceStore, root_id: str, at_least: int = 4) -> dict[str, int]:
    """Waits until `at_least` branches are past their first turn; their iterations."""
    found: dict[str, int] = {}

    def enough() -> bool:
        found.clear()
        found.update(
            {b.trace_id: b.iteration for b in branches(store, root_id) if b.iteration >= 1}
        )
        return len(found) >= at_least

    wait_for(enough, RUN_TIMEOUT_S, f"{at_least} branches under way")
    return {t: i for t, i in found.items() if not store.get_trace(t).is_terminal}


def finish(the_rig: Rig, root_id: str) -> TreeCheck:
    """Wait for the root (through the client), then check the tree."""
    try:
        the_rig.fleet.wait(root_id, timeout_s=RUN_TIMEOUT_S)
    except (TimeoutError, FleetError) as exc:
        check = check_tree(the_rig.observer, root_id, BRANCHES, TURNS)
        return replace(check, completed=False, detail=f"{exc}: {check.detail}")
    return check_tree(the_rig.observer, root_id, BRANCHES, TURNS)


def submit(the_rig: Rig, model: str) -> str:
    """Start one explore."""
    return the_rig.fleet.submit("survey", model=model).trace_id


# -- the scenarios --------------------------------------------------------------------------


Fault = Callable[[dict[str, str]], float]
"""Injects the fault given the victim branches (id -> lease owner); returns recovery s."""


def victim_run(the_rig: Rig, model: str, pid: int, fault: Fault) -> None | TreeCheck:
    """One explore; `fault` strikes once process `pid` runs at least two of its branches."""
    root_id = submit(the_rig, model)
    wait_for(lambda: len(held_by(the_rig.observer, root_id, pid)) >= 2, 60, "a busy victim")
    recovery_s = fault(held_by(the_rig.observer, root_id, pid))
    check = finish(the_rig, root_id)
    the_rig.last_recovery_s = recovery_s
    if not check.completed:
        logs = " ".join(str(w.log_path) for w in the_rig.workers)
        check = replace(check, detail=f"{check.detail} (root {root_id}; logs {logs})")
    return check


def kill_independent(options: Options) -> Row:
    """SIGKILL one of two `fleet worker` processes mid-explore (a lost machine)."""
    row = Row("worker SIGKILL, independent workers")
    with rig() as (the_rig, _):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            victim = the_rig.workers[0]

            def kill(victims: dict[str, str], victim: Worker = victim) -> float:
                victim.kill()
                return wait_recovered(the_rig.observer, victims, time.monotonic())

            row.add(victim_run(the_rig, model, victim.pid, kill), the_rig.last_recovery_s)
            the_rig.replace(victim)
    return row


def freeze(options: Options) -> Row:
    """SIGSTOP a worker for `freeze_s`, then SIGCONT (a VM pause): it must write nothing."""
    row = Row(f"worker SIGSTOP {options.freeze_s:.0f} s, SIGCONT")
    with rig() as (the_rig, _):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            victim = the_rig.workers[0]

            def pause(victims: dict[str, str], victim: Worker = victim) -> float:
                frozen_s = time.monotonic()
                victim.signal(signal.SIGSTOP)
                try:
                    recovery_s = wait_recovered(the_rig.observer, victims, frozen_s)
                    time.sleep(max(0.0, options.freeze_s - (time.monotonic() - frozen_s)))
                finally:
                    victim.signal(signal.SIGCONT)  # it wakes up mid-turn, its leases gone
                return recovery_s

            row.add(victim_run(the_rig, model, victim.pid, pause), the_rig.last_recovery_s)
            row.fenced += victim.log().count("its lease was taken over")
            the_rig.replace(victim)
    row.notes.append(f"{row.fenced} late runs of the frozen worker stopped by the fence")
    return row


def kill_under_up(options: Options) -> Row:
    """SIGKILL one of `fleet up`'s two workers: it must restart it, the sibling untouched."""
    row = Row("worker SIGKILL under `fleet up`")
    with rig(workers=0) as (the_rig, _), fleet_up(the_rig) as (up, state_dir):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            victim, sibling = up_workers(the_rig, up, state_dir)

            def kill(victims: dict[str, str], victim: int = victim) -> float:
                os.kill(victim, signal.SIGKILL)
                return wait_recovered(the_rig.observer, victims, time.monotonic())

            row.add(victim_run(the_rig, model, victim, kill), the_rig.last_recovery_s)
            if not _alive(sibling):
                row.notes.append("the healthy sibling was stopped")
                row.lost += 1
    return row


@contextlib.contextmanager
def fleet_up(the_rig: Rig) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`fleet up --workers 2` on the rig's Redis, stopped with Ctrl-C at the end.

    Its state folder is a temporary one outside the workspace (removed at the end).
    """
    argv = [sys.executable, "-m", "fleetops.cli.main", "up", "--workers", "2"]
    with temporary_directory() as state_dir:
        env = {**os.environ, **the_rig.env, "PYTHONUNBUFFERED": "1"}
        up = subprocess.Popen(
            [*argv, "--concurrency", str(CONCURRENCY)],
            cwd=the_rig.workspace,
            env={**env, "FLEET_STATE_DIR": str(state_dir / "up")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        yield from _stopped_at_exit(up, state_dir / "up")


def _stopped_at_exit(
    up: subprocess.Popen[bytes], state_dir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    try:
        yield up, state_dir
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)


def up_workers(the_rig: Rig, up: subprocess.Popen[bytes], state_dir: Path) -> tuple[int, int]:
    """The pids of `fleet up`'s two workers, once both consume (after any restart)."""
    from fleetops.discovery import read_state

    prefixes = [f"worker{i}.{up.pid}@" for i in (1, 2)]

    def both_consume() -> bool:
        state = read_state(state_dir)
        nodes = the_rig.observer.live_consumers("fleet.explore")
        live = all(any(n.startswith(p) for n in nodes) for p in prefixes)
        return bool(state and state.ready and live and all(map(_alive, state.worker_pids)))

    wait_for(both_consume, 90, "both of fleet up's workers")
    state = read_state(state_dir)
    assert state is not None
    victim, sibling = state.worker_pids
    return victim, sibling


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def redis_restart(options: Options) -> Row:
    """Restart Redis (append-only file, fsync every second) mid-explore."""
    row = Row("Redis restart (AOF everysec)")
    with rig() as (the_rig, _):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            root_id = submit(the_rig, model)
            before = mid_run(the_rig.observer, root_id)
            the_rig.redis.restart()
            recovery = wait_progress(the_rig.observer, before, time.monotonic())
            row.add(finish(the_rig, root_id), recovery)
    return row


def redis_kill(options: Options) -> Row:
    """SIGKILL Redis mid-explore (append-only, fsync every second), then start it again.

    Up to a second of acknowledged writes is gone: a turn, an entry, a finish. The runs
    that wrote them find the store behind them; the owner check heals what nothing moves.
    """
    row = Row("Redis SIGKILL (AOF everysec)")
    with rig(extra_env={"FLEET_STUCK_AFTER_S": "5"}) as (the_rig, _):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            root_id = submit(the_rig, model)
            before = mid_run(the_rig.observer, root_id)
            server = the_rig.redis.server
            server.process.kill()
            server.process.wait()
            the_rig.redis.server = start_redis_server(
                the_rig.redis.port, the_rig.redis.data_dir, appendonly=True
            )
            recovery = wait_progress(the_rig.observer, before, time.monotonic())
            row.add(finish(the_rig, root_id), recovery)
    return row


def broker_outage(options: Options) -> Row:
    """Redis (broker and store) unreachable for `outage_s`, for workers and client alike."""
    row = Row(f"broker + store unreachable {options.outage_s:.0f} s")
    with rig(via_proxy=True) as (the_rig, proxy):
        assert proxy is not None
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            root_id = submit(the_rig, model)
            before = mid_run(the_rig.observer, root_id)
            proxy.cut()
            time.sleep(options.outage_s)
            proxy.restore()
            recovery = wait_progress(the_rig.observer, before, time.monotonic())
            row.add(finish(the_rig, root_id), recovery)
    return row


def provider_errors(options: Options) -> list[Row]:
    """30 % of completions fail (500/503/429); then a provider that is down for good."""
    flaky = FlakyProvider(BRANCHES, TURNS, LATENCY_MS / 1000, options.failure_rate)
    rows = [Row(f"provider {options.failure_rate:.0%} 500/503/429"), Row("provider down for good")]
    try:
        with temporary_directory() as config_dir:
            env = {
                "FLEET_CONFIG": str(flaky.config(config_dir)),
                "FLEET_TRANSIENT_RETRIES": str(options.transient_retries),
            }
            with rig(extra_env=env) as (the_rig, _):
                for _ in range(options.runs):
                    rows[0].add(finish(the_rig, submit(the_rig, "flaky")), None)
                flaky.down = True
                for _ in range(max(1, options.runs // 5)):
                    rows[1].add(*_down_for_good(the_rig))
    finally:
        flaky.close()
    rows[0].notes.append(f"{flaky.failures} of {flaky.calls} completions failed")
    return rows


def _down_for_good(the_rig: Rig) -> tuple[TreeCheck | None, float]:
    """A run against a dead provider must fail, with the provider's error, and not hang."""
    started_s = time.monotonic()
    root_id = submit(the_rig, "flaky")
    try:
        root = the_rig.fleet.wait(root_id, timeout_s=RUN_TIMEOUT_S)
    except TimeoutError:
        return None, time.monotonic() - started_s
    clear = root.status == "failed" and "HTTP 503" in (root.error or "")
    check = TreeCheck(clear, 0, 0, f"root {root.status}: {root.error}")
    return check, time.monotonic() - started_s


ORPHAN_SPAWNER = """
import os, sys
from pathlib import Path
from fleet.storage.backends.redis.store import RedisStore
from fleet.loop.runner import Runner
from fleet.runtime import Runtime
from fleet.settings import Settings

class DiesBeforeTheChord:
    children_survive_restart = True
    def dispatch(self, runtime, request):
        os._exit(9)  # the children exist in Redis; the chord never goes out

url, workspace, trace_id = sys.argv[1:]
settings = Settings.from_env({**os.environ, "FLEET_REDIS_URL": url, "FLEET_WORKSPACE": workspace})
runtime = Runtime.build(settings, RedisStore.from_url(url), DiesBeforeTheChord())
Runner(runtime).run(trace_id)
"""


def orphaned_spawn(options: Options) -> Row:
    """The process running the root dies between creating the branches and sending them."""
    from fleet.conversation.roots import TaskSpec, create_root

    row = Row("spawner dies before the chord")
    with rig() as (the_rig, _):
        model = survey_model(the_rig.workspace / "m.json", BRANCHES, TURNS, LATENCY_MS)
        for _ in range(options.runs):
            root = create_root(the_rig.fleet.runtime, TaskSpec(task="survey", model=model))
            argv = [sys.executable, "-c", ORPHAN_SPAWNER, the_rig.url, str(the_rig.workspace)]
            env = {**os.environ, **the_rig.env}
            subprocess.run([*argv, root.trace_id], cwd=REPO, env=env, timeout=60, check=False)
            died_s = time.monotonic()
            kids = {b.trace_id: "" for b in branches(the_rig.observer, root.trace_id)}
            recovery = wait_recovered(the_rig.observer, kids, died_s) if kids else None
            row.add(finish(the_rig, root.trace_id), recovery)
    return row


def sentinel_failover(options: Options, replica_behind_s: float = 0.0) -> Row:
    """The master of a Sentinel group SIGKILLed mid-explore (`bench/failover.py`)."""
    from bench import failover

    done = failover.run(options.runs, lambda line: None, replica_behind_s)
    row = Row(done.name, runs=done.runs, completed=done.completed, lost=done.lost)
    row.duplicated = sum(o.duplicated for o in done.outcomes)
    row.recovery_s = [o.recovery_s for o in done.outcomes if o.ended]
    row.notes = [f"{done.failed} ended failed with an error", *done.notes]
    return row


SCENARIOS: dict[str, Callable[[Options], Row | list[Row]]] = {
    "up-kill": kill_under_up,
    "worker-kill": kill_independent,
    "freeze": freeze,
    "redis-restart": redis_restart,
    "redis-kill": redis_kill,
    "outage": broker_outage,
    "provider": provider_errors,
    "orphan": orphaned_spawn,
    "failover": sentinel_failover,
    "failover-lag": lambda options: sentinel_failover(options, replica_behind_s=1.0),
}


QUICK = Options(runs=2, freeze_s=8.0, outage_s=6.0, transient_retries=1)
"""What CI runs (`tests/test_faults.py`, one run each)."""


def run(names: list[str], options: Options, say: Callable[[str], None] = print) -> list[Row]:
    """Run the named scenarios; print each row as it completes."""
    rows: list[Row] = []
    say(" | ".join(HEADER))
    for name in names:
        started_s = time.monotonic()
        try:
            result = SCENARIOS[name](options)
        except Exception as exc:  # a harness step timed out: report it, go on with the rest
            result = Row(name, runs=1, lost=1, notes=[f"{type(exc).__name__}: {exc}"])
        for row in result if isinstance(result, list) else [result]:
            rows.append(row)
            say(" | ".join(row.cells()) + f"   ({time.monotonic() - started_s:.0f} s)")
            for note in row.notes[:5]:
                say(f"    note: {note}")
    return rows


def markdown(rows: list[Row]) -> str:
    """The table for docs/reliability.md."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse, run, print the table (and the machine it ran on)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="short freeze and outage (CI)")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    options = Options(runs=args.runs)
    if args.quick:
        options = replace(QUICK, runs=args.runs)
    rows = run(args.scenario or list(SCENARIOS), options)
    print(f"\n{platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(markdown(rows))


if __name__ == "__main__":
    main()
