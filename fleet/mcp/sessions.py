"""The process's MCP sessions: one per declared server, reused by every trace it runs.

The runner is synchronous and the SDK is async, so one asyncio loop runs in a daemon
thread and callers hand it coroutines. Each server's session is entered and left by one
owner task (the SDK's transports are anyio context managers that must exit in the task
that entered them); calls from any thread share it. A server whose connection closed is
started again by the next call.

A slow or hostile server holds up only what uses it:
- a listing (`tools/list`) runs in the background (`start_listing`), bounded by
  `CONNECT_TIMEOUT_S`, and holds no lock a call needs; `fleet.mcp.tools.sync` decides
  who waits for it;
- every message is capped while it is read (`fleet.mcp.transport`): a too-big answer is
  that call's error and the session goes on;
- a call its run's stop cuts (`fleet.llm.cancel`) ends at once, its server told it is cancelled;
- a call that times out makes the session prove it is alive (`ping` within
  `PING_TIMEOUT_S`); a wedged one is dropped and the next call starts the server again
  (its other calls in flight end as `McpUnavailable`, read-only ones retried once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.config.mcp import McpServerConfig
from fleet.errors import ToolError
from fleet.llm import cancel

if TYPE_CHECKING:  # the SDK is imported only once a server is used
    import mcp

CONNECT_TIMEOUT_S = 30.0
"""Start, handshake and first listing of a server."""
CLOSE_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 5.0
"""A session whose call timed out must answer a ping this fast, or it is restarted."""
ERROR_CHARS = 200
"""Of a server's error message, what a tool result quotes."""
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class McpUnavailable(ToolError):
    """A server could not be started, or its connection closed during a call."""


@dataclass
class _Link:
    """One live session and the event that tells its owner task to close it."""

    session: mcp.ClientSession
    stop: asyncio.Event
    owner: asyncio.Task[None]
    closed: bool = False


@dataclass
class _Server:
    config: McpServerConfig
    link: _Link | None = None
    tools: list[mcp.Tool] | None = None
    """The last `tools/list`; None until listed or after `tools/list_changed`."""
    starts: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    listing: concurrent.futures.Future[list[mcp.Tool]] | None = None
    """The listing in flight, if one is."""
    listed: bool = False
    """A listing of this server succeeded once in this process."""
    waited: bool = False
    """A turn has waited for this server's first listing (no later turn waits for it)."""


class McpSessions:
    """One session per declared MCP server, started on first use.

    Args:
        servers: The operator's `mcp_servers`.
        env: The worker's environment: only the variables `env`/`headers_env` name are read.
    """

    def __init__(self, servers: Mapping[str, McpServerConfig], env: Mapping[str, str]) -> None:
        _quiet_sdk_logs()
        self._configs = dict(servers)
        self._env = dict(env)
        self._servers: dict[str, _Server] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.changed = threading.Event()
        """Set when a server's tool list changed (or was never read): `sync` re-reads it."""
        self.changed.set()
        self.registered: set[str] = set()
        """Servers whose current listing is in the registry (`fleet.mcp.tools.sync`)."""
        self.versions: dict[str, int] = {}
        """Per server, how many times its tool list changed: a listing read while it
        changed again is not taken as current."""
        self._retry_at: dict[str, float] = {}

    @property
    def names(self) -> list[str]:
        """The declared servers."""
        return list(self._configs)

    def config(self, server: str) -> McpServerConfig:
        """The operator's entry for `server`."""
        return self._configs[server]

    def starts(self, server: str) -> int:
        """How many times `server` was started in this process (restarts included)."""
        state = self._servers.get(server)
        return state.starts if state is not None else 0

    def due(self, server: str) -> bool:
        """Whether `sync` should list `server`: changed, and not in a retry pause."""
        return server not in self.registered and time.monotonic() >= self._retry_at.get(server, 0)

    def listing_failed(self, server: str, retry_at: float) -> None:
        """`server` could not be listed: leave it alone until `retry_at` (monotonic)."""
        self._retry_at[server] = retry_at

    def list_tools(self, server: str, timeout_s: float = CONNECT_TIMEOUT_S) -> list[mcp.Tool]:
        """The server's tools, from the cache unless `tools/list_changed` cleared it."""
        return self._run(self._list(server), timeout_s)

    def start_listing(self, server: str) -> concurrent.futures.Future[list[mcp.Tool]]:
        """The server's listing, running in the background (one at a time per server).

        It ends within `CONNECT_TIMEOUT_S` (start and handshake included), with the tools
        or the reason there are none; nobody has to wait for it.
        """
        state = self._state(server)
        if state.listing is None:  # else running, or ended and not yet taken (`listing_ended`)
            bounded = asyncio.wait_for(self._list(server), CONNECT_TIMEOUT_S)
            state.listing = asyncio.run_coroutine_threadsafe(bounded, self._ensure_loop())
        return state.listing

    def listing_ended(self, server: str, listed: bool) -> None:
        """Record how `server`'s last listing ended (`listed`: it gave the tools)."""
        state = self._state(server)
        state.listing = None
        state.listed = state.listed or listed

    def first_wait(self, server: str) -> bool:
        """Whether a turn should wait for `server`'s listing: never listed, never waited.

        True once per server and process: a server whose first listing hangs costs one
        turn at most `FIRST_LISTING_WAIT_S` (`fleet.mcp.tools`), and no turn after it.
        """
        state = self._state(server)
        if state.listed or state.waited:
            return False
        state.waited = True
        return True

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        timeout_s: float,
        *,
        retry_closed: bool = False,
    ) -> mcp.types.CallToolResult:
        """`tools/call`, bounded by `timeout_s` (starting the server counts too).

        `retry_closed`: a call that finds the connection closed (the server died since
        the last call) starts the server again and is sent once more. Only for read-only
        tools: a writing call may have run before its server died.

        Raises:
            McpUnavailable: the server could not be reached or closed mid-call.
            ToolError: the call timed out or the server answered with a protocol error.
        """
        call = self._call(server, tool, arguments, timeout_s, retry_closed)
        return self._run(call, timeout_s)

    def close(self) -> None:
        """Close every session and stop the loop thread."""
        with self._lock:
            loop, self._loop = self._loop, None
            thread, self._thread = self._thread, None
        if loop is None or thread is None:
            return
        closing = asyncio.run_coroutine_threadsafe(self._close_all(), loop)
        with contextlib.suppress(Exception):
            closing.result(CLOSE_TIMEOUT_S * 2)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()

    def _run(self, coro: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
        """`coro` on the sessions' loop; the calling run's cut (`fleet.llm.cancel`) ends it."""
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        with cancel.abandoning(future.cancel):
            try:
                return future.result(timeout_s + 1.0)  # the coroutine times itself out first
            except TimeoutError:
                future.cancel()
                raise ToolError(f"MCP call did not finish within {timeout_s:g}s") from None
            except concurrent.futures.CancelledError:
                raise ToolError("MCP call abandoned: its run was stopped or interrupted") from None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="mcp-sessions", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _state(self, server: str) -> _Server:
        state = self._servers.get(server)
        if state is None:
            state = self._servers[server] = _Server(self._configs[server])
        return state

    async def _list(self, server: str) -> list[mcp.Tool]:
        state = self._state(server)
        if state.tools is not None:
            return state.tools
        async with state.lock:  # for the session only: a hanging listing blocks no call
            session = await self._session(server, state)
        version = self.versions.get(server, 0)
        listed = list((await asyncio.wait_for(session.list_tools(), CONNECT_TIMEOUT_S)).tools)
        if self.versions.get(server, 0) == version:  # else it changed meanwhile: not cached
            state.tools = listed
        return listed

    async def _call(
        self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float, retry: bool
    ) -> mcp.types.CallToolResult:
        state = self._state(server)
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    return await self._call_once(server, state, tool, arguments)
                except McpUnavailable:
                    if not retry:
                        raise
                    return await self._call_once(server, state, tool, arguments)
        except TimeoutError:
            link = state.link
            if link is not None:  # is it the tool, or the whole session? (in the background)
                asyncio.get_running_loop().create_task(self._check_alive(server, state, link))
            raise ToolError(f"MCP tool {tool!r} did not finish within {timeout_s:g}s") from None

    async def _check_alive(self, server: str, state: _Server, link: _Link) -> None:
        """Drop the session if it does not answer a ping: the next call starts it again."""
        try:
            await asyncio.wait_for(link.session.send_ping(), PING_TIMEOUT_S)
        except Exception as exc:  # any answer, an error included, says it reads and writes
            if not isinstance(exc, TimeoutError):
                return
            async with state.lock:
                if state.link is link:
                    _log.warning("MCP server %r does not answer a ping: restarted", server)
                    await self._drop(state)

    async def _call_once(
        self, server: str, state: _Server, tool: str, arguments: dict[str, Any]
    ) -> mcp.types.CallToolResult:
        from mcp.shared.exceptions import MCPError

        async with state.lock:
            session = await self._session(server, state)
        try:
            return await session.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.error.code != _connection_closed():
                message = " ".join(exc.error.message.split())[:ERROR_CHARS]
                raise ToolError(f"MCP server {server!r}: {message}") from None
            async with state.lock:
                if state.link is not None and state.link.session is session:
                    await self._drop(state)  # the next call starts it again
            raise McpUnavailable(
                f"MCP server {server!r} closed the connection; it starts again on the next call"
            ) from None
        except Exception as exc:  # the SDK could not read the answer: never quote it
            raise ToolError(
                f"MCP server {server!r} sent a malformed answer ({type(exc).__name__})"
            ) from None

    async def _session(self, server: str, state: _Server) -> mcp.ClientSession:
        """The live session, started (again) when there is none or it closed."""
        if state.link is not None and not state.link.closed:
            return state.link.session
        await self._drop(state)
        state.starts += 1
        ready: asyncio.Future[mcp.ClientSession] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        owner = asyncio.create_task(self._own(server, state.config, ready, stop))
        try:
            session = await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT_S)
        except (Exception, asyncio.CancelledError) as exc:
            stop.set()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise McpUnavailable(f"MCP server {server!r} could not be started: {exc}") from None
        state.link = _Link(session, stop, owner)
        if state.starts > 1:
            self.tools_changed(server)  # a new process may offer other tools
        return session

    async def _own(
        self,
        server: str,
        config: McpServerConfig,
        ready: asyncio.Future[mcp.ClientSession],
        stop: asyncio.Event,
    ) -> None:
        """Enter the transport and the session, hand the session out, wait for `stop`."""
        from mcp import ClientSession

        from fleet.mcp.transport import open_transport

        try:
            async with open_transport(server, config, self._env) as (read, write):
                handler = _Notifications(server, self)
                async with ClientSession(read, write, message_handler=handler) as session:
                    await session.initialize()
                    ready.set_result(session)
                    await stop.wait()
        except Exception as exc:  # reported to the caller waiting on `ready`
            if not ready.done():
                ready.set_exception(_plain(exc))
            else:
                _log.info("MCP server %r session ended: %s", server, _plain(exc))

    async def _drop(self, state: _Server) -> None:
        link, state.link = state.link, None
        if link is None:
            return
        link.closed = True
        link.stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(link.owner, CLOSE_TIMEOUT_S)

    async def _close_all(self) -> None:
        for state in self._servers.values():
            await self._drop(state)

    def tools_changed(self, server: str) -> None:
        """`notifications/tools/list_changed`: the next `sync` lists `server` again."""
        state = self._servers.get(server)
        if state is not None:
            state.tools = None
        self.versions[server] = self.versions.get(server, 0) + 1
        self.registered.discard(server)
        self.changed.set()


class _Notifications:
    """The session's `message_handler`: only `tools/list_changed` matters here."""

    def __init__(self, server: str, sessions: McpSessions) -> None:
        self.server = server
        self.sessions = sessions

    async def __call__(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.sessions.tools_changed(self.server)


def _connection_closed() -> int:
    from mcp_types import CONNECTION_CLOSED

    return int(CONNECTION_CLOSED)


def _plain(exc: BaseException) -> BaseException:
    """The first leaf of an exception group: what the operator needs to read."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _NoServerText(logging.Filter):
    """Keeps the SDK's line about an unreadable message, drops the traceback quoting it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def _quiet_sdk_logs() -> None:
    # The stdio transport logs a server's unparsable line with its text: a server's output
    # may carry anything (a secret it read), and the worker's log is no place for it.
    stdio = logging.getLogger("mcp.client.stdio")
    if not any(isinstance(f, _NoServerText) for f in stdio.filters):
        stdio.addFilter(_NoServerText())
