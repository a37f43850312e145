"""A local fleet in the foreground (`fleet up`): Redis, worker processes, Flower.

State lives in a folder outside every workspace root (`Settings.fleet_state_dir`:
FLEET_STATE_DIR, else `$XDG_STATE_HOME/agent-fleet/<hash of the directory>`), made 0700:
`redis/` (the embedded Redis's append-only file), `logs/`, `up.lock` (held while a
`fleet up` runs for this directory) and `up.json` (what it started, 0600, so other
commands in this directory find its Redis: `discover_redis_url`). Agents can read and
write their workspace; the AOF holds every tree's task text and the logs name them, so
none of it may be there. The embedded Redis requires a fresh random password, given to it
on stdin and to the workers in their environment: never in an argv, a log line or a file
an agent can read.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import redis

from fleet.errors import ConfigError
from fleet.llm.scripted import EXAMPLE_SCRIPT
from fleet.observe.operator import operator_members
from fleet.runtime import operator_config
from fleet.security.trust import WORKSPACE_ROOTS_ENV, check_interpreter
from fleet.settings import Settings, process_env
from fleet.storage.backends.redis.connect import redact_url
from fleetops.discovery import (
    PING_TIMEOUT_S,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    UP_FILE,
    UpState,
    fleet_env,
    read_state,
    redis_answers,
)
from fleetops.doctor import check_broker, missing_keys, ping_workers
from fleetops.redis_server import start_redis_server
from fleetops.supervisor import (
    SUPERVISOR_PID_ENV,
    Child,
    die_with_parent,
    python_module,
    spawn,
    stop_all,
    supervise,
)

LOCK_FILE = "up.lock"
REDIS_DIR = "redis"
LOG_DIR = "logs"
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 60.0
"""How long `fleet up` waits for its workers to answer before saying so and going on."""
PASSWORD_BYTES = 32
"""Entropy of the embedded Redis's password (`secrets.token_urlsafe`)."""
STATE_DIR_ENV = "FLEET_STATE_DIR"
LEFTOVER_EXIT_TIMEOUT_S = 10.0
"""How long a new `fleet up` waits for the Redis of a killed one to finish shutting down."""

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


def check_port_free(port: int, what: str, host: str = LOOPBACK) -> None:
    """`ConfigError` if something listens on `host:port`."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"port {port} for {what} is busy: {exc.strerror or exc}") from None


def _write_state(state_dir: Path, state: UpState) -> None:
    # Owner-only: the Redis URL carries a password.
    path = state_dir / UP_FILE
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w") as out:
        out.write(state.model_dump_json(indent=2))
    temporary.replace(path)


def open_state_dir(settings: Settings, directory: Path) -> Path:
    """The state folder of the `fleet up` for `directory`: private, outside every root.

    Raises:
        ConfigError: it lies inside a workspace root (or holds one), or is not ours.
    """
    state_dir = settings.fleet_state_dir(directory).resolve()
    for root in settings.workspace_roots:
        if state_dir.is_relative_to(root) or root.is_relative_to(state_dir):
            raise ConfigError(
                f"state folder {str(state_dir)!r} overlaps workspace root {str(root)!r},"
                f" where agents read and write: set {STATE_DIR_ENV} to a folder outside"
                f" {WORKSPACE_ROOTS_ENV}"
            )
    home = settings.state_home.resolve()
    if state_dir.is_relative_to(home):
        _private_dir(home)  # first: the folders of every fleet of this user
    _private_dir(state_dir)
    return state_dir


def _private_dir(folder: Path) -> None:
    """Make `folder` (0700) or make it private; `ConfigError` if someone else owns it."""
    folder.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    info = folder.lstat()
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"state folder {str(folder)!r} belongs to uid {info.st_uid}, not to you:"
            f" set {STATE_DIR_ENV} to a folder of your own"
        )
    folder.chmod(PRIVATE_DIR_MODE)  # an older or hand-made one may be open to others


@contextmanager
def up_lock(state_dir: Path, directory: Path) -> Iterator[None]:
    """Hold `up.lock` (one `fleet up` per state folder); the OS releases it if we die."""
    with open(state_dir / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            state = read_state(state_dir)
            pid = f" (pid {state.pid}, Redis {redact_url(state.redis_url)})" if state else ""
            raise ConfigError(
                f"another `fleet up` is running for {directory} (state {state_dir}){pid}"
            ) from None
        try:
            yield
        finally:
            (state_dir / UP_FILE).unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_up(options: UpOptions, say: Say) -> int:
    """Start the fleet and keep it running until Ctrl-C/SIGTERM, then stop it all.

    A child that dies is restarted with backoff (`fleetops.supervisor`); its siblings go on.
    Returns 0 after a requested stop, 1 when a worker died before it ever got ready.

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
    directory = options.directory.resolve()
    settings = Settings.from_env(process_env())
    # Every worker would refuse to start (its code, FLEET_HOOKS): say it once, Redis unstarted.
    check_interpreter(settings.workspace_roots)
    operator_members(settings.hooks, settings.workspace_roots, settings.hook_timeout_s)
    state_dir = open_state_dir(settings, directory)
    stack.enter_context(up_lock(state_dir, directory))
    if options.flower:
        check_port_free(options.flower_port, "Flower")
    redis_url, redis_child = _open_redis(options, state_dir, stack, say, settings)
    settings = Settings.from_env({**settings.env, "FLEET_REDIS_URL": redis_url})
    if settings.broker_url != redis_url:  # FLEET_BROKER_URL: RabbitMQ, say
        check_broker(settings.broker_url, settings.redis_sentinel_master)
    child_env = _child_env(settings, state_dir)
    children: list[Child] = []
    stack.callback(stop_all, children)  # before Redis stops: workers ack on the way out
    workers = _start_workers(options, state_dir, child_env, children, say)
    flower_url = _start_flower(options, state_dir, child_env, children, say)

    def state(ready: bool) -> UpState:
        return UpState(
            pid=os.getpid(),
            directory=str(directory),
            redis_url=redis_url,
            embedded_redis_pid=redis_child.pid if redis_child else None,
            worker_pids=[c.pid for c in workers.values()],
            flower_url=flower_url,
            flower_pid=children[-1].pid if flower_url else None,
            started_at_ms=int(time.time() * 1000),
            ready=ready,
        )

    _write_state(state_dir, state(ready=False))
    if died := _wait_ready(settings, workers, say):
        say(died)
        return 1
    _say_ready(say, time.monotonic() - started_s, directory, state_dir, settings)
    _write_state(state_dir, state(ready=True))
    supervised = ([redis_child] if redis_child else []) + children
    supervise(supervised, say, on_restart=lambda: _write_state(state_dir, state(ready=True)))
    return 0  # not reached: supervise returns by KeyboardInterrupt


def _say_ready(
    say: Say, took_s: float, directory: Path, state_dir: Path, settings: Settings
) -> None:
    # Commands find this fleet by its directory, unless FLEET_STATE_DIR chose the folder.
    explicit = settings.state_dir is not None
    where = f"with the same {STATE_DIR_ENV}" if explicit else f"in {directory} or below"
    say(f"ready in {took_s:.1f} s; submit from another terminal ({where}) with:")
    say(f"  {example_run(settings)}")
    say(f"state in {state_dir}")
    for key in missing_keys(settings):  # the workers have this environment, not a later one
        say(f"warning: the workers have no {key}: export it and restart `fleet up` to use it")
    say("Ctrl-C stops everything started here; a process that dies is restarted")


def example_run(settings: Settings) -> str:
    """A `fleet run` that works as printed here, from any directory or installed wheel.

    The configured model, else the bundled scripted explore if these workers may load it.
    """
    try:
        configured = settings.model or operator_config(settings).default_model
    except ConfigError:  # the workers log what is wrong with fleet.yaml
        configured = None
    if configured:
        return 'fleet run "Survey this project"'
    if settings.allow_scripted:
        return f'FLEET_ALLOW_SCRIPTED=1 fleet run --model scripted:{EXAMPLE_SCRIPT} "Survey it"'
    return (
        'fleet run --model MODEL "..." (no model is configured: set FLEET_MODEL before'
        " `fleet up`, or FLEET_ALLOW_SCRIPTED=1 for the bundled scripted demo)"
    )


def _child_env(settings: Settings, state_dir: Path) -> dict[str, str]:
    """The environment of `fleet up`'s workers and Flower.

    A launcher's copy of this process's environment (`Settings.env`, read once by
    `fleet.settings`), pointed at this fleet: the children read their settings from it.
    """
    return {
        **fleet_env(settings),
        "PYTHONUNBUFFERED": "1",
        SUPERVISOR_PID_ENV: str(os.getpid()),
        STATE_DIR_ENV: str(state_dir),  # its file tools refuse it, whatever the roots say
    }


def _open_redis(
    options: UpOptions, state_dir: Path, stack: ExitStack, say: Say, settings: Settings
) -> tuple[str, Child | None]:
    """FLEET_REDIS_URL if it answers; else an embedded redis-server, supervised.

    The embedded one persists under the state folder's `redis/` (append-only, fsync every
    second), requires a random password, and is restarted on the same port, file and
    password if it dies.
    """
    env = settings.env
    url = env.get("FLEET_REDIS_URL")
    if url and redis_answers(url, sentinel_master=settings.redis_sentinel_master):
        say(f"redis     {redact_url(url)} (FLEET_REDIS_URL)")
        return url, None
    if url:
        say(f"redis     {redact_url(url)} does not answer: starting an embedded one")
    _wait_for_leftover_redis(state_dir)
    if options.redis_port is not None:
        check_port_free(options.redis_port, "Redis")
    start = partial(
        start_redis_server,
        data_dir=state_dir / REDIS_DIR,
        appendonly=True,
        preexec_fn=die_with_parent,
        password=secrets.token_urlsafe(PASSWORD_BYTES),
    )
    server = start(options.redis_port)

    def restart() -> subprocess.Popen[bytes]:
        return start(server.port).process  # the same port: workers reconnect to it

    child = Child("redis", restart, state_dir / REDIS_DIR / "redis-server.log", server.process)
    stack.callback(lambda: stop_all([child]))  # last: registered before the workers'
    url = redact_url(server.url)
    say(f"redis     {url} (embedded, pid {server.process.pid}, data {server.data_dir})")
    return server.url, child


def _wait_for_leftover_redis(state_dir: Path) -> None:
    """Two servers on one append-only file would corrupt it.

    The Redis of a `fleet up` that was killed gets SIGTERM from the kernel and shuts down
    within seconds: wait for that; refuse only if it still runs after
    `LEFTOVER_EXIT_TIMEOUT_S` (or its `fleet up` is somehow still alive).
    """
    state = read_state(state_dir)
    if state is None or state.embedded_redis_pid is None:
        return
    deadline = time.monotonic() + LEFTOVER_EXIT_TIMEOUT_S
    while _leftover_answers(state) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _leftover_answers(state):
        pid = state.embedded_redis_pid
        raise ConfigError(
            f"the embedded Redis of an earlier `fleet up` still runs on {state.redis_url}"
            f" (pid {pid}): stop it with `kill {pid}` first"
        )


def _leftover_answers(state: UpState) -> bool:
    client = redis.Redis.from_url(
        state.redis_url, socket_connect_timeout=PING_TIMEOUT_S, retry=None
    )
    try:
        return bool(client.info("server").get("process_id") == state.embedded_redis_pid)
    except redis.RedisError:
        return False
    finally:
        client.close()


def _start_workers(
    options: UpOptions, state_dir: Path, env: Mapping[str, str], children: list[Child], say: Say
) -> dict[str, Child]:
    """N `fleet worker` processes on all queues, keyed by their Celery node name."""
    host = socket.gethostname()
    workers: dict[str, Child] = {}
    for i in range(1, options.workers + 1):
        name = f"worker{i}.{os.getpid()}@{host}"
        log_path = state_dir / LOG_DIR / f"worker-{i}.log"
        argv = python_module("fleetops.cli.main", "worker", "--hostname", name)
        argv += ["--concurrency", str(options.concurrency)] if options.concurrency else []
        child = Child.launch(f"worker {i}", partial(spawn, argv, env, log_path), log_path)
        children.append(child)
        workers[name] = child
        say(f"worker {i:<3}{name} (pid {child.pid}, log {log_path})")
    return workers


def _start_flower(
    options: UpOptions, state_dir: Path, env: Mapping[str, str], children: list[Child], say: Say
) -> str | None:
    if not options.flower:
        return None
    log_path = state_dir / LOG_DIR / "flower.log"
    argv = python_module("fleetops.cli.main", "flower", "--port", str(options.flower_port))
    flower = Child.launch("flower", partial(spawn, argv, env, log_path), log_path)
    children.append(flower)
    url = f"http://{LOOPBACK}:{options.flower_port}"
    say(f"flower    {url} (pid {flower.pid}, log {log_path})")
    return url


def _wait_ready(settings: Settings, workers: dict[str, Child], say: Say) -> str | None:
    """Wait until every worker answers a ping; why not, if one died before it got ready.

    A worker that dies before it ever consumed is not restarted: that is a configuration
    problem (an import error, a bad queue), and its log says which.
    """
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = set(workers)
    while waiting and time.monotonic() < deadline:
        for child in workers.values():
            if died := child.death():
                return f"{died} (log {child.log_path})"
        master = settings.redis_sentinel_master
        waiting -= ping_workers(settings.broker_url, sentinel_master=master)
    if waiting:
        say(f"still waiting for {', '.join(sorted(waiting))} after {READY_TIMEOUT_S:.0f} s")
    return None
