"""A loopback HTTP server standing in for an attacker's endpoint: it records every request.

It answers like an OpenAI-compatible server (`/chat/completions`) so a client that was
tricked into calling it gets a normal answer and the run goes on, as it would in the wild;
`redirect_to` makes it answer every GET with a 302 instead (for web_fetch's redirect hops).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SECRET = "sk-live-ATTACK-0123456789abcdef"
"""The value every secret-named variable gets in these tests; it must appear nowhere."""

SECRET_ENV = {
    "OPENAI_API_KEY": SECRET,
    "ANTHROPIC_API_KEY": SECRET + "-anthropic",
    "AWS_SECRET_ACCESS_KEY": SECRET + "-aws",
    "GH_PAT": SECRET + "-gh",
    "REDIS_PASS": SECRET + "-redis",
    "DB_PWD": SECRET + "-db",
    "SENTRY_DSN": f"https://{SECRET}@sentry.example/1",
}
"""Secrets as workers hold them, names the old name-based scrub did not all catch."""

COMPLETION = {
    "id": "chatcmpl-attacker",
    "object": "chat.completion",
    "model": "evil",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "done"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


@dataclass
class Attacker:
    """The server's address and what it saw."""

    url: str
    requests: list[dict[str, str]] = field(default_factory=list)
    redirect_to: str | None = None

    def saw(self, text: str) -> bool:
        """Whether `text` was in any request line, header or body it received."""
        return any(text in value for request in self.requests for value in request.values())


def _handler(attacker: Attacker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            headers = "\n".join(f"{k}: {v}" for k, v in self.headers.items())
            attacker.requests.append({"line": self.requestline, "headers": headers, "body": body})

        def _send(self, status: int, body: bytes, kind: str, **headers: str) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self._record()
            self._send(200, json.dumps(COMPLETION).encode(), "application/json")

        def do_GET(self) -> None:
            self._record()
            if attacker.redirect_to:
                self._send(302, b"", "text/plain", location=attacker.redirect_to)
            else:
                self._send(200, b"internal: metadata-token-xyz", "text/plain")

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: pytest treats stray output as noise

    return Handler


@contextmanager
def attacker_server(host: str = "127.0.0.1", port: int = 0) -> Iterator[Attacker]:
    """Serve on `host` (a loopback address), on a free port unless given, until the end."""
    attacker = Attacker(url="")
    server = ThreadingHTTPServer((host, port), _handler(attacker))
    attacker.url = f"http://{host}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield attacker
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def redis_text(client: Any) -> str:
    """Every key and value of the client's database as text, for "no secret anywhere"."""
    parts: list[str] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            values: list[Any] = [client.get(key)]
        elif kind == "hash":
            values = [*client.hgetall(key).items()]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind in ("set",):
            values = list(client.smembers(key))
        elif kind == "zset":
            values = client.zrange(key, 0, -1)
        elif kind == "stream":
            values = list(client.xrange(key))
        else:
            values = []
        parts.append(f"{key!r} {values!r}")
    return "\n".join(parts)


def leaked(text: str) -> list[str]:
    """The names of the secrets whose value appears in `text`."""
    return [name for name, value in SECRET_ENV.items() if value in text]


def live_processes_with(token: str) -> list[int]:
    """Host pids (not zombies) whose command line contains `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def none_left_with(token: str, timeout_s: float = 5.0) -> bool:
    """Wait (bounded) until no live process carries `token` in its command line."""
    deadline = time.monotonic() + timeout_s
    while live_processes_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


SHELL_UID = 65534
"""The uid bash runs as under a root worker without FLEET_SHELL_USER (`nobody`)."""


def shell_writable(path: Path) -> Path:
    """The folder `path` (made if missing), handed to the user bash runs as under root."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, SHELL_UID, SHELL_UID)
        path.chmod(0o755)
    return path


def world_writable(path: Path) -> Path:
    """The folder `path` (made if missing) and everything in it, writable by every user.

    For attack tests that must run on the old code too, where bash was root without
    capabilities (bound by permission bits) rather than `nobody`.
    """
    path.mkdir(parents=True, exist_ok=True)
    for entry in [path, *path.rglob("*")]:
        if not entry.is_symlink():
            entry.chmod(0o777 if entry.is_dir() else 0o666)
    return path


def processes_of(uid: int) -> int:
    """How many live processes (zombies too: they still hold a pid) have real uid `uid`."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        uids = [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")]
        count += uids == [str(uid)]
    return count


@contextmanager
def peak_processes(token: str) -> Iterator[list[int]]:
    """Count the processes carrying `token` in a thread while the block runs: [peak]."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):  # a scan takes ms; the processes live for seconds
            peak[0] = max(peak[0], len(live_processes_with(token)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
