"""`fleet a2a`: the fleet as an A2A agent (fleetops.a2a, docs/a2a.md)."""

from __future__ import annotations

import argparse

from fleet.errors import ConfigError
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.serve import MIN_TOKEN_CHARS, TOKEN_ENV


def a2a_token(env: dict[str, str]) -> str:
    """FLEET_SERVE_TOKEN: always required here, since every A2A message submits work.

    Raises:
        ConfigError: unset, or shorter than `fleet serve` accepts.
    """
    token = env.get(TOKEN_ENV) or ""
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"fleet a2a needs {TOKEN_ENV} (at least {MIN_TOKEN_CHARS} characters): every"
            " A2A message starts a tree, so the endpoint is never open"
        )
    return token


def run_a2a(args: argparse.Namespace) -> int:
    """Serve the presets marked `a2a: true` until interrupted."""
    import uvicorn

    from fleet.client import Fleet
    from fleetops.a2a.app import build_app
    from fleetops.discovery import fleet_settings
    from fleetops.local import check_port_free

    settings = fleet_settings()
    token = a2a_token(dict(settings.env))
    fleet = Fleet.from_env(settings)
    host = "127.0.0.1" if args.address in ("", "localhost") else args.address
    shown = f"[{host}]" if ":" in host else host
    url = args.url or f"http://{shown}:{args.port}/"
    app = build_app(fleet, url, token)
    check_port_free(args.port, "fleet a2a", host=host)
    print(f"fleet a2a: {url} (card: {url.rstrip('/')}/.well-known/agent-card.json)", flush=True)
    uvicorn.run(app, host=host, port=args.port, log_level="warning")
    return ExitCode.OK
