"""How every command finds the fleet: `fleet.discovery`, and what a command says about it.

The discovery itself (FLEET_REDIS_URL, else the nearest live `fleet up`'s private
`up.json`, else the default Redis) is `fleet.discovery`, shared with `Fleet.from_env()`.
`fleet_settings()` is the one way a command (run, watch, stop, trace, batch, serve,
metrics, doctor, worker, flower) builds its settings, so `fleet trace list` looks at the
same Redis as `fleet run`; a command that fell back to the default Redis says so in one
line after it ran (`say_where`), or in its error's hint.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from fleet.discovery import (
    PING_TIMEOUT_S,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    UP_FILE,
    UpState,
    discover,
    discover_redis_url,
    find_state_dir,
    read_state,
    redis_answers,
    trusted_state_file,
)
from fleet.settings import Settings, process_env, process_settings

__all__ = [
    "PING_TIMEOUT_S",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "UP_FILE",
    "UpState",
    "discover_redis_url",
    "find_state_dir",
    "fleet_env",
    "fleet_settings",
    "forget_where",
    "no_fleet_hint",
    "read_state",
    "redis_answers",
    "say_where",
    "trusted_state_file",
]


def no_fleet_hint(env: Mapping[str, str] | None = None, directory: Path | None = None) -> str:
    """Why a command looked at the default Redis: '' when a URL was set or a `fleet up` found."""
    env = process_env() if env is None else env
    here = directory or Path.cwd()
    if env.get("FLEET_REDIS_URL") or find_state_dir(here, Settings.from_env(env)):
        return ""
    return (
        f"FLEET_REDIS_URL is not set and no `fleet up` runs for {here} or above it:"
        " start one with `fleet up`, or set FLEET_REDIS_URL"
    )


def fleet_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The process's settings, on the Redis of this directory's `fleet up` when no URL is set."""
    found = discover(env)
    if env is None and found.source != "up":
        if found.note:
            _where.append(found.note)
        return process_settings()  # the process's one object (nothing was added to it)
    return found.settings


_where: list[str] = []
"""Which Redis a command read when nothing said where (`say_where` prints it)."""


def forget_where() -> None:
    """Drop an unsaid note (a command that failed said where in its error's hint)."""
    _where.clear()


def say_where() -> None:
    """One line on stderr after a command that read the default Redis unasked.

    Outside the `fleet up` directory a command would otherwise read the default Redis in
    silence (an empty `fleet trace list`, a run submitted to another fleet). Said after the
    command, so that bad input stays one line (the error carries its own hint).
    """
    if _where:
        print(_where[-1], file=sys.stderr)
        _where.clear()


def fleet_env(settings: Settings) -> dict[str, str]:
    """The settings' environment, pointed at their Redis and broker (a child's environment)."""
    return {
        **settings.env,
        "FLEET_REDIS_URL": settings.redis_url,
        "FLEET_BROKER_URL": settings.broker_url,
    }
