"""Randomised fleet: a seeded mix of features, backends and faults; every tree must end.

    python bench/chaos.py --faults 1000            # make chaos: every backend, ~1,000 faults
    python bench/chaos.py --faults 12 --rounds-per-backend 1   # the standing check (tests/)
    python bench/chaos.py --seed 7 --round 12      # replay one round a failing run named

A run is a sequence of rounds. Round R draws, from the generator seeded with (seed, R), a
workload (`chaos_parts.workload`: explore/delegate/evaluate trees of various sizes,
questions answered or left to time out, memory, images, budgets that run out, per-root
caps, messages to running trees, MCP tools quick, huge, slow, a hanging re-listing and
`mcp-server-git`, continue and rewind, the hostile provider, the Batch API, `fleet batch`
files, experiences shown and learnt, a remote A2A sub-agent) and faults at instants within
the round's first seconds (`chaos_parts.faults`). Rounds run in sessions of
`--rounds-per-backend` on one backend (`chaos_parts.backends`: single Redis, Sentinel,
3-master Cluster; a Redis broker, a RabbitMQ vhost or a private RabbitMQ node), the
backends taken in a seeded order so that every one serves. After each round the
invariants of `chaos_parts.invariants` and `chaos_parts.features` are checked; a round
that breaks one prints its seed and the command that replays it. The same seed draws the
same trees and faults at the same instants (what the machine does around them still
varies).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.chaos_parts import faults, features, invariants, workload
from bench.chaos_parts.actions import act, follow_up
from bench.chaos_parts.backends import BACKENDS, Backend, backend
from bench.chaos_parts.faults import FREEZE_S
from bench.chaos_parts.rig import Rig, seed_experience
from bench.chaos_parts.table import Row, Table
from fleet.errors import FleetError

CHAOS_ENV = {
    "FLEET_STUCK_AFTER_S": "5",
    "FLEET_OWNER_CHECK_INTERVAL_S": "1",
    **dict.fromkeys(invariants.SECRETS_ENV, invariants.CANARY),
}
"""The owner check quicker than its defaults (15 s, 5 s), so rounds stay short; the API
keys are canaries the log scan looks for."""
T = TypeVar("T")
WRONG_COMMANDS = [
    ["trace", "show", "nosuchtrace"],
    ["reply", "nosuchtrace", "yes"],
    ["approve", "{root}"],  # an ended tree: nothing waits to be approved
    ["deny", "{root}", "no"],
    ["send", "nosuchtrace", "hello"],
    ["stop", "no such trace"],
    ["memory", "show", "user:chaos", "no-such-key"],
]
"""Commands a round runs that must fail in one line (`{root}`: one of its ended trees)."""
BROKER_WEIGHTS = {"redis": 2, "rabbitmq": 1, "rabbitmq-node": 1}


@dataclass(frozen=True)
class Options:
    """How much chaos."""

    faults: int = 1000
    seed: int = 1
    rounds_per_backend: int = 4
    trees: tuple[int, int] = (3, 6)
    per_round: tuple[int, int] = (1, 4)
    window_s: float = 4.0
    """Faults land at uniform instants within this long after the round's submissions."""
    bound_s: float = 90.0
    """Every tree ends within this long of its submission."""
    latency_ms: int = 150
    only_round: int | None = None
    workers: int = 2
    freeze_s: tuple[float, float] = FREEZE_S
    brokers: tuple[str, ...] = tuple(BROKER_WEIGHTS)
    """The brokers a session may draw (`rabbitmq` needs the local RabbitMQ and rabbitmqctl,
    `rabbitmq-node` an installed rabbitmq-server)."""
    kinds: tuple[str, ...] = ()
    """Draw only trees of these kinds (all when empty)."""
    stop_after_s: float = 0.0
    """Start no round after this long (0: none); the table says the count reached."""
    fault_kinds: tuple[str, ...] = ()
    """Draw only faults of these kinds (those the backend takes; all when empty)."""


def session_of(options: Options, round_no: int) -> tuple[str, str]:
    """The backend and broker round `round_no` runs on."""
    session = round_no // options.rounds_per_backend
    order = list(BACKENDS)
    random.Random(f"{options.seed}:order").shuffle(order)
    rng = random.Random(f"{options.seed}:session:{session}")
    brokers = [b for b in BROKER_WEIGHTS if b in options.brokers]
    broker = rng.choices(brokers, [BROKER_WEIGHTS[b] for b in brokers])[0]
    return order[session % len(order)], broker


class Round:
    """One round: its draw, its submissions, its faults, its checks."""

    def __init__(self, the: Backend, options: Options, number: int, folder: Path, rig: Rig) -> None:
        """Draw the round's trees and faults from (seed, number)."""
        self.the, self.options, self.number, self.rig = the, options, number, rig
        self.folder = folder
        self.rng = random.Random(f"{options.seed}:{number}")
        self.trees = [
            workload.draw(self.rng, f"T{number}x{i}", folder, options.kinds)
            for i in range(self.rng.randint(*options.trees))
        ]
        kinds, weights = faults.kinds_of(the, options.fault_kinds)
        count = self.rng.randint(*options.per_round)
        self.plan = sorted(
            (self.rng.uniform(0, options.window_s), self.rng.choices(kinds, weights)[0])
            for _ in range(count)
        )
        self.model = workload.write_script(
            self.trees, folder / f"r{number}.json", options.latency_ms
        )

    def run(self, row: Row, say: Callable[[str], None], experience_id: str) -> None:
        """Submit, inject, check; count into `row`."""
        self.rig.batch.use(Path(self.model.removeprefix("scripted:")))
        sent_before = len(self.rig.batch.sent)
        remote_before = len(self.rig.remote.record.messages)
        uses_before = features.uses(self.the.fleet, experience_id)
        started_s = time.monotonic()
        for tree in self.trees:
            try:
                tree.root_id = _retried(functools.partial(self._submit, tree))
            except FleetError as exc:  # refused as a whole: one line, nothing written
                row.cli += [] if "\n" not in str(exc) else [f"submit {tree.kind}: {exc!r}"]
                say(f"  {tree.tag} {tree.kind} refused: {exc}")
                continue
            _retried(functools.partial(invariants.mark, self.the.fleet.store, tree.root_id))
            row.features[tree.kind] += 1
            if tree.entries:
                env = _os_env() | self.the.env
                features.start_file(tree, self.model, env, self.folder, self.options.bound_s)
        self.trees = [t for t in self.trees if t.root_id]
        threads = [
            threading.Thread(target=act, args=(self.the.fleet, t, self.rng.random()), daemon=True)
            for t in self.trees
        ]
        for thread in threads:
            thread.start()
        for at_s, kind in self.plan:
            time.sleep(max(0.0, started_s + at_s - time.monotonic()))
            say(f"  round {self.number}: {kind} at {at_s:.2f} s")
            row.injected[kind] += 1
            roots = [t.root_id for t in self.trees]
            try:
                faults.inject(kind, self.the, roots, self.rng, self.options.freeze_s)
            except (TimeoutError, RuntimeError, OSError, redis.RedisError) as exc:  # the rig's
                row.rig.append(f"round {self.number} {kind}: {exc}")
                say(f"  {kind} could not be injected: {exc}")
        time.sleep(max(0.0, self.options.freeze_s[1] - self.options.window_s))  # all thawed
        self.the.replace_dead()
        self._check(row, started_s, say)
        self._check_features(row, started_s, experience_id, uses_before, sent_before)
        doubled = [*self.rig.remote_doubled(remote_before), *self.rig.batch.doubled(sent_before)]
        row.doubled += [f"round {self.number}: {d}" for d in doubled]
        row.checked["remote A2A tasks"] += len(self.rig.remote.record.messages) - remote_before

    def _check_features(
        self,
        row: Row,
        started_s: float,
        experience_id: str,
        uses_before: tuple[int, int] | None,
        sent_before: int,
    ) -> None:
        label, fleet = f"round {self.number}", self.the.fleet
        for tree in self.trees:
            if tree.entries:
                deadline_s = started_s + 2 * self.options.bound_s
                features.check_file(fleet, tree, row, deadline_s, label)
        check = functools.partial(
            features.check_experiences, fleet, self.trees, experience_id, uses_before, row
        )
        _retried(functools.partial(check, label))
        row.checked["Batch API custom ids sent"] += len(self.rig.batch.sent) - sent_before

    def _submit(self, tree: workload.Tree) -> str:
        task = workload.task_of(tree)
        options = {"model": self.model, **tree.submit}  # a provider tree names its own
        return self.the.fleet.submit(task, **options).trace_id

    def _check(self, row: Row, started_s: float, say: Callable[[str], None]) -> None:
        store = self.the.fleet.store
        deadline_s = started_s + self.options.bound_s
        for tree in self.trees:
            row.trees += 1
            ended = invariants.wait_ended(store, tree.root_id, deadline_s)
            if ended and follow_up(self.the.fleet, tree):
                ended = invariants.wait_ended(
                    store, tree.root_id, time.monotonic() + self.options.bound_s
                )
            if not ended:
                row.stuck.append(f"round {self.number} {tree.kind} {tree.root_id}")
                say(invariants.describe(store, tree.root_id))
                continue
            row.slowest_s = max(row.slowest_s, time.monotonic() - started_s)
            verdict = _retried(functools.partial(invariants.check, store, tree))
            row.ended[verdict.status] += 1
            tree.outcome["status"] = verdict.status
            if verdict.status == "lost":  # the root gone, Redis's marker beside it kept
                row.lost.append(f"round {self.number} {tree.kind} {tree.root_id}")
                say(f"  {tree.kind} {tree.root_id}: the root is gone, its slot's marker is not")
            row.doubled += [f"round {self.number} {tree.kind}: {d}" for d in verdict.doubled]
            row.costs += [f"round {self.number} {tree.kind}: {c}" for c in verdict.costs]
        wrong = self.rng.choice(WRONG_COMMANDS) + [self.rng.choice(self.trees).root_id]
        wrong = [w.replace("{root}", wrong[-1]) for w in wrong[:-1]]
        problem = invariants.cli_error(_os_env() | self.the.env, wrong)
        if problem:
            row.cli.append(problem)


def _os_env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _retried(action: Callable[[], T], attempts: int = 100) -> T:
    """`action`, again while the store is coming back from a fault."""
    for _ in range(attempts - 1):
        try:
            return action()
        except (redis.RedisError, OSError, FleetError) as exc:
            if isinstance(exc, FleetError) and "connect" not in str(exc).lower():
                raise
            time.sleep(0.2)
    return action()


def run(options: Options, say: Callable[[str], None] = print) -> Table:
    """Rounds until `options.faults` faults were injected (or only `options.only_round`)."""
    table = Table()
    number = options.only_round or 0
    # a node a Sentinel failover started may outlive its session and write there meanwhile
    with tempfile.TemporaryDirectory(prefix="fleet-chaos-", ignore_cleanup_errors=True) as name:
        folder = Path(name)
        rig = Rig(folder, options.seed)
        env = {**CHAOS_ENV, **rig.env}
        ends_s = time.monotonic() + (options.stop_after_s or float("inf"))
        try:
            while _more(options, table, ends_s):
                number = _session(options, number, folder, env, rig, table, say, ends_s)
                if options.only_round is not None:
                    break
        finally:
            rig.close()
        table.hostile = rig.hostile_counts()
    return table


def _more(options: Options, table: Table, ends_s: float) -> bool:
    """Whether another round runs: faults still to inject, time left (or a replay)."""
    if options.only_round is not None:
        return True
    return table.faults() < options.faults and time.monotonic() < ends_s


def _session(
    options: Options,
    first: int,
    folder: Path,
    env: dict[str, str],
    rig: Rig,
    table: Table,
    say: Callable[[str], None],
    ends_s: float,
) -> int:
    """Rounds on one backend from round `first`; the next round's number."""
    name, broker = session_of(options, first)
    row = table.rows[name]
    seen: dict[Path, int] = {}
    say(f"{name} store, {broker} broker")
    last = (
        first
        if options.only_round is not None
        else first - first % options.rounds_per_backend + options.rounds_per_backend - 1
    )
    with contextlib.ExitStack() as stack:
        start = backend(name, broker, folder / f"s{first}", env, options.workers, rig.faults)
        try:
            the = stack.enter_context(start)
        except TimeoutError as exc:  # a node of the rig not up in time (load): the rig's
            row.rig.append(f"rounds {first}-{last} not run: {exc}")
            say(f"  rounds {first}-{last} not run: {exc}")
            return last + 1
        experience_id = _retried(functools.partial(seed_experience, the.fleet))
        for number in range(first, last + 1):
            before, counts = row.breaks, row.counts()
            Round(the, options, number, folder, rig).run(row, say, experience_id)
            row.rounds += 1
            tracebacks, secrets = invariants.log_findings(the.logs(), seen)
            row.tracebacks += tracebacks
            row.secrets += secrets
            for line in row.findings_since(counts, shown=3):
                say(f"  {line}")
            if row.breaks > before:  # this round broke one (whatever earlier rounds did)
                replay = replay_command(options, number)
                table.failing.append(f"round {number} ({name}, {broker}): {replay}")
                say(f"  round {number} broke an invariant: replay with {replay}")
            say(f"  {table.faults()} faults so far")
            if options.only_round is None and not _more(options, table, ends_s):
                break
    return last + 1


def replay_command(options: Options, number: int) -> str:
    """The command that draws round `number` again (the options that shape the draw)."""
    return (
        f"python bench/chaos.py --seed {options.seed} --round {number}"
        f" --rounds-per-backend {options.rounds_per_backend}"
        f" --trees {options.trees[0]} {options.trees[1]}"
        f" --per-round {options.per_round[0]} {options.per_round[1]}"
        f" --window-s {options.window_s:g} --workers {options.workers}"
        f" --brokers {' '.join(options.brokers)}"
        + (f" --kinds {' '.join(options.kinds)}" if options.kinds else "")
        + (f" --fault-kinds {' '.join(options.fault_kinds)}" if options.fault_kinds else "")
        + (f" --bound-s {options.bound_s:g}" if options.bound_s != Options.bound_s else "")
        + (
            f" --freeze-s {options.freeze_s[0]:g} {options.freeze_s[1]:g}"
            if options.freeze_s != Options.freeze_s
            else ""
        )
    )


def main(argv: list[str] | None = None) -> None:
    """Run and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--faults", type=int, default=Options.faults)
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--round", type=int, default=None, help="replay only this round")
    parser.add_argument("--rounds-per-backend", type=int, default=Options.rounds_per_backend)
    parser.add_argument("--bound-s", type=float, default=Options.bound_s)
    parser.add_argument("--trees", type=int, nargs=2, default=Options.trees, metavar=("MIN", "MAX"))
    parser.add_argument(
        "--per-round", type=int, nargs=2, default=Options.per_round, metavar=("MIN", "MAX")
    )
    parser.add_argument("--window-s", type=float, default=Options.window_s)
    parser.add_argument("--workers", type=int, default=Options.workers)
    parser.add_argument(
        "--brokers", nargs="+", choices=list(BROKER_WEIGHTS), default=Options.brokers
    )
    parser.add_argument("--kinds", nargs="+", choices=workload.KINDS, default=())
    parser.add_argument("--fault-kinds", nargs="+", default=())
    parser.add_argument("--stop-after-s", type=float, default=0.0)
    parser.add_argument(
        "--freeze-s", type=float, nargs=2, default=Options.freeze_s, metavar=("MIN", "MAX")
    )
    args = parser.parse_args(argv)
    options = Options(
        args.faults,
        args.seed,
        args.rounds_per_backend,
        trees=tuple(args.trees),
        per_round=tuple(args.per_round),
        window_s=args.window_s,
        bound_s=args.bound_s,
        only_round=args.round,
        workers=args.workers,
        brokers=tuple(args.brokers),
        kinds=tuple(args.kinds),
        fault_kinds=tuple(args.fault_kinds),
        freeze_s=tuple(args.freeze_s),
        stop_after_s=args.stop_after_s,
    )
    started_s = time.monotonic()
    table = run(options)
    print(table.markdown(options))
    print(f"{time.monotonic() - started_s:.0f} s")
    for line in table.failing:
        print("failing:", line)
    for name, row in table.rows.items():
        for line in row.rig:
            print(f"not injected ({name}): {line}")
    sys.exit(1 if any(r.broken for r in table.rows.values()) else 0)


if __name__ == "__main__":
    main()
