"""What the fleet's own store writes cost an explore branch, in one process, on a real Redis.

python bench/store_bench.py [--branches 200] [--repeat 3] [--by-command] [--provider]

An explore as a worker fleet runs it, without Celery: the root's first run (its spawn
turn: create the children, announce them, wait), each branch's `Runner.run` (2 scripted
model calls, `list_dir` between them), the collect (`settling.settle`, as the chord body
calls it) and the root's resume. Per branch, for each phase and in total: Redis commands
(INFO commandstats delta: commands inside Lua scripts count), round trips (redis-py
`send_packed_command` calls: a pipeline is one) and CPU of this process
(`time.process_time`). The root's phases are divided by the number of branches. Runs
alternate nothing: compare trees by running this back to back. `--provider`: the scripted
model answers as `plain:m`, a model of a provider without `limits:`, so each call passes the
provider gate (its pause check) as an HTTP model's would.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis
from redis.connection import Connection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.children import settling
from fleet.conversation.roots import TaskSpec, create_root  # noqa: E402
from fleet.limits.backends.redis.budgets import Budgets  # noqa: E402
from fleet.limits.backends.redis.limiter import Limiter  # noqa: E402
from fleet.limits.gate import Gate  # noqa: E402
from fleet.llm.clients import make_client  # noqa: E402
from fleet.llm.config import FleetConfig, ProviderConfig  # noqa: E402
from fleet.loop.runner import Runner  # noqa: E402
from fleet.runtime import Runtime  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.storage.backends.redis.store import RedisStore  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fleetkit import RecordingDispatcher, explore_script  # noqa: E402

PHASES = ("spawn", "branch", "collect", "resume")
PROVIDER_MODEL = "plain:m"
PROVIDER_CONFIG = FleetConfig(
    providers={"plain": ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1")}
)


def on_provider(runtime: Runtime, gate: Gate, script: str) -> tuple[Runtime, str]:
    """The runtime with `script` answering as a model of a provider without limits."""
    client = make_client(runtime.config, script, {}, allow_scripted=True)
    clients = {PROVIDER_MODEL: client}
    return replace(runtime, config=PROVIDER_CONFIG, gate=gate, clients=clients), PROVIDER_MODEL


_round_trips = 0
_send = Connection.send_packed_command


def _counting_send(self: Connection, command: Any, check_health: bool = True) -> None:
    global _round_trips
    _round_trips += 1
    _send(self, command, check_health)


@dataclass
class Meter:
    """Commands, round trips and CPU over blocks, summed per phase."""

    client: redis.Redis
    commands: Counter[str] = field(default_factory=Counter)
    by_command: dict[str, Counter[str]] = field(default_factory=dict)
    round_trips: Counter[str] = field(default_factory=Counter)
    cpu_s: Counter[str] = field(default_factory=Counter)

    def _stats(self) -> Counter[str]:
        stats = self.client.info("commandstats")
        return Counter({k[8:]: int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"})

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before = self._stats()
        trips = _round_trips
        cpu = time.process_time()
        yield
        self.cpu_s[name] += time.process_time() - cpu
        self.round_trips[name] += _round_trips - trips
        delta = self._stats() - before
        self.commands[name] += sum(delta.values())
        self.by_command.setdefault(name, Counter()).update(delta)


def one_explore(runtime: Runtime, recorder: RecordingDispatcher, model: str, meter: Meter) -> int:
    """An explore's phases, metered; returns the number of branches."""
    root = create_root(runtime, TaskSpec("survey", model))
    runner = Runner(runtime)
    with meter.phase("spawn"):
        assert runner.run(root.trace_id).outcome == "waiting"
    request = recorder.requests.pop()
    for child in request.child_ids:
        with meter.phase("branch"):
            assert runner.run(child).outcome == "completed"
    with meter.phase("collect"):
        settled = settling.settle(
            runtime, request.parent_trace_id, request.tool_call_id, request.child_ids
        )
        assert isinstance(settled, settling.Settled) and settled.turn_complete
    with meter.phase("resume"):
        assert runner.run(root.trace_id).outcome == "completed"
    return len(request.child_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--by-command", action="store_true", help="per-command counts")
    parser.add_argument("--provider", action="store_true", help="calls pass the provider gate")
    args = parser.parse_args()
    Connection.send_packed_command = _counting_send  # type: ignore[method-assign]
    server = start_redis_server()
    rows: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, RedisStore.from_url(server.url) as store:
            workdir = Path(tmp)
            recorder = RecordingDispatcher()
            settings = Settings(workspace=workdir, allow_scripted=True)
            runtime = Runtime.build(settings, store, recorder)
            warm = explore_script(workdir / "warm.yaml", 20)
            model = explore_script(workdir / "model.yaml", args.branches)
            warmed, measured = runtime, runtime
            if args.provider:
                gate = Gate(PROVIDER_CONFIG, {}, Limiter(store.client), Budgets(store.client))
                warmed, warm = on_provider(runtime, gate, warm)
                measured, model = on_provider(runtime, gate, model)
            one_explore(warmed, recorder, warm, Meter(store.client))  # scripts, imports
            last = Meter(store.client)
            for _ in range(args.repeat):
                meter = Meter(store.client)
                n = one_explore(measured, recorder, model, meter)
                rows.append(_row(meter, n))
                last = meter
    finally:
        server.stop()
    _print(rows, args.branches, args.repeat)
    if args.by_command:
        _print_commands(last, args.branches)


def _row(meter: Meter, n: int) -> dict[str, float]:
    row: dict[str, float] = {}
    for phase in PHASES:
        row[f"cmds {phase}"] = meter.commands[phase] / n
        row[f"rt {phase}"] = meter.round_trips[phase] / n
        row[f"cpu {phase}"] = meter.cpu_s[phase] * 1000 / n
    for what in ("cmds", "rt", "cpu"):
        row[f"{what} total"] = sum(row[f"{what} {p}"] for p in PHASES)
    return row


def _print(rows: list[dict[str, float]], branches: int, repeat: int) -> None:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"explore of {branches} branches in-process on Redis, per branch, median of {repeat}")
    print(f"{'phase':>8} {'commands':>9} {'round trips':>12} {'cpu ms':>8}")
    for phase in (*PHASES, "total"):
        cells = [med(f"{what} {phase}") for what in ("cmds", "rt", "cpu")]
        print(f"{phase:>8} {cells[0]:9.2f} {cells[1]:12.3f} {cells[2]:8.3f}")


def _print_commands(meter: Meter, n: int) -> None:
    per: Callable[[int], str] = lambda calls: f"{calls / n:7.2f}"  # noqa: E731
    print("\nper branch, by command (last run):")
    names = sorted(set().union(*meter.by_command.values()))
    print(f"{'command':>18} " + " ".join(f"{p:>7}" for p in PHASES))
    for name in names:
        print(f"{name:>18} " + " ".join(per(meter.by_command[p][name]) for p in PHASES))


if __name__ == "__main__":
    main()
