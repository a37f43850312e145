"""How a declared server is reached: a child process on stdio, or streamable HTTP."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fleet.config.mcp import McpServerConfig
from fleet.errors import ConfigError


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

    from fleet.mcp.stdio import MESSAGE_MAX_BYTES

    assert config.url is not None  # one of command or url, checked with the config
    headers = http_headers(server, config, env)
    # Answers capped while read: a JSON body by the transport below, an SSE event by the SDK.
    capped = capped_transport(httpx2.AsyncHTTPTransport(), MESSAGE_MAX_BYTES)
    async with httpx2.AsyncClient(headers=headers, timeout=30.0, transport=capped) as client:
        async with streamable_http_client(
            config.url, http_client=client, max_sse_event_size=MESSAGE_MAX_BYTES
        ) as streams:
            yield streams


def capped_transport(inner: Any, max_bytes: int) -> Any:
    """An httpx2 transport whose JSON answers end in `httpx2.StreamError` past `max_bytes`.

    The SDK reads a JSON answer whole (`aread`) and turns a `StreamError` into that
    request's error: the call fails in one line, the session goes on.
    """
    import httpx2

    class TooBig(httpx2.StreamError):
        """An answer past the cap (its text names no content)."""

    class Capped(httpx2.AsyncByteStream):
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            read_bytes = 0
            async for chunk in self._stream:
                read_bytes += len(chunk)
                if read_bytes > max_bytes:
                    raise TooBig(f"answer over {max_bytes} bytes refused")
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    class Transport(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            response = await inner.handle_async_request(request)
            if response.headers.get("content-type", "").startswith("application/json"):
                response.stream = Capped(response.stream)
            return response

        async def aclose(self) -> None:
            await inner.aclose()

    return Transport()
