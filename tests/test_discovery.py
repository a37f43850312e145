"""How a command finds the fleet: the nearest `fleet up` above it, only from a file it owns."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetops.cli.main import with_hint
from fleetops.discovery import STATE_DIR, UP_FILE, find_state_dir, no_fleet_hint


def _up_json(directory: Path) -> Path:
    state_dir = directory / STATE_DIR
    state_dir.mkdir(parents=True)
    (state_dir / UP_FILE).write_text("{}")
    return state_dir


def test_the_nearest_fleet_up_above_a_subdirectory_is_found(tmp_path: Path) -> None:
    outer = _up_json(tmp_path)
    inner = _up_json(tmp_path / "project")
    (tmp_path / "project" / "src" / "pkg").mkdir(parents=True)

    assert find_state_dir(tmp_path / "project" / "src" / "pkg") == inner
    assert find_state_dir(tmp_path / "elsewhere") == outer  # need not exist
    assert find_state_dir(tmp_path) == outer


def test_a_state_dir_without_up_json_is_not_a_fleet(tmp_path: Path) -> None:
    (tmp_path / "a" / STATE_DIR).mkdir(parents=True)  # `fleet up` stopped: only its Redis dir
    assert find_state_dir(tmp_path / "a") == find_state_dir(tmp_path)  # skipped, looks above


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_an_up_json_another_user_owns_is_ignored(tmp_path: Path) -> None:
    """A hostile `/tmp/.fleet/up.json` must not point everyone below it at its Redis."""
    planted = _up_json(tmp_path) / UP_FILE
    os.chown(planted, 65534, 65534)
    (tmp_path / "victim").mkdir()

    assert find_state_dir(tmp_path / "victim") != planted.parent
    os.chown(planted, os.geteuid(), os.getegid())
    assert find_state_dir(tmp_path / "victim") == planted.parent


def test_the_hint_names_the_directory_only_when_nothing_said_where(tmp_path: Path) -> None:
    hint = no_fleet_hint({}, tmp_path)
    assert str(tmp_path) in hint and "fleet up" in hint and "FLEET_REDIS_URL" in hint
    assert no_fleet_hint({"FLEET_REDIS_URL": "redis://h:1/0"}, tmp_path) == ""
    _up_json(tmp_path)
    assert no_fleet_hint({}, tmp_path / "sub") == ""


def test_an_unreachable_default_redis_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    message = with_hint("cannot reach Redis at 'redis://127.0.0.1:6379/0': refused")
    assert message.startswith("cannot reach Redis") and "start one with `fleet up`" in message
    assert "\n" not in message
