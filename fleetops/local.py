"""A local fleet in the foreground (`fleet up`): Redis, worker processes, Flower.

State lives under `./.fleet/`: `redis/` (the embedded Redis's append-only file), `logs/`,
`up.lock` (held while a `fleet up` runs here) and `up.json` (what it started, so other
commands in this directory find its Redis: `discover_redis_url`).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from fleet.errors import ConfigError
from fleet.redis_server import start_redis_server
from fleet.redis_store import redact_url
from fleet.settings import Settings
from fleetops.discovery import (
    PING_TIMEOUT_S,
    STATE_DIR,
    UP_FILE,
    UpState,
    fleet_env,
    read_state,
    redis_answers,
)
from fleetops.doctor import check_broker, ping_workers

LOCK_FILE = "up.lock"
REDIS_DIR = "redis"
LOG_DIR = "logs"
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 60.0
"""How long `fleet up` waits for its workers to answer before saying so and going on."""
STOP_TIMEOUT_S = 10.0
"""Warm shutdown gets this long; then SIGKILL (the sweeper resumes what was cut off)."""
POLL_INTERVAL_S = 0.2
_PR_SET_PDEATHSIG = 1

Say = Callable[[str], None]


@dataclass(frozen=True)
class UpOptions:
    """What `fleet up` was asked for."""

    workers: int = 1
    concurrency: int | None = None
    flower: bool = False
    flower_port: int = 5555
    redis_port: int | None = None
    """Port of the embedded Redis; None picks a free one."""
    directory: Path = Path(".")


@dataclass
class Child:
    """A process `fleet up` started, in its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


def check_port_free(port: int, what: str, host: str = LOOPBACK) -> None:
    """`ConfigError` if something listens on `host:port`."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"port {port} for {what} is busy: {exc.strerror or exc}") from None


def _write_state(state_dir: Path, state: UpState) -> None:
    # Owner-only: an external FLEET_REDIS_URL may carry a password.
    path = state_dir / UP_FILE
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(state.model_dump_json(indent=2))
    temporary.replace(path)


@contextmanager
def up_lock(state_dir: Path) -> Iterator[None]:
    """Hold `up.lock` (one `fleet up` per directory); the OS releases it if we die."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            state = read_state(state_dir)
            pid = f" (pid {state.pid}, Redis {redact_url(state.redis_url)})" if state else ""
            raise ConfigError(f"another `fleet up` is running in {state_dir.parent}{pid}") from None
        try:
            yield
        finally:
            (state_dir / UP_FILE).unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM it when `fleet up` dies, even by SIGKILL.
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> Child:
    """Start `argv` in its own process group, output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # safe: `fleet up` runs no other threads
        )
    return Child(name, process, log_path)


def stop_all(children: list[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every child's group, wait up to `timeout_s` in all, SIGKILL the rest."""
    running = [c for c in children if c.process.poll() is None]
    for child in running:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in running:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)  # the leader is unreaped: the group is ours
            child.process.wait()


def _signal_group(child: Child, signum: int) -> None:
    try:
        os.killpg(child.process.pid, signum)
    except ProcessLookupError:
        pass


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a log, joined on one line."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(text[-lines:]) or "empty log"


def run_up(options: UpOptions, say: Say) -> int:
    """Start the fleet, supervise it until Ctrl-C/SIGTERM or a child dies, stop it all.

    Returns 0 after a requested stop, 1 when a child died on its own.

    Raises:
        ConfigError: a busy port, another `fleet up` here, or Redis would not start.
    """
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    stack = ExitStack()
    try:
        return _start_and_supervise(options, stack, say)
    except KeyboardInterrupt:
        say("stopping")
        return 0
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut cleanup short
        stack.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _start_and_supervise(options: UpOptions, stack: ExitStack, say: Say) -> int:
    started_s = time.monotonic()
    state_dir = (options.directory / STATE_DIR).resolve()
    stack.enter_context(up_lock(state_dir))
    if options.flower:
        check_port_free(options.flower_port, "Flower")
    redis_url, redis_pid = _open_redis(options, state_dir, stack, say)
    settings = Settings.from_env({**os.environ, "FLEET_REDIS_URL": redis_url})
    if settings.broker_url != redis_url:
        check_broker(settings.broker_url)  # FLEET_BROKER_URL: RabbitMQ, say
    env = {**fleet_env(settings), "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    stack.callback(stop_all, children)  # before Redis stops: workers ack on the way out
    workers = _start_workers(options, state_dir, env, children, say)
    flower_url = _start_flower(options, state_dir, env, children, say)
    state = UpState(
        pid=os.getpid(),
        redis_url=redis_url,
        embedded_redis_pid=redis_pid,
        worker_pids=[c.process.pid for c in workers.values()],
        flower_url=flower_url,
        flower_pid=children[-1].process.pid if flower_url else None,
        started_at_ms=int(time.time() * 1000),
    )
    _write_state(state_dir, state)
    if died := _wait_ready(settings.broker_url, workers, say):
        say(died)
        return 1
    say(f"ready in {time.monotonic() - started_s:.1f} s; submit from another terminal with:")
    submit = 'fleet run --model scripted:examples/explore.yaml "..."'
    say(f"  FLEET_REDIS_URL={redact_url(redis_url)} {submit}")
    say("Ctrl-C stops everything started here")
    _write_state(state_dir, state.model_copy(update={"ready": True}))
    return _supervise(children, say)


def _open_redis(
    options: UpOptions, state_dir: Path, stack: ExitStack, say: Say
) -> tuple[str, int | None]:
    """FLEET_REDIS_URL if it answers, else an embedded redis-server persisting under `.fleet/`."""
    url = os.environ.get("FLEET_REDIS_URL")
    if url and redis_answers(url):
        say(f"redis     {redact_url(url)} (FLEET_REDIS_URL)")
        return url, None
    if url:
        say(f"redis     {redact_url(url)} does not answer: starting an embedded one")
    _refuse_leftover_redis(state_dir)
    if options.redis_port is not None:
        check_port_free(options.redis_port, "Redis")
    server = start_redis_server(options.redis_port, state_dir / REDIS_DIR, appendonly=True)
    stack.callback(server.stop)
    say(f"redis     {server.url} (embedded, pid {server.process.pid}, data {server.data_dir})")
    return server.url, server.process.pid


def _refuse_leftover_redis(state_dir: Path) -> None:
    """Two servers on one append-only file would corrupt it: refuse if a killed run left one."""
    state = read_state(state_dir)
    if state is None or state.embedded_redis_pid is None:
        return
    client = redis.Redis.from_url(
        state.redis_url, socket_connect_timeout=PING_TIMEOUT_S, retry=None
    )
    try:
        pid = client.info("server").get("process_id")
    except redis.RedisError:
        return
    finally:
        client.close()
    if pid == state.embedded_redis_pid:
        raise ConfigError(
            f"the embedded Redis of an earlier `fleet up` still runs on {state.redis_url}"
            f" (pid {pid}): stop it with `kill {pid}` first"
        )


def _start_workers(
    options: UpOptions, state_dir: Path, env: Mapping[str, str], children: list[Child], say: Say
) -> dict[str, Child]:
    """N `fleet worker` processes on all queues, keyed by their Celery node name."""
    host = socket.gethostname()
    workers: dict[str, Child] = {}
    for i in range(1, options.workers + 1):
        name = f"worker{i}.{os.getpid()}@{host}"
        log_path = state_dir / LOG_DIR / f"worker-{i}.log"
        argv = [sys.executable, "-m", "fleetops.cli.main", "worker", "--hostname", name]
        argv += ["--concurrency", str(options.concurrency)] if options.concurrency else []
        child = spawn(f"worker {i}", argv, env, log_path)
        children.append(child)
        workers[name] = child
        say(f"worker {i:<3}{name} (pid {child.process.pid}, log {log_path})")
    return workers


def _start_flower(
    options: UpOptions, state_dir: Path, env: Mapping[str, str], children: list[Child], say: Say
) -> str | None:
    if not options.flower:
        return None
    log_path = state_dir / LOG_DIR / "flower.log"
    argv = [sys.executable, "-m", "fleetops.cli.main", "flower", "--port", str(options.flower_port)]
    flower = spawn("flower", argv, env, log_path)
    children.append(flower)
    url = f"http://{LOOPBACK}:{options.flower_port}"
    say(f"flower    {url} (pid {flower.process.pid}, log {log_path})")
    return url


def _wait_ready(broker_url: str, workers: dict[str, Child], say: Say) -> str | None:
    """Wait until every worker answers a ping; returns why not if one of them died."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = set(workers)
    while waiting and time.monotonic() < deadline:
        if died := _first_death(list(workers.values())):
            return died
        waiting -= ping_workers(broker_url)
    if waiting:
        say(f"still waiting for {', '.join(sorted(waiting))} after {READY_TIMEOUT_S:.0f} s")
    return None


def _first_death(children: list[Child]) -> str | None:
    for child in children:
        code = child.process.poll()
        if code is not None:
            return (
                f"{child.name} (pid {child.process.pid}) exited with code {code}:"
                f" {log_tail(child.log_path)} (log {child.log_path})"
            )
    return None


def _supervise(children: list[Child], say: Say) -> int:
    """Block until a signal (KeyboardInterrupt) or a child's death (exit 1)."""
    while (died := _first_death(children)) is None:
        time.sleep(POLL_INTERVAL_S)
    say(died)
    return 1
