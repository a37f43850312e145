"""`fleet env`: the exports that make any directory or program reach this fleet.

Commands find a `fleet up` from its directory and below (`fleetops.discovery`); a program
elsewhere, a container or a `.env` file needs the variables instead. The URL carries the
embedded Redis's password: the output is for the operator's shell or a private file, as
`up.json` is.
"""

from __future__ import annotations

import argparse
import shlex

from fleet.errors import ConfigError
from fleetops.discovery import fleet_settings, forget_where, no_fleet_hint

FORWARDED = ("FLEET_REDIS_SENTINEL_MASTER", "FLEET_REDIS_CLUSTER", "FLEET_STATE_DIR")
"""Besides the two URLs: what a client needs to read the same Redis the same way."""


def fleet_exports(env: dict[str, str]) -> dict[str, str]:
    """The variables, in print order, for the fleet these settings reach."""
    exports = {"FLEET_REDIS_URL": env["FLEET_REDIS_URL"]}
    if env.get("FLEET_BROKER_URL", exports["FLEET_REDIS_URL"]) != exports["FLEET_REDIS_URL"]:
        exports["FLEET_BROKER_URL"] = env["FLEET_BROKER_URL"]
    exports.update({name: env[name] for name in FORWARDED if env.get(name)})
    return exports


def run_env(args: argparse.Namespace) -> int:
    """Print `export NAME=VALUE` lines (`--dotenv`: `NAME=VALUE`, for a `.env` file).

    Raises:
        ConfigError: no `fleet up` runs for this directory and FLEET_REDIS_URL is unset.
    """
    if hint := no_fleet_hint():
        raise ConfigError(f"no fleet to print: {hint}")
    settings = fleet_settings()
    forget_where()
    env = {
        **settings.env,
        "FLEET_REDIS_URL": settings.redis_url,
        "FLEET_BROKER_URL": settings.broker_url,
    }
    prefix = "" if args.dotenv else "export "
    for name, value in fleet_exports(env).items():
        print(f"{prefix}{name}={shlex.quote(value)}")
    return 0
