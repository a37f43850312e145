"""How every command finds the fleet: `FLEET_REDIS_URL`, else the nearest `fleet up`.

`fleet up` writes `.fleet/up.json` (what it started); `fleet_settings()` is the one way a
command (run, watch, stop, trace, batch, serve, metrics, doctor, worker, flower) builds
its settings, so `fleet trace list` looks at the same Redis as `fleet run`. Like git with
`.git`, a command run in a subdirectory finds the `fleet up` of the directory above it;
like git's `safe.directory`, it trusts only a state file the user owns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import redis
from pydantic import BaseModel, ValidationError

from fleet.settings import Settings, process_settings

STATE_DIR = ".fleet"
UP_FILE = "up.json"
PING_TIMEOUT_S = 1.0


class UpState(BaseModel):
    """`.fleet/up.json`: what the running `fleet up` started."""

    pid: int
    redis_url: str
    embedded_redis_pid: int | None = None
    worker_pids: list[int] = []
    flower_url: str | None = None
    flower_pid: int | None = None
    started_at_ms: int
    ready: bool = False
    """Every worker answered a ping (written early too: a killed run leaves its Redis pid)."""


def discover_redis_url(
    directory: Path | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """The Redis of a `fleet up` running in `directory` (default: cwd), if it answers.

    None when `FLEET_REDIS_URL` is set (it wins), or no live `fleet up` state is there.
    """
    env = os.environ if env is None else env
    if env.get("FLEET_REDIS_URL"):
        return None
    state_dir = find_state_dir(directory or Path.cwd())
    state = read_state(state_dir) if state_dir else None
    if state is None or not redis_answers(state.redis_url):
        return None
    return state.redis_url


def find_state_dir(start: Path) -> Path | None:
    """The nearest `.fleet/` with an `up.json` the current user owns, in `start` or above."""
    for directory in (start, *start.parents):
        state_file = directory / STATE_DIR / UP_FILE
        try:
            owner = state_file.stat().st_uid
        except OSError:
            continue
        if owner == os.geteuid():
            return state_file.parent
    return None


def no_fleet_hint(env: Mapping[str, str] | None = None, directory: Path | None = None) -> str:
    """Why a command looked at the default Redis: '' when a URL was set or a `fleet up` found."""
    env = os.environ if env is None else env
    here = directory or Path.cwd()
    if env.get("FLEET_REDIS_URL") or find_state_dir(here):
        return ""
    return (
        f"FLEET_REDIS_URL is not set and no `fleet up` runs in {here} or above it:"
        " start one with `fleet up`, or set FLEET_REDIS_URL"
    )


def fleet_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The process's settings, on the Redis of this directory's `fleet up` when no URL is set."""
    values = dict(os.environ if env is None else env)
    discovered = discover_redis_url(env=values)
    if discovered:
        values["FLEET_REDIS_URL"] = discovered
    elif env is None:
        return process_settings()
    return Settings.from_env(values)


def fleet_env(settings: Settings) -> dict[str, str]:
    """The current environment, pointed at these settings' Redis and broker."""
    return {
        **os.environ,
        "FLEET_REDIS_URL": settings.redis_url,
        "FLEET_BROKER_URL": settings.broker_url,
    }


def redis_answers(url: str, timeout_s: float = PING_TIMEOUT_S) -> bool:
    """Whether a Redis at `url` answers PING."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=None
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def read_state(state_dir: Path) -> UpState | None:
    """The `up.json` in `state_dir`, or None if there is none (or it is unreadable)."""
    try:
        return UpState.model_validate_json((state_dir / UP_FILE).read_bytes())
    except (OSError, ValidationError):
        return None
