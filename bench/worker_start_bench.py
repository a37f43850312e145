"""CPU a worker spends from exec to ready, started each way the fleet starts one.

python bench/worker_start_bench.py [--repeat R] [--quick]

Each round starts every row's worker once, in turn, on one redis-server: the worker is
ready when it answers a `ping` by name; its CPU (user + system, from /proc) is read then,
and it is stopped before the next row starts. The table gives each row's median CPU
seconds and wall seconds to ready, and the CPU's ratio to its baseline:

- `python -m celery -A workers.app:app worker` (baseline): the umbrella `celery` command;
- `python -m workers`: Celery's `worker` command alone (`workers.start`), same options;
- `fleet worker` through `app.worker_main` (baseline of the next row): the command as it
  was, its handler's last step swapped back to `app.worker_main(["worker", ...])`;
- `fleet worker`: as shipped (`workers.start`).

Every row runs a threads pool of 8 on the four queues with task events, without mingle
and gossip (as `fleet worker` and the test suite start workers since session 5; with
mingle the `fleet worker` rows took 2.05 s to ready, without it 1.05 s). The target:
`python -m workers` <= 0.5x the baseline's CPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import count
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import load  # noqa: E402
from bench.report import machine  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.procs import ping  # noqa: E402
from workers.app import QUEUES  # noqa: E402

BIN = Path(sys.executable).parent
TARGET_RATIO = 0.5
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_runs = count(1)

WORKER_OPTIONS = ["-Q", ",".join(QUEUES), "-P", "threads", "-c", "8", "-E"]
TEST_OPTIONS = [*WORKER_OPTIONS, "--loglevel", "INFO", "--without-mingle", "--without-gossip"]
FLEET_OPTIONS = ["worker", "-P", "threads", "-c", "8", "--loglevel", "INFO"]
OLD_FLEET_WORKER = """
import sys
from workers import start
from workers.app import app

start.main = lambda argv: int(app.worker_main(["worker", *argv]) or 0)
from fleetops.cli.main import main

sys.exit(main(sys.argv[1:]))
"""
"""`fleet worker` with its handler's last call as it was before `workers.start`."""


@dataclass(frozen=True)
class Row:
    """How one row starts a worker: the command before the node name, and its flag."""

    argv: list[str]
    name_flag: str
    baseline: str | None
    """The row this one is compared with (None: it is a baseline)."""


def rows() -> dict[str, Row]:
    """The four ways to start a worker, each baseline before the row it is compared with."""
    celery = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", *TEST_OPTIONS]
    module = [sys.executable, "-m", "workers", *TEST_OPTIONS]
    old_fleet = [sys.executable, "-c", OLD_FLEET_WORKER, *FLEET_OPTIONS]
    return {
        "celery -A workers.app:app worker": Row(celery, "-n", None),
        "python -m workers": Row(module, "-n", "celery -A workers.app:app worker"),
        "fleet worker (app.worker_main)": Row(old_fleet, "--hostname", None),
        "fleet worker": Row(
            [str(BIN / "fleet"), *FLEET_OPTIONS], "--hostname", "fleet worker (app.worker_main)"
        ),
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its reaped children, from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / _TICKS_PER_S  # utime stime cutime cstime


def start_once(row: Row, env: dict[str, str], redis_url: str) -> tuple[float, float]:
    """CPU seconds and wall seconds of one worker from exec to its first ping answer."""
    name = f"bench{next(_runs)}.{os.getpid()}@{socket.gethostname()}"
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            [*row.argv, row.name_flag, name],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wall_s = wait_ready(process, name, redis_url, started)
            return cpu_s(process.pid), wall_s
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read()[-2000:].decode(errors="replace"))
            raise
        finally:
            stop(process)


def wait_ready(process: subprocess.Popen[bytes], name: str, redis_url: str, t0: float) -> float:
    """Wall seconds from `t0` until worker `name` answers a ping; RuntimeError if it exits."""
    deadline = t0 + READY_TIMEOUT_S
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"worker {name} exited {process.returncode} before it was ready")
        if name in ping(redis_url, timeout_s=0.1, limit=1):
            return time.perf_counter() - t0
    raise RuntimeError(f"worker {name} not ready after {READY_TIMEOUT_S} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown of the worker's process group, SIGKILL if it lingers."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()


def environment(tmp: Path, redis_url: str) -> dict[str, str]:
    """This environment with the fleet's Redis and a workspace outside the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    return env | {
        "FLEET_REDIS_URL": redis_url,
        "FLEET_BROKER_URL": redis_url,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


Samples = dict[str, list[tuple[float, float]]]


def measure(repeat: int, env: dict[str, str], redis_url: str) -> Samples:
    """(CPU s, wall s) of each row per round, the rows alternated in each round."""
    samples: Samples = {name: [] for name in rows()}
    for _ in range(repeat):
        for name, row in rows().items():
            samples[name].append(start_once(row, env, redis_url))
    return samples


def report(samples: Samples) -> bool:
    """Print the table and the verdict; whether `python -m workers` met its target."""
    cpu = {name: statistics.median(c for c, _ in runs) for name, runs in samples.items()}
    print(f"{'command':<36} {'CPU s':>7} {'wall s':>7} {'CPU x baseline':>15}")
    for name, row in rows().items():
        wall = statistics.median(w for _, w in samples[name])
        ratio = f"{cpu[name] / cpu[row.baseline]:.2f}" if row.baseline else "baseline"
        print(f"{name:<36} {cpu[name]:>7.2f} {wall:>7.2f} {ratio:>15}")
    ratio = cpu["python -m workers"] / cpu["celery -A workers.app:app worker"]
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"target: python -m workers <= {TARGET_RATIO}x celery worker CPU: {ratio:.2f}x {verdict}")
    return ratio <= TARGET_RATIO


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the table; exit 1 if the target was missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = parser.parse_args(argv)
    repeat = 5 if args.quick else args.repeat
    print(f"# {machine()}\n# {repeat} rounds, medians; load average before: {load()}")
    with start_redis_server() as server, tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp:
        samples = measure(repeat, environment(Path(tmp), server.url), server.url)
    print(f"# load average after: {load()} (other processes share these cores)")
    return 0 if report(samples) else 1


if __name__ == "__main__":
    sys.exit(main())
