"""How fast the `fleet` command starts, beside `celery --help` and a bare interpreter.

python bench/cli_bench.py [--repeat R] [--quick] [--no-fleet]

Each round runs every command once, in turn, so they share the machine's load; the table
gives each command's median wall time and its ratio to `celery --help`:

- `python -c pass`: the floor any Python command starts from;
- `fleet --help` and `celery --help`: the two console scripts, parsing only;
- `fleet run --inline` of one scripted completion (no Redis, no worker);
- `fleet run` of the same completion through a local fleet: its own redis-server and one
  thread-pool worker process, started once before the rounds (`--no-fleet` skips them).

The issue-23 target: `fleet --help` <= 0.35x `celery --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import load, workers  # noqa: E402
from bench.report import machine  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from workers.app import app  # noqa: E402

BIN = Path(sys.executable).parent
TARGET_HELP_RATIO = 0.35
RUN_TIMEOUT_S = 120.0


def timed(argv: Sequence[str], env: dict[str, str]) -> float:
    """Wall seconds of one process; RuntimeError (with its stderr) if it fails."""
    start = time.perf_counter()
    done = subprocess.run(
        list(argv), env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
    return seconds


def one_completion_model(tmp: Path) -> str:
    """A scripted model that answers once: the run is start-up, one turn, and the report."""
    path = tmp / "hello.json"
    path.write_text(json.dumps({"scripts": [{"match": ".*", "steps": [{"content": "hello"}]}]}))
    return f"scripted:{path}"


def environment(tmp: Path, redis_url: str | None) -> dict[str, str]:
    """This environment with a workspace, scripted models allowed, and the fleet's Redis."""
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_WORKSPACE": str(workspace), "FLEET_ALLOW_SCRIPTED": "1"}
    env["FLEET_WORKSPACE_ROOTS"] = str(workspace)  # not the checkout: fleet code is no root
    if redis_url:
        env |= {"FLEET_REDIS_URL": redis_url, "FLEET_BROKER_URL": redis_url}
    return env


Row = tuple[list[str], dict[str, str]]
"""A command line and its environment."""


def commands(model: str, env: dict[str, str], fleet_env: dict[str, str] | None) -> dict[str, Row]:
    """Each row's command line; `--inline` without Redis, the fleet run on `fleet_env`."""
    fleet = str(BIN / "fleet")
    rows = {
        "python -c pass": ([sys.executable, "-c", "pass"], env),
        "fleet --help": ([fleet, "--help"], env),
        "celery --help": ([str(BIN / "celery"), "--help"], env),
        "fleet run --inline (1 completion)": (
            [fleet, "run", "--inline", "--model", model, "say hello"],
            env,
        ),
    }
    if fleet_env is not None:
        argv = [fleet, "run", "--model", model, "say hello"]
        rows["fleet run (1 completion, fleet)"] = (argv, fleet_env)
    return rows


def measure(rows: dict[str, Row], repeat: int) -> dict[str, float]:
    """Median seconds of each row over `repeat` rounds, the rows alternated in each round."""
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeat):
        for name, (argv, env) in rows.items():
            samples[name].append(timed(argv, env))
    return {name: statistics.median(values) for name, values in samples.items()}


def report(medians: dict[str, float], with_fleet: bool) -> bool:
    """Print the table and the verdict; whether `fleet --help` met its target."""
    celery = medians["celery --help"]
    print(f"{'command':<36} {'median s':>9} {'x celery --help':>16}")
    for name, seconds in medians.items():
        print(f"{name:<36} {seconds:>9.3f} {seconds / celery:>16.2f}")
    if not with_fleet:
        print("fleet run (1 completion, fleet): skipped (--no-fleet)")
    ratio = medians["fleet --help"] / celery
    verdict = "PASS" if ratio <= TARGET_HELP_RATIO else "FAIL"
    print(f"target: fleet --help <= {TARGET_HELP_RATIO}x celery --help: {ratio:.2f}x {verdict}")
    return ratio <= TARGET_HELP_RATIO


def with_local_fleet(stack: ExitStack, tmp: Path) -> dict[str, str]:
    """A redis-server and one worker process on it; the environment that reaches them."""
    server = stack.enter_context(start_redis_server())
    env = environment(tmp, server.url)
    app.conf.broker_url = app.conf.result_backend = server.url  # the worker ping's app
    stack.enter_context(workers(env, "threads", 4, 1))
    return env


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the table; exit 1 if `fleet --help` missed its target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--no-fleet", action="store_true", help="skip the run through a fleet")
    args = parser.parse_args(argv)
    repeat = 5 if args.quick else args.repeat
    print(f"# {machine()}\n# {repeat} rounds, medians; load average before: {load()}")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cli-bench-")))
        fleet_env = None if args.no_fleet else with_local_fleet(stack, tmp)
        rows = commands(one_completion_model(tmp), environment(tmp, None), fleet_env)
        medians = measure(rows, repeat)
    print(f"# load average after: {load()} (other processes share these cores)")
    return 0 if report(medians, not args.no_fleet) else 1


if __name__ == "__main__":
    sys.exit(main())
