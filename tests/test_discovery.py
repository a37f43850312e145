"""How a command finds the fleet: the nearest `fleet up` above it, from its private state.

The state folder of a directory's `fleet up` is outside the directory (FLEET_STATE_DIR,
else `$XDG_STATE_HOME/agent-fleet/<hash>`); its `up.json` counts only when the user owns
it and nobody else can read or write it or its folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fleet.settings import Settings
from fleetops.cli.main import with_hint
from fleetops.discovery import UP_FILE, find_state_dir, no_fleet_hint


def _settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_env({"XDG_STATE_HOME": str(tmp_path / "state"), **env})


def _up_json(settings: Settings, directory: Path) -> Path:
    """A private `up.json` for `directory`, as `fleet up` writes it; its folder."""
    state_dir = settings.fleet_state_dir(directory)
    state_dir.mkdir(parents=True)
    state_dir.chmod(0o700)
    (state_dir / UP_FILE).write_text("{}")
    (state_dir / UP_FILE).chmod(0o600)
    return state_dir


def test_the_nearest_fleet_up_above_a_subdirectory_is_found(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    outer = _up_json(settings, tmp_path)
    inner = _up_json(settings, tmp_path / "project")
    (tmp_path / "project" / "src" / "pkg").mkdir(parents=True)

    assert find_state_dir(tmp_path / "project" / "src" / "pkg", settings) == inner
    assert find_state_dir(tmp_path / "elsewhere", settings) == outer  # need not exist
    assert find_state_dir(tmp_path, settings) == outer
    assert not inner.is_relative_to(tmp_path / "project")  # never inside the directory


def test_a_state_dir_without_up_json_is_not_a_fleet(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.fleet_state_dir(tmp_path / "a").mkdir(parents=True)  # stopped: its Redis dir
    assert find_state_dir(tmp_path / "a", settings) == find_state_dir(tmp_path, settings)


def test_fleet_state_dir_names_the_one_folder_looked_at(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    settings = _settings(tmp_path, FLEET_STATE_DIR=str(chosen))
    _up_json(_settings(tmp_path), tmp_path)  # the default place: not looked at
    assert find_state_dir(tmp_path / "x", settings) is None
    assert _up_json(settings, tmp_path / "anywhere") == chosen
    assert find_state_dir(tmp_path / "x", settings) == chosen


@pytest.mark.parametrize(
    ("file_mode", "dir_mode", "problem"),
    [(0o644, 0o700, "file mode is 644"), (0o600, 0o755, "folder mode is 755")],
)
def test_an_up_json_others_could_write_or_read_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file_mode: int, dir_mode: int, problem: str
) -> None:
    settings = _settings(tmp_path)
    state_dir = _up_json(settings, tmp_path)
    (state_dir / UP_FILE).chmod(file_mode)
    state_dir.chmod(dir_mode)

    with caplog.at_level(logging.WARNING, logger="fleet.discovery"):
        assert find_state_dir(tmp_path, settings) is None
    (warning,) = caplog.messages
    assert str(state_dir / UP_FILE) in warning and problem in warning


def test_an_up_json_that_is_a_link_is_ignored(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    state_dir = _up_json(settings, tmp_path)
    planted = tmp_path / "planted.json"
    (state_dir / UP_FILE).rename(planted)
    (state_dir / UP_FILE).symlink_to(planted)
    assert find_state_dir(tmp_path, settings) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_an_up_json_another_user_owns_is_ignored(tmp_path: Path) -> None:
    """A state file someone else wrote must not point this user's commands at their Redis."""
    settings = _settings(tmp_path)
    planted = _up_json(settings, tmp_path) / UP_FILE
    os.chown(planted, 65534, 65534)
    (tmp_path / "victim").mkdir()

    assert find_state_dir(tmp_path / "victim", settings) is None
    os.chown(planted, os.geteuid(), os.getegid())
    assert find_state_dir(tmp_path / "victim", settings) == planted.parent


def test_the_hint_names_the_directory_only_when_nothing_said_where(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    hint = no_fleet_hint(env, tmp_path)
    assert str(tmp_path) in hint and "fleet up" in hint and "FLEET_REDIS_URL" in hint
    assert no_fleet_hint({**env, "FLEET_REDIS_URL": "redis://h:1/0"}, tmp_path) == ""
    _up_json(_settings(tmp_path), tmp_path)
    assert no_fleet_hint(env, tmp_path / "sub") == ""


def test_an_unreachable_default_redis_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    message = with_hint("cannot reach Redis at 'redis://127.0.0.1:6379/0': refused")
    assert message.startswith("cannot reach Redis") and "start one with `fleet up`" in message
    assert "\n" not in message


def test_a_command_outside_any_fleet_up_says_which_redis_it_reads(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"XDG_STATE_HOME": str(tmp_path / "state"), "FLEET_WORKSPACE_ROOTS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "trace", "list"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    if done.returncode == 0:  # a Redis answers on the default URL (CI's does)
        assert lines[0] == (
            f"fleet: no `fleet up` for {tmp_path.resolve()} or above and FLEET_REDIS_URL"
            " unset: using redis://127.0.0.1:6379/0"
        )
    else:  # none does (a fresh machine): the one error line says why it looked there
        assert done.returncode == 2 and "FLEET_REDIS_URL is not set" in lines[0], lines
