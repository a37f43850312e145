"""`fleet mcp`: the fleet as an MCP server, on stdio or streamable HTTP (fleetops.mcp_server)."""

from __future__ import annotations

import argparse
import hmac
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from fleet.errors import ConfigError
from fleetops.cli.args import OPEN_ADDRESSES, is_loopback, needs_no_token
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.serve import MIN_TOKEN_CHARS, TOKEN_ENV

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def mcp_token(address: str, token: str | None) -> str | None:
    """The bearer token HTTP clients must send: on every address but 127.0.0.1 and ::1.

    Raises:
        ConfigError: another address without a token, or a token too short.
    """
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters")
    if token is None and not needs_no_token(address):
        raise ConfigError(
            f"fleet mcp on {address!r} would be open to the network: set {TOKEN_ENV}"
            f" (only {', '.join(sorted(OPEN_ADDRESSES))} go without one)"
        )
    return token


def allowed_hosts(address: str, port: int, extra: Sequence[str] = ()) -> list[str]:
    """The `Host` values answered: the bound address, `localhost` on loopback, and `extra`.

    A DNS-rebinding page reaches the server under its own name (`Host: evil.example:P`),
    which none of these is; a proxy's name is given with `--allow-host`.

    Raises:
        ConfigError: a wildcard address with no `--allow-host`: no Host would be known good.
    """
    names = [] if address in WILDCARDS else [f"[{address}]" if ":" in address else address]
    names += ["localhost", "127.0.0.1", "[::1]"] if address == "localhost" else []
    names += ["localhost"] if is_loopback(address) and address != "localhost" else []
    hosts = [f"{name}:{port}" for name in names] + [f"{name}:*" for name in extra]
    hosts += list(extra)  # a proxy on the scheme's default port sends no port
    if not hosts:
        raise ConfigError(
            f"fleet mcp on {address!r} listens on every address: name the host clients use"
            " with --allow-host HOST (its Host and Origin checks answer only those)"
        )
    return hosts


def transport_security(hosts: Sequence[str]) -> Any:
    """The MCP SDK's Host and Origin checks, on, for exactly `hosts`."""
    from mcp.server.transport_security import TransportSecuritySettings

    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=list(hosts), allowed_origins=origins
    )


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
    hosts = allowed_hosts(args.address, args.http, args.allow_host or ()) if args.http else []
    server = build_server(Fleet.from_env(settings))
    if args.http is None:
        server.run("stdio")
        return ExitCode.OK
    _serve_http(server, args.address, args.http, token, hosts)
    return ExitCode.OK


def _serve_http(
    server: Any, address: str, port: int, token: str | None, hosts: Sequence[str]
) -> None:
    import anyio
    import uvicorn

    from fleetops.local import check_port_free

    check_port_free(port, "fleet mcp", host=address or "0.0.0.0")
    app: Any = server.streamable_http_app(
        host=address, transport_security=transport_security(hosts)
    )
    if token is not None:
        app = BearerGate(app, token)
    config = uvicorn.Config(app, host=address, port=port, log_level="warning")
    print(f"fleet mcp: http://{address}:{port}/mcp", flush=True)
    anyio.run(uvicorn.Server(config).serve)
