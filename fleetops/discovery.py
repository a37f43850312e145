"""How every command finds the fleet: `FLEET_REDIS_URL`, else the nearest `fleet up`.

`fleet up` writes `up.json` (what it started, its Redis password included) into its state
folder, which is never inside the directory it runs in: FLEET_STATE_DIR, else
`$XDG_STATE_HOME/agent-fleet/<hash of the directory>` (`Settings.fleet_state_dir`). An
agent can write anything in its workspace, so nothing there is read: a command in a
directory looks up the state folder of that directory, then of each one above it (like
git with `.git`), and trusts an `up.json` only when the user owns it and no one else can
read or write it or its folder (like git's `safe.directory`); any other is ignored with
a warning. `fleet_settings()` is the one way a command (run, watch, stop, trace, batch,
serve, metrics, doctor, worker, flower) builds its settings, so `fleet trace list` looks
at the same Redis as `fleet run`.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

import redis
from pydantic import BaseModel, ValidationError

from fleet.errors import ConfigError
from fleet.settings import Settings, process_env, process_settings, state_dir_for
from fleet.storage.backends.redis.connect import connect, redact_url

log = logging.getLogger(__name__)

UP_FILE = "up.json"
PING_TIMEOUT_S = 1.0
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


class UpState(BaseModel):
    """`up.json`: what the running `fleet up` started."""

    pid: int
    directory: str
    """The directory `fleet up` runs for: commands there and below find it."""
    redis_url: str
    """With the embedded Redis's password: the file is the operator's alone."""
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
    """The Redis of a `fleet up` running for `directory` (default: cwd), if it answers.

    None when `FLEET_REDIS_URL` is set (it wins), or no live `fleet up` state is there.
    """
    env = process_env() if env is None else env
    if env.get("FLEET_REDIS_URL"):
        return None
    state_dir = find_state_dir(directory or Path.cwd(), Settings.from_env(env))
    state = read_state(state_dir) if state_dir else None
    if state is None or not redis_answers(state.redis_url):
        return None
    return state.redis_url


def find_state_dir(start: Path, settings: Settings) -> Path | None:
    """The state folder of the `fleet up` of `start` or the nearest directory above it.

    With FLEET_STATE_DIR set, only that folder. A folder counts when it holds a trusted
    `up.json` (`trusted_state_file`).
    """
    if settings.state_dir is not None:
        candidates = [settings.state_dir]
    else:
        real = start.expanduser().resolve()
        candidates = [state_dir_for(settings.state_home, d) for d in (real, *real.parents)]
    for state_dir in candidates:
        if trusted_state_file(state_dir / UP_FILE):
            return state_dir
    return None


def trusted_state_file(path: Path) -> bool:
    """Whether `path` is a state file only this user could have written.

    False with a warning when it is not (a link, another owner, open to others), quietly
    when there is none.
    """
    try:
        info, folder = path.lstat(), path.parent.stat()
    except OSError:
        return False
    problem = _not_private(info, "file", PRIVATE_FILE_MODE) or _not_private(
        folder, "folder", PRIVATE_DIR_MODE
    )
    if problem:
        log.warning("fleet: ignoring %s: its %s; `fleet up` writes it that way", path, problem)
    return not problem


def _not_private(info: os.stat_result, what: str, mode: int) -> str:
    """What makes a file or folder not private to this user ('' when nothing)."""
    kind = stat.S_ISREG if what == "file" else stat.S_ISDIR
    if not kind(info.st_mode):
        return f"{what} is not a regular {what} (a link?)"
    if info.st_uid != os.geteuid():
        return f"{what} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"{what} mode is {stat.S_IMODE(info.st_mode):o}, not {mode:o}"
    return ""


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
    values = dict(process_env() if env is None else env)
    discovered = discover_redis_url(env=values)
    if discovered:
        values["FLEET_REDIS_URL"] = discovered
    elif env is None:
        settings = process_settings()
        if not values.get("FLEET_REDIS_URL"):
            _where.append(
                f"fleet: no `fleet up` for {Path.cwd()} or above and FLEET_REDIS_URL unset:"
                f" read {redact_url(settings.redis_url)}"
            )
        return settings
    return Settings.from_env(values)


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


def redis_answers(
    url: str, timeout_s: float = PING_TIMEOUT_S, sentinel_master: str | None = None
) -> bool:
    """Whether a Redis at `url` answers PING (the master, for a `sentinel://` URL)."""
    try:
        client = connect(url, sentinel_master, timeout_s=timeout_s)
    except ConfigError:  # a sentinel:// URL without its master's name
        return False
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
