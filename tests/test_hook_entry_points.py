"""Hooks from installed packages: the `fleet.hooks` entry-point group, and what it refuses."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib.metadata import EntryPoint, distributions
from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.observe.operator import HookChain, build_hooks, entry_point_members, operator_members
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.testing import ScriptedModel, call, text
from tests import hookkit

PLANTED = "planted_hook_xyz"
"""A module an agent wrote into its workspace; importing it leaves a marker file."""


def installed(folder: Path) -> list[EntryPoint]:
    """The `fleet.hooks` entry points of the distributions in `folder`, as pip leaves them."""
    return [
        point
        for dist in distributions(path=[str(folder)])
        for point in dist.entry_points
        if point.group == "fleet.hooks"
    ]


def plant(workspace: Path) -> Path:
    """A hook module in the workspace that marks its own import; returns the marker path."""
    marker = workspace / "imported.txt"
    (workspace / f"{PLANTED}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from fleet.observe.hooks import Hooks\n"
        "HOOK = Hooks()\n"
    )
    return marker


def test_an_installed_packages_hook_loads_with_fleet_hooks_and_sees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = hookkit.write_dist(tmp_path / "site", "acme-audit", {"rec": "tests.hookkit:RECORDER"})
    log = tmp_path / "hooks.jsonl"
    monkeypatch.setenv(hookkit.LOG_ENV, str(log))
    monkeypatch.syspath_prepend(str(site))  # as if installed: importlib.metadata finds it
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(
        workspace=workspace,
        env={},
        workspace_roots=(workspace,),
        hooks=("tests.hookkit:CONTEXT",),
        hook_timeout_s=1.0,
    )
    hooks = build_hooks(settings, MemoryStore())
    assert isinstance(hooks, HookChain)
    names = [m.name for m in hooks.members]
    assert names[1:] == ["tests.hookkit:CONTEXT", "fleet.hooks:rec=tests.hookkit:RECORDER"]
    assert all(m.timeout_s == 1.0 for m in hooks.members[1:]), "guarded like FLEET_HOOKS"

    model = ScriptedModel([call("list_files", path="."), text("done")])
    local = InProcessFleet.from_settings(settings, clients={"m": model})
    done = local.run("look around", model="m")
    assert done.status == "completed", done.error
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["tool"] for e in seen if e["event"] == "tool_finished"] == ["list_files"]


def test_an_entry_point_named_by_fleet_hooks_too_is_loaded_once(tmp_path: Path) -> None:
    value = "tests.hookkit:RECORDER"
    site = hookkit.write_dist(tmp_path / "site", "acme-audit", {"rec": value})
    members = entry_point_members((), 0.3, installed(site))
    assert [m.name for m in members] == [f"fleet.hooks:rec={value}"]
    assert [m.name for m in operator_members([value], (), 0.3)] == [value]


def test_a_distribution_an_agent_planted_in_a_workspace_is_refused_unimported(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = plant(workspace)
    hookkit.write_dist(workspace, "totally-legit", {"audit": f"{PLANTED}:HOOK"})
    with pytest.raises(ConfigError) as caught:
        entry_point_members((workspace,), 0.3, installed(workspace))
    message = str(caught.value)
    assert message.startswith("fleet.hooks entry point 'audit' of 'totally-legit'")
    assert "inside a workspace root" in message and "\n" not in message
    assert not marker.exists(), "refused before anything of it ran"


def test_an_installed_entry_point_pointing_into_a_workspace_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = plant(workspace)
    monkeypatch.syspath_prepend(str(workspace))  # `python -m` from the workspace does this
    site = hookkit.write_dist(tmp_path / "site", "acme-audit", {"audit": f"{PLANTED}:HOOK"})
    with pytest.raises(ConfigError) as caught:
        entry_point_members((workspace,), 0.3, installed(site))
    assert "inside a workspace root where agents write" in str(caught.value)
    assert "'acme-audit'" in str(caught.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("tests.hookkit", "is not module:attr"),
        ("tests.hookkit:NOT_A_HOOK", "is a object, not a fleet.Hooks instance"),
        ("tests.hookkit:MISSING", "does not load: AttributeError"),
    ],
)
def test_a_broken_entry_point_is_one_line_naming_it(tmp_path: Path, value: str, part: str) -> None:
    site = hookkit.write_dist(tmp_path / "site", "acme-audit", {"audit": value})
    with pytest.raises(ConfigError) as caught:
        entry_point_members((), 0.3, installed(site))
    message = str(caught.value)
    assert message.startswith("fleet.hooks entry point 'audit' of 'acme-audit': ")
    assert part in message and "\n" not in message


def test_no_entry_points_installed_changes_nothing() -> None:
    settings = Settings(env={})
    assert operator_members((), settings.workspace_roots, 0.3) == []
    hooks = build_hooks(replace(settings, hooks=()), MemoryStore())
    assert not isinstance(hooks, HookChain)
