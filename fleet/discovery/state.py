"""`up.json`: what a running `fleet up` wrote in its private state folder, and when to trust it.

The state folder is never inside the directory `fleet up` runs for (an agent can write
anything there): FLEET_STATE_DIR, else `$XDG_STATE_HOME/agent-fleet/<hash of the
directory>`. A file counts only when the user owns it and no one else can read or write it
or its folder (like git's `safe.directory`).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from pydantic import BaseModel, ValidationError

from fleet.settings import Settings, state_dir_for

log = logging.getLogger("fleet.discovery")

UP_FILE = "up.json"
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


def read_state(state_dir: Path) -> UpState | None:
    """The `up.json` in `state_dir`, or None if there is none (or it is unreadable)."""
    try:
        return UpState.model_validate_json((state_dir / UP_FILE).read_bytes())
    except (OSError, ValidationError):
        return None
