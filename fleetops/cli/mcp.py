"""`fleet mcp`: the fleet as an MCP server, on stdio or streamable HTTP (fleetops.mcp_server)."""

from __future__ import annotations

import argparse
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fleet.errors import ConfigError
from fleetops.cli.args import is_loopback
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.serve import MIN_TOKEN_CHARS, TOKEN_ENV

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def mcp_token(address: str, token: str | None) -> str | None:
    """The bearer token HTTP clients must send; required beyond loopback.

    Raises:
        ConfigError: a non-loopback address without a token, or a token too short.
    """
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters")
    if token is None and not is_loopback(address):
        raise ConfigError(f"fleet mcp on {address!r} would be open to the network: set {TOKEN_ENV}")
    return token


class BearerGate:
    """ASGI middleware: HTTP requests without `Authorization: Bearer <token>` get a 401."""

    def __init__(self, app: App, token: str) -> None:
        """Guard `app` with `token`."""
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorised HTTP requests (and lifespan events) through."""
        if scope["type"] == "http":
            sent = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
        await self.app(scope, receive, send)


def run_mcp(args: argparse.Namespace) -> int:
    """Serve the fleet's MCP tools until the client goes (stdio) or until interrupted."""
    from fleet.client import Fleet
    from fleetops.discovery import fleet_settings
    from fleetops.mcp_server import build_server

    settings = fleet_settings()
    token = mcp_token(args.address, settings.serve_token) if args.http else None
    server = build_server(Fleet.from_env(settings))
    if args.http is None:
        server.run("stdio")
        return ExitCode.OK
    _serve_http(server, args.address, args.http, token)
    return ExitCode.OK


def _serve_http(server: Any, address: str, port: int, token: str | None) -> None:
    import anyio
    import uvicorn

    from fleetops.local import check_port_free

    check_port_free(port, "fleet mcp", host=address)
    app: Any = server.streamable_http_app(host=address)
    if token is not None:
        app = BearerGate(app, token)
    config = uvicorn.Config(app, host=address, port=port, log_level="warning")
    print(f"fleet mcp: http://{address}:{port}/mcp", flush=True)
    anyio.run(uvicorn.Server(config).serve)
