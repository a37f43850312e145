"""A stop cuts a tool's own HTTP request in flight: the server sees the connection close.

`web_fetch` and `web_search` run in the tool thread a stop cuts (`fleet.loop.cut`), with the
run's cancel handle in their context; their httpx clients are armed as the model clients
are (`fleet.llm.transport.arm`), so the cut shuts the connection down at once. Without it
the abandoned thread held the request open to the tool's own timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import yaml

from fleet.inprocess import InProcessFleet
from fleet.llm.cancel import Cancel, cancelling
from fleet.settings import Settings
from fleet.testing import ScriptedModel, call, text
from fleet.tools.websearch.http import get
from tests.fleetkit import client, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers

pytestmark = pytest.mark.timeout(60)

BOUND_S = 3.0
"""Stop -> the server saw the connection close: ~0.1 s unloaded; the tool's timeout is 20 s."""
TOOL_TIMEOUT_S = 20.0


@dataclass
class Held:
    """One connection the server holds: when its request came and when the client left."""

    request: bytes = b""
    closed_at: float | None = None


@dataclass
class HangingServer:
    """Reads a request and answers nothing; notes when the client closes the connection."""

    url: str
    held: list[Held] = field(default_factory=list)


@contextmanager
def hanging_server() -> Iterator[HangingServer]:
    listener = socket.create_server(("127.0.0.1", 0))
    server = HangingServer(f"http://127.0.0.1:{listener.getsockname()[1]}")

    def hold(conn: socket.socket) -> None:
        held = Held()
        with conn:
            while b"\r\n\r\n" not in held.request:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                held.request += chunk
            server.held.append(held)
            while conn.recv(4096):  # nothing is sent back: wait for the client to go
                pass
            held.closed_at = time.monotonic()

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=hold, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server
    finally:
        listener.close()


def wait_for(check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_a_stop_closes_the_web_fetch_request_in_flight(tmp_path: Path) -> None:
    with hanging_server() as server:
        model = ScriptedModel([call("web_fetch", url=f"{server.url}/slow"), text("unused")])
        settings = Settings(
            workspace=tmp_path, web_allow=("127.0.0.1",), tool_timeout_s=TOOL_TIMEOUT_S
        )
        local = InProcessFleet.from_settings(settings, clients={"m": model})
        ended: list[str] = []
        runner = threading.Thread(
            target=lambda: ended.append(local.run("fetch it", model="m").status), daemon=True
        )
        runner.start()
        wait_for(lambda: server.held, 20)
        (held,) = server.held
        assert held.request.startswith(b"GET /slow ")
        (root,) = [t for t in local.store.list_traces(10) if t.parent_trace_id is None]
        stopped_at = time.monotonic()
        local.stop(root.trace_id)
        wait_for(lambda: held.closed_at is not None, TOOL_TIMEOUT_S / 2)
        runner.join(10)
    assert ended == ["stopped"]
    assert held.closed_at is not None, "the server never saw the request closed"
    assert held.closed_at - stopped_at < BOUND_S


def test_a_cancelled_search_request_is_closed_at_the_server() -> None:
    with hanging_server() as server:
        handle = Cancel()
        failed: list[BaseException] = []

        def search() -> None:
            with cancelling(handle):
                try:
                    get(f"{server.url}/search?q=x", {}, ("127.0.0.1",), TOOL_TIMEOUT_S)
                except BaseException as exc:  # the cut ends the call; what it raises is kept
                    failed.append(exc)

        thread = threading.Thread(target=search, daemon=True)
        thread.start()
        wait_for(lambda: server.held, 20)
        cancelled_at = time.monotonic()
        assert handle.cancel() == 1  # the one connection the call held
        thread.join(TOOL_TIMEOUT_S / 2)
        (held,) = server.held
        wait_for(lambda: held.closed_at is not None, 5)
    assert not thread.is_alive() and failed, "the cut call ended, with an error"
    assert held.closed_at is not None and held.closed_at - cancelled_at < BOUND_S


def test_a_fetch_outside_any_run_is_never_cut(tmp_path: Path) -> None:
    """No handle in its context: a cancel elsewhere cannot touch its connection."""
    from fleet.errors import ToolError
    from fleet.tools.base import ToolContext
    from fleet.tools.web import web_fetch

    with hanging_server() as server:
        other = Cancel()
        context = ToolContext(workspace=tmp_path, web_allow=("127.0.0.1",), tool_timeout_s=1.0)
        outcome: list[str] = []

        def fetch() -> None:
            try:
                web_fetch(context, f"{server.url}/x")
            except ToolError as exc:
                outcome.append(str(exc))

        thread = threading.Thread(target=fetch, daemon=True)
        started = time.monotonic()
        thread.start()
        wait_for(lambda: server.held, 20)
        assert other.cancel() == 0
        (held,) = server.held
        time.sleep(0.3)
        # Still open, or closed by its own timeout (1 s): a loaded machine may take longer
        # than that to get here, so the close is judged by when it came, not by whether.
        assert held.closed_at is None or held.closed_at >= started + 1.0, held.closed_at - started
        thread.join(10)
    assert outcome and "timed out" in outcome[0]


@pytest.mark.integration
def test_on_a_real_worker_fleet_stop_closes_the_web_fetch_request(
    redis_url: str, tmp_path: Path
) -> None:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with hanging_server() as server:
        fetch = {"name": "web_fetch", "arguments": {"url": f"{server.url}/slow"}}
        steps = [{"tool_calls": [fetch]}, {"content": "unused"}]
        brain = tmp_path / "brain.yaml"
        brain.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
        env = {
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_WEB_ALLOW": "127.0.0.1",
            "FLEET_TOOL_TIMEOUT_S": str(TOOL_TIMEOUT_S),
        }
        with start_worker(redis_url, concurrency=2, env_extra=env) as process:
            wait_for_workers(redis_url, [process.name], timeout_s=60)
            fleet = client(fleet_settings(redis_url, workspace, **env))
            handle = fleet.submit("fetch it", model=f"scripted:{brain}")
            wait_until(lambda: bool(server.held), 60, "the fetch at the server")
            (held,) = server.held
            stopped_at = time.monotonic()
            fleet.stop(handle.trace_id)
            wait_for(lambda: held.closed_at is not None, TOOL_TIMEOUT_S / 2)
            assert handle.wait(30).status == "stopped"
    assert held.closed_at is not None, "the server never saw the request closed"
    assert held.closed_at - stopped_at < BOUND_S
