"""Finding a directory's fleet: FLEET_REDIS_URL, the nearest live `fleet up`, or the default."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fleet.discovery.state import find_state_dir, read_state
from fleet.settings import Settings, process_env
from fleet.storage.backends.redis.connect import answers, redact_url

log = logging.getLogger("fleet.discovery")

PING_TIMEOUT_S = 1.0
REDIS_URL_ENV = "FLEET_REDIS_URL"


Source = Literal["url", "up", "default"]
"""Where the Redis came from: FLEET_REDIS_URL, a live `fleet up`'s state, or nowhere."""


@dataclass(frozen=True)
class Found:
    """What discovery found: the settings to use and where their Redis came from."""

    settings: Settings
    source: Source
    directory: Path
    """The directory looked up from (the process's working directory by default)."""

    @property
    def note(self) -> str:
        """The one line said when nothing said where ('' when something did)."""
        if self.source != "default":
            return ""
        return (
            f"fleet: no `fleet up` for {self.directory} or above and {REDIS_URL_ENV} unset:"
            f" using {redact_url(self.settings.redis_url)}"
        )


def discover(env: Mapping[str, str] | None = None, directory: Path | None = None) -> Found:
    """The settings of the fleet for `directory` (default: cwd), and where they came from.

    FLEET_REDIS_URL wins; else the Redis of the nearest live `fleet up` (its URL, password
    included, is put in the settings' environment, so children started with it find it
    too); else the default Redis, with `source="default"`.
    """
    values = dict(process_env() if env is None else env)
    here = (directory or Path.cwd()).expanduser().resolve()
    if values.get(REDIS_URL_ENV):
        return Found(Settings.from_env(values), "url", here)
    discovered = discover_redis_url(here, values)
    if discovered:
        values[REDIS_URL_ENV] = discovered
        return Found(Settings.from_env(values), "up", here)
    return Found(Settings.from_env(values), "default", here)


def url_chosen(settings: Settings) -> bool:
    """Whether someone said which Redis (FLEET_REDIS_URL, or discovery put the fleet's there)."""
    return bool(settings.env.get(REDIS_URL_ENV))


_said: set[str] = set()


def client_settings() -> Settings:
    """`Fleet.from_env()`'s settings: `discover()`, saying once per process when it fell back."""
    found = discover()
    if found.note and found.note not in _said:
        _said.add(found.note)
        log.warning("%s", found.note)
    return found.settings


def discover_redis_url(
    directory: Path | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """The Redis of a `fleet up` running for `directory` (default: cwd), if it answers.

    None when `FLEET_REDIS_URL` is set (it wins), or no live `fleet up` state is there.
    """
    env = process_env() if env is None else env
    if env.get(REDIS_URL_ENV):
        return None
    state_dir = find_state_dir(directory or Path.cwd(), Settings.from_env(env))
    state = read_state(state_dir) if state_dir else None
    if state is None or not redis_answers(state.redis_url):
        return None
    return state.redis_url


def redis_answers(
    url: str, timeout_s: float = PING_TIMEOUT_S, sentinel_master: str | None = None
) -> bool:
    """Whether a Redis at `url` answers PING (the master, for a `sentinel://` URL)."""
    return answers(url, sentinel_master, timeout_s=timeout_s)
