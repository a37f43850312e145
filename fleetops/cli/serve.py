"""`fleet serve`: the trace API and live page over the fleet's store (see fleetops.serve)."""

from __future__ import annotations

import argparse
from functools import partial

from fleet.errors import ConfigError
from fleetops.cli.args import OPEN_ADDRESSES, needs_no_token
from fleetops.cli.exit_codes import ExitCode

TOKEN_ENV = "FLEET_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16


def serve_token(address: str, env: dict[str, str]) -> str | None:
    """The bearer token from the environment (argv is visible to `ps`).

    Raises:
        ConfigError: an address but 127.0.0.1, ::1 or localhost without a token, or a
            token too short to resist guessing.
    """
    token = env.get(TOKEN_ENV) or None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters")
    if token is None and not needs_no_token(address):
        raise ConfigError(
            f"fleet serve on {address!r} would be open to the network: set {TOKEN_ENV}"
            f" (only {', '.join(sorted(OPEN_ADDRESSES))} go without one)"
        )
    return token


def run_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from fleet.client import Fleet
    from fleetops.discovery import fleet_settings
    from fleetops.local import check_port_free
    from fleetops.serve import (
        api_approvals,
        api_control,
        api_experiences,
        api_memory,
        api_messages,
    )
    from fleetops.serve.app import ServeConfig, serve_forever

    settings = fleet_settings()
    token = serve_token(args.address, dict(settings.env))
    fleet = Fleet.from_env(settings)
    host = "127.0.0.1" if args.address in ("", "localhost") else args.address
    check_port_free(args.port, "fleet serve", host=host)
    acting = (
        partial(api_experiences.routes, fleet),
        partial(api_approvals.routes, fleet),
        partial(api_memory.routes, fleet),
        partial(api_messages.routes, fleet),
        partial(api_control.routes, fleet),
    )
    config = ServeConfig(store=fleet.store, actions=fleet, token=token, routes=acting)
    serve_forever(
        config, args.address, args.port, lambda url: print(f"fleet serve: {url}", flush=True)
    )
    return ExitCode.OK
