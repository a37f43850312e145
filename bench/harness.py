"""What the benchmark runs on: worker processes, the fake provider, and its meters."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis

from tests.procs import WorkerProcess, wait_for_workers
from workers.app import QUEUES, app

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.01
RUN_TIMEOUT_S = 600.0
SAMPLE_S = 0.05
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@contextmanager
def workers(
    env: Mapping[str, str], pool: str, concurrency: int, count: int
) -> Iterator[list[WorkerProcess]]:
    """`count` worker processes on every fleet queue, with the bench's peer tasks loaded."""
    full_env = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
    }
    started: list[WorkerProcess] = []
    with ExitStack() as stack:
        for i in range(count):
            name = f"bench{i}.{os.getpid()}@{socket.gethostname()}"
            argv = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker"]
            imports = ",".join(["bench.sleep_tasks", "bench.peer_tasks", *_extra_imports()])
            argv += ["-I", imports, "-Q", ",".join(QUEUES), "-E"]
            argv += ["-P", pool, "-c", str(concurrency), "-n", name, "--loglevel", "WARNING"]
            log_path = Path(tempfile.mkstemp(prefix="bench-worker-", suffix=".log")[1])
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(stack.enter_context(WorkerProcess(process, name, log_path)))
        wait_for_workers(app, [w.name for w in started], timeout_s=60)
        yield started


def _extra_imports() -> list[str]:
    """`BENCH_WORKER_IMPORTS` (comma-separated modules): probes a worker should load too."""
    return [m for m in os.environ.get("BENCH_WORKER_IMPORTS", "").split(",") if m]


@contextmanager
def openai_server() -> Iterator[str]:
    """`bench.openai_server` in its own process; yields its base URL (`.../v1`)."""
    argv = [sys.executable, "-m", "bench.openai_server", "--port", "0"]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if not line.startswith("listening on "):
            raise RuntimeError(f"bench.openai_server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[-1])}/v1"
    finally:
        process.terminate()
        process.wait(timeout=10)


class Meter:
    """Counts Redis commands over a block, minus the ones this bench sent to poll."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.polls = 0

    def total(self) -> int:
        stats = self.client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    def redis_cpu_s(self) -> float:
        """CPU seconds the redis-server process has used (user + system, all threads)."""
        cpu = self.client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def redis_bytes(self) -> int:
        """Memory Redis holds for data (`used_memory`)."""
        return int(self.client.info("memory")["used_memory"])

    def wait(self, done: Callable[[], float | None], timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Poll `done` (one Redis command) until it returns an end time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.polls += 1
            end = done()
            if end is not None:
                return end
            time.sleep(POLL_S)
        raise TimeoutError(f"run did not finish in {timeout_s} s")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def rss_bytes(pid: int) -> int:
    """Resident set size of a process now."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_BYTES


class Usage:
    """Worker CPU over a block, and the peak of the workers' summed RSS above the start."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.cpu_s = 0.0
        self.rss_start = 0
        self.rss_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Usage:
        self.rss_start = self.rss_peak = sum(rss_bytes(p) for p in self.pids)
        self._cpu_start = sum(cpu_s(p) for p in self.pids)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_s = sum(cpu_s(p) for p in self.pids) - self._cpu_start

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.rss_peak = max(self.rss_peak, sum(rss_bytes(p) for p in self.pids))


def quiesce(client: redis.Redis) -> None:
    """Wait until every queue is empty, then a little more for trailing bookkeeping."""
    while any(client.llen(q) for q in QUEUES):
        time.sleep(0.05)
    time.sleep(0.3)


def load() -> str:
    """The load averages, as `uptime` shows them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
