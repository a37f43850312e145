"""A fleet branch's worker CPU against Celery's floor for the same work, side by side.

python bench/floor_bench.py [--branches 1000] [--rounds 4]

On the bench's workers (2 processes x 100 threads, a private redis-server), alternated in
each round, per branch (worker CPU as in bench/explore_bench.py; medians of the rounds):

- `fleet`: an explore of N branches at 0 ms (2 scripted model calls and `list_dir` each);
- `plain`: `chord(N x bench.sleep(0), bench.done)` sent by this process, the issue's peer;
- `floor`: the same chord of `bench.durable_sleep`, which also makes a branch's three store
  round trips (a Lua script writing a hash field of ~900 bytes, an event and a TTL): what
  Celery and the durable writes a branch must make cost with no agent runtime around them;
- `same`: `bench.sleep_root`, the same tree sent from a worker by a plain root task (what a
  Celery user would write; explore_bench's `f/same`).

What is above `floor` is the fleet's own Python: the runner, the messages and events it
builds, the model client, the tool, and the root's spawn, dispatch and collect per child
(`floor` and `plain` are sent by this process; `same` and the fleet from a worker).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import redis
from celery._state import _set_task_join_will_block

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.explore_bench import environment  # noqa: E402
from bench.harness import Meter, openai_server, workers  # noqa: E402
from bench.runs import (  # noqa: E402
    Sample,
    chord_run,
    durable_chord_run,
    fleet_run,
    rooted_chord_run,
)
from fleet.client import Fleet  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from workers.app import app  # noqa: E402


def columns(
    fleet: Fleet, meter: Meter, pids: list[int], model: str, n: int
) -> dict[str, Callable[[], Sample]]:
    """One measured run of each column."""
    return {
        "fleet": lambda: fleet_run(fleet, meter, pids, "survey the workspace", model),
        "plain": lambda: chord_run(meter, pids, n, 0),
        "floor": lambda: durable_chord_run(meter, pids, n, 0),
        "same": lambda: rooted_chord_run(meter, pids, n, 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--branches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    n = args.branches
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        base_url = stack.enter_context(openai_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        env = environment(server.url, tmp, base_url)
        fleet = Fleet.from_env(Settings.from_env(env))
        app.conf.broker_url = app.conf.result_backend = server.url
        procs = stack.enter_context(workers(env, "threads", 100, 2))
        _set_task_join_will_block(True)
        client = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        model = explore_script(tmp / "explore.yaml", n, latency_ms=0)
        runs = columns(fleet, Meter(client), [w.pid for w in procs], model, n)
        for run in runs.values():  # warm-up: imports, connections, pools
            run()
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        print(f"# worker CPU per branch, ms (N={n}; each round alternates the columns)")
        for _ in range(args.rounds):
            row = {name: 1000 * run().cpu_s / n for name, run in runs.items()}
            for name, value in row.items():
                cpu[name].append(value)
            print("  ".join(f"{name} {value:.2f}" for name, value in row.items()), flush=True)
        med = {name: statistics.median(values) for name, values in cpu.items()}
        print("medians: " + "  ".join(f"{name} {value:.2f}" for name, value in med.items()))
        print(
            f"fleet - floor {med['fleet'] - med['floor']:.2f} ms (the fleet's own Python, the"
            " root's per-child spawn, dispatch and collect included);"
            f" floor - plain {med['floor'] - med['plain']:.2f} ms (three store round trips);"
            f" fleet / same {med['fleet'] / med['same']:.2f}x"
        )


if __name__ == "__main__":
    main()
