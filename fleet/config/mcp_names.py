"""`mcp__SERVER__TOOL`: how an MCP tool is named, and which preset lets it through."""

from __future__ import annotations

from collections.abc import Collection

PREFIX = "mcp__"
"""Tools of MCP servers are named `mcp__SERVER__TOOL` (Claude Code's convention)."""


def tool_name(server: str, tool: str) -> str:
    """`mcp__SERVER__TOOL`."""
    return f"{PREFIX}{server}__{tool}"


def server_of(name: str) -> str | None:
    """The server part of an `mcp__SERVER__TOOL` name, else None."""
    if not name.startswith(PREFIX):
        return None
    server, sep, tool = name[len(PREFIX) :].partition("__")
    return server if sep and server and tool else None


def allows(name: str, servers: Collection[str] | None, tools: Collection[str] | None) -> bool:
    """Whether a preset with `mcp: servers` and `tools: tools` may call MCP tool `name`.

    The server must be listed (None: every declared one); `tools` narrows MCP tools only
    when it names some, so `explore`, whose `tools` are the built-in readers, keeps the
    read-only MCP tools.
    """
    server = server_of(name)
    if server is None or (servers is not None and server not in servers):
        return False
    named = {t for t in tools or () if t.startswith(PREFIX)}
    return not named or name in named
