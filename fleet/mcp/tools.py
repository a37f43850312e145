"""Each declared server's tools as registry entries named `mcp__SERVER__TOOL`.

Everything a server sends is untrusted data: its descriptions and schemas are capped and
go only into the tool list, its results only into tool results, never into a system
prompt. Whether a tool may run under a read-only ceiling is the server's `readOnlyHint`
or the operator's `read_only:` list, and the registry refuses it where it runs.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from fleet.config.mcp_names import tool_name
from fleet.mcp.sessions import CONNECT_TIMEOUT_S, ERROR_CHARS, McpSessions
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.registry import ToolRegistry, ToolSpec

if TYPE_CHECKING:
    import mcp

MAX_RESULT_CHARS = 1_000_000
"""A result longer than this is refused outright; shorter ones are cut to the tool limit."""
MAX_DESCRIPTION_CHARS = 2_000
MAX_SCHEMA_CHARS = 20_000
RETRY_LISTING_S = 30.0
"""A server that failed to start or list is tried again after this long, not every turn."""
FIRST_LISTING_WAIT_S = 5.0
"""How long one turn waits for a server's first listing (once per server and process)."""
_log = logging.getLogger(__name__)
_sync_lock = threading.Lock()


def sync(
    registry: ToolRegistry,
    sessions: McpSessions,
    servers: Collection[str] | None = None,
    *,
    need: str | None = None,
) -> None:
    """Bring the registry's MCP tools up to date; cheap when nothing changed.

    Listings are cached per server; `tools/list_changed` (or a restart) clears one and
    sets `sessions.changed`, and the next call here lists that server again, in the
    background: until the new listing arrives the last good one is served. A turn waits
    only for the first listing of a server it may use (`servers`, None: every one), at
    most `FIRST_LISTING_WAIT_S` and once per server and process; a call of a server's
    tool that is not listed yet waits for that server (`need`) up to `CONNECT_TIMEOUT_S`.
    """
    if not sessions.changed.is_set():
        return
    with _sync_lock:
        pending = _start(sessions)
        waited = [
            future
            for server, (future, _) in pending.items()
            if need is None
            and (servers is None or server in servers)
            and sessions.first_wait(server)
        ]
    if need in pending:
        concurrent.futures.wait([pending[need][0]], CONNECT_TIMEOUT_S)
    elif waited:
        concurrent.futures.wait(waited, FIRST_LISTING_WAIT_S)
    with _sync_lock:
        for server, (future, version) in pending.items():
            if future.done():
                _register(registry, sessions, server, future, version)
        sessions.changed.clear()  # set again by a change from now on, or below
        if set(sessions.names) - sessions.registered:
            sessions.changed.set()  # a listing runs, or a failed server waits out its pause


Listing = tuple["concurrent.futures.Future[list[mcp.Tool]]", int]


def _start(sessions: McpSessions) -> dict[str, Listing]:
    """Each due server's listing (started now, or still running), with the version it lists."""
    pending: dict[str, Listing] = {}
    for server in sessions.names:
        if sessions.due(server):
            version = sessions.versions.get(server, 0)
            pending[server] = (sessions.start_listing(server), version)
    return pending


def _register(
    registry: ToolRegistry,
    sessions: McpSessions,
    server: str,
    future: concurrent.futures.Future[list[mcp.Tool]],
    version: int,
) -> None:
    """A listing that ended: its tools into the registry, or a pause before the next try."""
    try:
        listed = future.result()
    except Exception as exc:  # one broken server must not take the others' tools
        _log.warning("MCP server %r: no tools: %s", server, _one_line(exc))
        sessions.listing_ended(server, listed=False)
        sessions.listing_failed(server, time.monotonic() + RETRY_LISTING_S)
        return  # its last good listing, if it had one, stays
    sessions.listing_ended(server, listed=True)
    specs = [spec for tool in listed if (spec := _spec(sessions, server, tool))]
    registry.replace_group(tool_name(server, ""), specs)
    if sessions.versions.get(server, 0) == version:  # else it changed meanwhile
        sessions.registered.add(server)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:ERROR_CHARS]


def _spec(sessions: McpSessions, server: str, tool: mcp.Tool) -> ToolSpec | None:
    name = tool_name(server, tool.name)
    schema = tool.input_schema
    problem = _problem(name, schema)
    if problem:
        _log.warning("MCP server %r: tool %r left out: %s", server, tool.name[:80], problem)
        return None
    hints = tool.annotations
    read_only = (
        bool(hints and hints.read_only_hint) or tool.name in sessions.config(server).read_only
    )
    description = (tool.description or tool.title or tool.name)[:MAX_DESCRIPTION_CHARS]
    return ToolSpec(
        name=name,
        description=f"(MCP server {server!r}) {description}",
        parameters=schema,
        read_only=read_only,
        fn=_caller(sessions, server, tool.name, read_only),
        bounded=True,  # `McpSessions.call` ends at `tool_timeout_s` itself
        open_arguments=True,
    )


def _problem(name: str, schema: Any) -> str | None:
    if len(name) > 64 or not all(ch.isalnum() or ch in "_-" for ch in name):
        return "its name is not a valid tool name (letters, digits, _ and -, 64 at most)"
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its input schema is not of type object"
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        return f"its input schema is longer than {MAX_SCHEMA_CHARS} characters"
    return None


def _caller(
    sessions: McpSessions, server: str, tool: str, read_only: bool
) -> Callable[..., ToolResult]:
    def call(ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        result = sessions.call(server, tool, arguments, ctx.tool_timeout_s, retry_closed=read_only)
        return to_tool_result(tool_name(server, tool), result)

    return call


def to_tool_result(name: str, result: mcp.types.CallToolResult) -> ToolResult:
    """Text as text, images and audio as a short placeholder, structured content as JSON.

    The registry cuts the output to the tool output limit; a result past
    `MAX_RESULT_CHARS` is refused whole.
    """
    parts = [_block_text(block) for block in result.content]
    if result.structured_content is not None and not any(
        getattr(block, "type", "") == "text" for block in result.content
    ):
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    output = "\n".join(parts)
    if len(output) > MAX_RESULT_CHARS:
        return ToolResult(
            title=f"{name} refused",
            output=f"refused: the server's result has {len(output)} characters"
            f" (the most accepted is {MAX_RESULT_CHARS})",
            is_error=True,
        )
    return ToolResult(title=name, output=output, is_error=bool(result.is_error))


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        size = len(block.data) * 3 // 4
        return f"[{kind} {block.mime_type}, {size} bytes: not shown]"
    if kind == "resource_link":
        return f"[resource link {block.uri}]"
    if kind == "resource":
        text = getattr(block.resource, "text", None)
        return str(text) if text is not None else f"[binary resource {block.resource.uri}]"
    return f"[{kind or 'unknown'} content: not shown]"
