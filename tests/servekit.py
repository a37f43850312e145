"""`fleet serve` for tests: the app in a thread, an SSE reader, the CLI as a process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import tornado.httpserver
import tornado.netutil

from fleet.client import Fleet
from fleet.inprocess import InProcessFleet
from fleet.lifecycle import stop_subtree
from fleet.limits.trees import Priority
from fleet.loop.runner import Runner, run_to_end
from fleet.models import Mode, Trace
from fleet.runtime import Runtime
from fleetops.serve import (
    api_approvals,
    api_control,
    api_experiences,
    api_memory,
    api_messages,
)
from fleetops.serve.app import SERVER_LIMITS, ServeConfig, make_app
from tests.fleetkit import wait_until


class LocalActions(InProcessFleet):
    """The page's actions run in this process (a reply runs the trace on at once)."""

    def stop(self, trace_id: str) -> list[str]:
        """As `Fleet.stop`, without a broker to revoke on."""
        return stop_subtree(self.runtime, trace_id)


class InlineBackend:
    """A `Fleet` backend that runs an enqueued trace in this thread, to its end or a wait."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def enqueue(self, trace: Trace, priority: Priority = "interactive") -> None:
        run_to_end(Runner(self.runtime), trace.trace_id)

    def revoke(self, stamps: list[str]) -> None:
        """Nothing is queued anywhere."""

    def queue(self, mode: Mode) -> str | None:
        return None


def page_config(actions: LocalActions, **options: Any) -> ServeConfig:
    """What `fleet serve` builds, over an in-process fleet: the page's actions and the
    approval and experience endpoints (those take the `Fleet` client)."""
    fleet = Fleet(actions.runtime, InlineBackend(actions.runtime))
    acting = (
        partial(api_experiences.routes, fleet),
        partial(api_approvals.routes, fleet),
        partial(api_memory.routes, fleet),
        partial(api_messages.routes, fleet),
        partial(api_control.routes, fleet),
    )
    return ServeConfig(store=actions.store, actions=actions, routes=acting, **options)


def csrf(http: httpx.Client) -> dict[str, str]:
    """The headers an action needs: the service's CSRF token."""
    return {"X-Fleet-CSRF": http.get("/api/session").json()["csrf"]}


@contextlib.contextmanager
def serving(config: ServeConfig) -> Iterator[str]:
    """The app on a free loopback port in a thread; yields its base URL."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        server = tornado.httpserver.HTTPServer(make_app(config), **SERVER_LIMITS)
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        state["port"] = sockets[0].getsockname()[1]
        state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
        started.set()
        await state["stop"].wait()
        server.stop()
        await server.close_all_connections()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "the server did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)


@dataclass(frozen=True)
class SseEvent:
    """One parsed Server-Sent Event."""

    id: str | None
    event: str | None
    data: dict[str, Any]


def read_sse(response: httpx.Response, count: int) -> list[SseEvent]:
    """The next `count` events of an open stream (comments skipped)."""
    events: list[SseEvent] = []
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:
            data = json.loads(fields["data"])
            events.append(SseEvent(fields.get("id"), fields.get("event"), data))
            if len(events) == count:
                return events
        fields = {}
    raise AssertionError(f"the stream ended after {len(events)} of {count} events")


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve_process(redis_url: str, *args: str, port: int | None = None, **env: str) -> Iterator[str]:
    """`fleet serve` as a real process (on a free port by default); yields its base URL."""
    with serve_process_pid(redis_url, *args, port=port, **env) as (url, _):
        yield url


@contextlib.contextmanager
def serve_process_pid(
    redis_url: str, *args: str, port: int | None = None, **env: str
) -> Iterator[tuple[str, int]]:
    """`serve_process`, yielding the process id too (to read its memory in /proc)."""
    port = port or free_port()
    environ = {k: v for k, v in os.environ.items() if k != "FLEET_SERVE_TOKEN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetops.cli.main", "serve", "--port", str(port), *args],
        env={**environ, "FLEET_REDIS_URL": redis_url, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"fleet serve exited: {process.stderr.read()!r}")  # type: ignore[union-attr]
        try:
            return httpx.get(url + "/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(answers, 90, "fleet serve to answer")  # a Python start on a loaded machine
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(15)
        if process.stderr is not None:
            process.stderr.close()
