"""What the fault-injection suite (`bench/faults.py`) puts its faults into.

A Redis with its append-only file (restartable on the same port and file), a TCP proxy in
front of it that can be cut (an unreachable broker and store), worker processes started as
an operator would (`fleet worker`), a local OpenAI-wire server that fails a share of its
completions on purpose, and the checks that say whether a run lost or duplicated anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from pathlib import Path
from typing import Any

from fleet.models import Trace
from fleet.storage.store import TraceStore
from fleetops.redis_server import RedisServer, free_port, start_redis_server

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.05


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `check` until true; `TimeoutError` naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_S)


# -- Redis, restartable --------------------------------------------------------------


class Redis:
    """A redis-server with `appendonly yes` (fsync every second) on a fixed port and file."""

    def __init__(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="fleet-faults-redis-"))
        self.server: RedisServer = start_redis_server(None, self.data_dir, appendonly=True)
        self.port = self.server.port

    @property
    def url(self) -> str:
        """Database 0."""
        return self.server.url

    def restart(self) -> float:
        """A clean restart (SIGTERM flushes the file), then up again; seconds it was away."""
        started_s = time.monotonic()
        self.server.stop()
        self.server = start_redis_server(self.port, self.data_dir, appendonly=True)
        return time.monotonic() - started_s

    def close(self) -> None:
        """Stop it and remove its files."""
        self.server.stop()
        self.server.owns_data_dir = True
        self.server.stop()


# -- a TCP proxy that can be cut -------------------------------------------------------


class CutProxy:
    """Forwards 127.0.0.1:`port` to a target port, until `cut`.

    `cut` drops every connection and refuses new ones (an unreachable host); `restore`
    listens again on the same port.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def url(self) -> str:
        """Database 0 through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def restore(self) -> None:
        """Accept connections again."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(512)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Close the listener and every forwarded connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            doomed, self._sockets = self._sockets, set()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


# -- workers ---------------------------------------------------------------------------


@dataclass
class Worker:
    """A `fleet worker` process in its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        """Its pid (and process group id)."""
        return self.process.pid

    def signal(self, signum: int) -> None:
        """Signal the whole group (pool children included)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL, as a lost machine."""
        self.signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """Warm shutdown, SIGKILL after 15 s."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        """Everything it logged."""
        return self.log_path.read_text(errors="replace")


_names = count(1)


def start_worker(
    env: dict[str, str], concurrency: int = 8, launcher: tuple[str, ...] = ()
) -> Worker:
    """`fleet worker` on every queue, as an operator runs it.

    `launcher`: a module that runs the CLI's module for it (`bench.memtrace OUT_DIR`).
    """
    name = f"faults{next(_names)}.{os.getpid()}@{socket.gethostname()}"
    module = ["-m", *launcher, "fleetops.cli.main"] if launcher else ["-m", "fleetops.cli.main"]
    argv = [sys.executable, *module, "worker", "-n", name]
    argv += ["-c", str(concurrency), "-l", "INFO"]
    fd, log_name = tempfile.mkstemp(prefix="fleet-faults-worker-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Worker(name, process, Path(log_name))


def wait_consuming(store: TraceStore, names: list[str], timeout_s: float = 90.0) -> None:
    """Until every named worker's heartbeat says it consumes fleet.explore."""
    wait_for(
        lambda: set(names) <= set(store.live_consumers("fleet.explore")),
        timeout_s,
        f"workers {names} to consume",
    )


# -- an OpenAI-wire provider that fails on purpose --------------------------------------


class ClientsMayLeave(ThreadingHTTPServer):
    """A provider's server: a client that closed its request (a stop cuts a model call,
    `fleet.llm.cancel`) is normal, not a traceback on the harness's output."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FlakyProvider:
    """`/v1/chat/completions` answering an explore like the scripted survey model.

    A root asks for `agent(task=[...N branches])`, then summarises; a branch looks around
    `turns` times (`list_dir`), then answers. `failure_rate` of the calls answer 500, 503 or
    429 at random instead; with `down` every call answers 503.
    """

    def __init__(
        self, branches: int, turns: int, latency_s: float, failure_rate: float = 0.0
    ) -> None:
        self.branches, self.turns, self.latency_s = branches, turns, latency_s
        self.failure_rate = failure_rate
        self.down = False
        self.calls = 0
        self.failures = 0
        self._ids = count(1)
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                status, headers, body = provider.respond(json.loads(self.rfile.read(length)))
                self.send_response(status)
                for name, value in [*headers, ("content-type", "application/json")]:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ClientsMayLeave(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        """What fleet.yaml's provider points at."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def config(self, directory: Path) -> Path:
        """A fleet.yaml with this provider as model `flaky`."""
        path = directory / "fleet.yaml"
        path.write_text(
            json.dumps(
                {
                    "providers": {"flaky": {"kind": "openai", "base_url": self.base_url}},
                    "models": {"flaky": {"provider": "flaky", "name": "flaky-1"}},
                }
            )
        )
        return path

    def respond(self, body: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        """Status, extra headers and body for one request."""
        time.sleep(self.latency_s)
        with self._lock:
            self.calls += 1
            failing = self.down or random.random() < self.failure_rate
            self.failures += failing
        if failing:
            status = 503 if self.down else random.choice([500, 503, 429])
            headers = [("retry-after-ms", "100")] if status == 429 else []
            return status, headers, json.dumps({"error": {"message": "injected"}}).encode()
        message = self._answer(body.get("messages") or [])
        reply = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        return 200, [], json.dumps(reply).encode()

    def _answer(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        looks = sum(1 for m in messages if m.get("role") == "tool")
        if task.startswith("Branch"):
            if looks < self.turns:
                return self._call("list_dir", {"path": "." if looks % 2 else "./"})
            return {"role": "assistant", "content": f"done: {task}"}
        if looks:
            return {"role": "assistant", "content": "summary"}
        tasks = [f"Branch {i} of the survey" for i in range(1, self.branches + 1)]
        return self._call("agent", {"task": tasks})

    def _call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = {
            "id": f"call_{next(self._ids)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def survey_model(path: Path, branches: int, turns: int, latency_ms: int) -> str:
    """A scripted explore: each branch looks around `turns` times, then answers."""
    look = [{"tool_calls": [{"name": "list_dir", "arguments": {"path": p}}]} for p in ("./", ".")]
    steps = [look[i % 2] for i in range(turns)] + [{"content": "done: {task}"}]
    tasks = [f"Branch {i} of the survey" for i in range(1, branches + 1)]
    explore = {"tool_calls": [{"name": "agent", "arguments": {"task": tasks}}]}
    scripts = [
        {"match": "^Branch", "steps": steps},
        {"match": ".*", "steps": [explore, {"content": "summary: {last_tool}"}]},
    ]
    path.write_text(json.dumps({"latency_ms": latency_ms, "scripts": scripts}))
    return f"scripted:{path}"


# -- what a run left behind ------------------------------------------------------------


@dataclass(frozen=True)
class TreeCheck:
    """How a finished (or abandoned) explore looks in the store."""

    completed: bool
    """The root completed and every branch completed, each collected once."""
    duplicated: int
    """Tool results beyond one per tool call, over the whole tree."""
    extra_turns: int
    """Model turns written beyond what the script has (a write from a runner fenced out)."""
    detail: str


def check_tree(store: TraceStore, root_id: str, branches: int, turns: int) -> TreeCheck:
    """Count what is missing and what is doubled in a root and its branches."""
    root = store.get_trace(root_id)
    kids = [store.get_trace(c) for c in store.children(root_id)]
    duplicated = sum(_duplicates(store, t) for t in [root, *kids])
    extra = sum(max(0, _turns(store, k) - (turns + 1)) for k in kids)
    extra += max(0, _turns(store, root) - 2)
    collaborators = store.collaborators(root_id)
    completed = (
        root.status == "completed"
        and len(kids) == branches
        and all(k.status == "completed" for k in kids)
        and len({c.trace_id for c in collaborators}) == branches
        and all(c.status == "completed" for c in collaborators)
    )
    bad = [f"{k.name}:{k.status}" for k in kids if k.status != "completed"]
    detail = f"root {root.status} ({root.error or ''}) {' '.join(bad)}".strip()
    return TreeCheck(completed, duplicated, extra, detail)


def _duplicates(store: TraceStore, trace: Trace) -> int:
    ids = [m.tool_call_id for m in store.messages(trace.trace_id) if m.role == "tool"]
    return len(ids) - len(set(ids))


def _turns(store: TraceStore, trace: Trace) -> int:
    return sum(1 for m in store.messages(trace.trace_id) if m.role == "assistant")


@contextlib.contextmanager
def temporary_directory() -> Iterator[Path]:
    """A workspace for one scenario."""
    with tempfile.TemporaryDirectory(prefix="fleet-faults-") as name:
        yield Path(name)
