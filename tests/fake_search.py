"""Local search APIs speaking SearXNG's and Brave's wire formats, for web_search tests.

    with FakeSearch("searxng", RESULTS) as server:
        ... fleet.yaml: search: {provider: searxng, base_url: server.url} ...
        server.requests   # (path with query, headers) of every request

SearXNG answers `GET /search?q=...&format=json` with `{"query", "results": [{title, url,
content}]}`; Brave answers `GET /res/v1/web/search?q=...&count=N` with `{"type": "search",
"web": {"results": [{title, url, description}]}}` and, like the real API, 401 without the
right `X-Subscription-Token`. `mode` turns it hostile: an error echoing the key, a huge or
malformed or deeply nested body.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import yaml

from fleet.inprocess import InProcessFleet
from fleet.models import text_of
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, calls, text

Kind = Literal["searxng", "brave"]
Mode = Literal["ok", "echo_key", "huge", "malformed", "nested", "wrong_shape", "throttle"]
BRAVE_PATH = "/res/v1/web/search"


@dataclass(frozen=True)
class Hit:
    """One result the server returns."""

    title: str
    url: str
    snippet: str


@dataclass
class FakeSearch:
    """The server; see the module docstring."""

    kind: Kind
    hits: list[Hit]
    key: str = ""
    """Brave: the X-Subscription-Token it accepts."""
    host: str = "127.0.0.1"
    mode: Mode = "ok"
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """SearXNG: the instance's address; Brave: the full endpoint."""
        assert self._server is not None
        base = f"http://{self.host}:{self._server.server_address[1]}"
        return base + BRAVE_PATH if self.kind == "brave" else base

    def __enter__(self) -> FakeSearch:
        self._server = ThreadingHTTPServer((self.host, 0), _handler_for(self))
        self._server.daemon_threads = True
        serve = partial(self._server.serve_forever, poll_interval=0.01)
        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def answer(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """Status and body for one GET."""
        self.requests.append((path, headers))
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        if self.mode != "ok":
            return _hostile(self.mode, self.key)
        if self.kind == "brave":
            if headers.get("x-subscription-token") != self.key:
                return 401, json.dumps(
                    {"type": "ErrorResponse", "error": {"code": "AUTH"}}
                ).encode()
            count = int(query.get("count", ["20"])[0])
            results = [
                {"title": h.title, "url": h.url, "description": h.snippet} for h in self.hits
            ]
            body: dict[str, Any] = {"type": "search", "web": {"results": results[:count]}}
            return 200, json.dumps(body).encode()
        if parts.path != "/search" or query.get("format") != ["json"]:
            return 403, b"json format not enabled"
        results = [{"title": h.title, "url": h.url, "content": h.snippet} for h in self.hits]
        body = {"query": query["q"][0], "number_of_results": len(results), "results": results}
        return 200, json.dumps(body).encode()


def _hostile(mode: Mode, key: str) -> tuple[int, bytes]:
    if mode == "echo_key":  # an error page quoting the request's token back
        detail = f"Invalid X-Subscription-Token: {key} (Authorization: Bearer {key})"
        return 422, json.dumps({"type": "ErrorResponse", "error": {"detail": detail}}).encode()
    if mode == "huge":
        filler = [{"title": "x" * 1000, "url": "https://a.example/", "content": "y"}] * 3000
        return 200, json.dumps({"results": filler}).encode()
    if mode == "malformed":
        return 200, b'{"results": [{"title": "cut'
    if mode == "nested":
        return 200, b"[" * 200_000 + b"]" * 200_000
    if mode == "throttle":
        return 429, b'{"error": "slow down"}'
    return 200, json.dumps({"results": "not a list"}).encode()


def _handler_for(fake: FakeSearch) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body = fake.answer(self.path, headers)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: pytest treats stray output as noise

    return Handler


@dataclass(frozen=True)
class ToolOutcome:
    """One tool result of a run: whether it was an error, and its text."""

    name: str
    is_error: bool
    content: str


def run_calls(
    tmp_path: Path,
    config: dict[str, Any],
    tool_calls: list[tuple[str, dict[str, Any]]],
    *,
    env: dict[str, str] | None = None,
    store: TraceStore | None = None,
    preset: str = "default",
    agents_dir: Path | None = None,
) -> tuple[list[ToolOutcome], InProcessFleet, str]:
    """A main agent that makes `tool_calls` in one turn, under this fleet.yaml.

    Returns each tool result, the fleet and the root trace id. The config file and the
    workspace are separate folders under `tmp_path` (a config in a workspace is refused).
    """
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    config_path = tmp_path / "fleet.yaml"
    config_path.write_text(yaml.safe_dump(config))
    settings_env = {
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_CONFIG": str(config_path),
        **({"FLEET_AGENTS_DIR": str(agents_dir)} if agents_dir else {}),
        **(env or {}),
    }
    model = ScriptedModel([calls(*tool_calls), text("searched")])
    local = InProcessFleet.from_settings(
        Settings.from_env(settings_env), store=store, clients={"m": model}
    )
    trace = local.run("look it up", model="m", preset=preset)
    tools = [m for m in local.store.messages(trace.trace_id) if m.role == "tool"]
    outcomes = [
        ToolOutcome(m.name or "", bool(m.metadata.get("is_error")), text_of(m.content))
        for m in tools
    ]
    return outcomes, local, trace.trace_id
