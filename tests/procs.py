"""Real worker processes for integration tests: start, find their pool children, kill them.

with start_worker(redis_url, concurrency=4) as worker:
    wait_for_workers(redis_url, [worker.name], timeout_s=30)
    os.kill(worker.child_pids()[0], signal.SIGKILL)   # prefork: one pool process
    worker.kill()                                    # or the whole worker at once
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from celery import Celery

from workers.app import QUEUES

STOP_TIMEOUT_S = 15.0
PING_TIMEOUT_S = 0.5
_names = itertools.count(1)


class WorkerProcess:
    """A `celery worker` subprocess in its own process group (the group id is its pid)."""

    def __init__(self, process: subprocess.Popen[bytes], name: str, log_path: Path) -> None:
        self.process = process
        self.name = name
        """The Celery node name, as `ping` and `inspect` report it."""
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def child_pids(self) -> list[int]:
        """Direct children (the prefork pool processes), from a scan of /proc/*/stat."""
        return children_of(self.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole worker, pool children included, as a lost machine would."""
        _signal_group(self.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the group if it takes longer."""
        if self.process.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.pid, signal.SIGKILL)  # stragglers of the group, if any
        self.process.wait()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if exc_type is None:  # kept after a failure, for its log
            self.log_path.unlink(missing_ok=True)


def start_worker(
    redis_url: str,
    broker_url: str | None = None,
    queues: Iterable[str] = QUEUES,
    pool: str = "threads",
    concurrency: int = 8,
    env_extra: Mapping[str, str] | None = None,
    name: str | None = None,
    python: str = sys.executable,
    cwd: Path | None = None,
) -> WorkerProcess:
    """Start `python -m workers` (`celery worker`'s options) on these URLs; output to a log file.

    Without mingle and gossip, as `fleet worker` starts them (`fleetops.cli.ops.worker_argv`
    says why). Use it as a context manager (or call `stop`) so the process never outlives
    the test. `python` and `cwd`: another release's interpreter, started outside this
    checkout (`python -m` puts the working directory first on `sys.path`).
    """
    name = name or f"test{next(_names)}.{os.getpid()}@{socket.gethostname()}"
    env = {
        **os.environ,
        "FLEET_REDIS_URL": redis_url,
        "FLEET_BROKER_URL": broker_url or redis_url,
        "PYTHONUNBUFFERED": "1",
        **(env_extra or {}),
    }
    argv = [python, "-m", "workers", "-Q", ",".join(queues), "-P", pool, "-E"]
    argv += ["-c", str(concurrency), "-n", name, "--loglevel", "INFO"]
    argv += ["--without-mingle", "--without-gossip"]
    fd, log_name = tempfile.mkstemp(prefix="fleet-worker-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(process, name, Path(log_name))


def wait_for_workers(
    app_or_url: Celery | str,
    count_or_names: int | Iterable[str],
    timeout_s: float = 30.0,
) -> set[str]:
    """Poll `ping` until `count` workers (or all of `names`) answer; their names.

    Raises:
        TimeoutError: the deadline passed first; the message says who answered.
    """
    wanted = count_or_names if isinstance(count_or_names, int) else set(count_or_names)
    deadline = time.monotonic() + timeout_s
    answered: set[str] = set()
    while time.monotonic() < deadline:
        answered = ping(app_or_url, limit=wanted if isinstance(wanted, int) else len(wanted))
        if isinstance(wanted, int) and len(answered) >= wanted:
            return answered
        if isinstance(wanted, set) and wanted <= answered:
            return answered
    raise TimeoutError(f"after {timeout_s} s only {sorted(answered)} answered; wanted {wanted}")


def ping(
    app_or_url: Celery | str, timeout_s: float = PING_TIMEOUT_S, limit: int | None = None
) -> set[str]:
    """Node names answering one broadcast ping (within `timeout_s`, or once `limit` did)."""
    if not isinstance(app_or_url, str):
        return _names_of(app_or_url.control.ping(timeout=timeout_s, limit=limit))
    app = Celery("fleet-tests-ping", broker=app_or_url, set_as_current=False)
    try:
        return _names_of(app.control.ping(timeout=timeout_s, limit=limit))
    finally:
        app.close()


def _names_of(replies: list[dict[str, Any]] | None) -> set[str]:
    return {name for reply in replies or [] for name in reply}


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid` (Linux: the 4th field of /proc/PID/stat)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited meanwhile
        # The command name (2nd field) may hold spaces: parse after its closing paren.
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def read_until_exit(controller: int, process: subprocess.Popen[bytes], timeout_s: float) -> str:
    """Everything a child wrote to its pseudo-terminal (`controller`), once it has exited."""
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    process.wait(timeout=timeout_s)
    return b"".join(chunks).decode(errors="replace")
