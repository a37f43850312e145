"""How a declared server is reached: a child process on stdio, or streamable HTTP."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fleet.errors import ConfigError
from fleet.mcp.config import McpServerConfig


def server_env(server: str, config: McpServerConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The variables a stdio server starts with, from the operator's entry alone.

    The SDK adds its few safe defaults (PATH, HOME, USER, SHELL, TERM, LOGNAME); nothing
    else of the worker's environment reaches the server, secrets least of all.

    Raises:
        ConfigError: a worker variable named in `env` is not set.
    """
    values = dict(config.env_values)
    for name, variable in config.env.items():
        if variable not in env:
            raise ConfigError(f"MCP server {server!r}: env {name!r}: {variable} is not set")
        values[name] = env[variable]
    return values


def http_headers(server: str, config: McpServerConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The headers of an HTTP server, read from the worker variables the operator named.

    Raises:
        ConfigError: a named variable is not set.
    """
    headers = {}
    for header, variable in config.headers_env.items():
        if variable not in env:
            raise ConfigError(f"MCP server {server!r}: header {header!r}: {variable} is not set")
        headers[header] = env[variable]
    return headers


@contextlib.asynccontextmanager
async def open_transport(
    server: str, config: McpServerConfig, env: Mapping[str, str]
) -> AsyncIterator[tuple[Any, Any]]:
    """The read and write streams of a session with `server`."""
    if config.command is not None:
        from mcp import StdioServerParameters

        from fleet.mcp.stdio import capped_stdio

        params = StdioServerParameters(
            command=config.command,
            args=list(config.args),
            env=server_env(server, config, env),
            cwd=config.cwd,
        )
        with open(os.devnull, "w") as errlog:  # a server's stderr is not the worker's log
            async with capped_stdio(params, errlog) as streams:  # answers capped as read
                yield streams
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    assert config.url is not None  # one of command or url, checked with the config
    headers = http_headers(server, config, env)
    async with httpx2.AsyncClient(headers=headers, timeout=30.0) as client:
        async with streamable_http_client(config.url, http_client=client) as streams:
            yield streams
