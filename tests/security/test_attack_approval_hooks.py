"""Attacks on approvals and operator hooks: forged and crossed approval ids, hook code an
agent could write, hooks named from a workspace file.

The waiting traces come from `fleet run --inline` on a real Redis: an answer is refused
before anything reaches a worker, so none is started for those.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.conversation import approval
from fleet.storage.backends.redis.store import RedisStore
from tests.procs import start_worker
from tests.test_fleet_recovery import database_url

ATTACK_DB = 10
FLEET = [sys.executable, "-m", "fleetops.cli.main"]
TIMEOUT_S = 60.0
EVIL_HOOK = """\
import pathlib
pathlib.Path(__file__).with_name("hook-was-imported").write_text("agent code ran")
from fleet.observe.hooks import Hooks
HOOK = Hooks()
"""


@pytest.fixture
def url(redis_url: str) -> str:
    return database_url(redis_url, ATTACK_DB)


@pytest.fixture
def operator(tmp_path: Path) -> Path:
    """The operator's folder: fleet.yaml (write_file needs approval) and the workspace."""
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"approve": ["write_file"]}))
    (tmp_path / "workspace").mkdir()
    return tmp_path


def run_env(url: str, operator: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    workspace = str(operator / "workspace")
    return env | {
        "FLEET_REDIS_URL": url,
        "FLEET_WORKSPACE": workspace,
        "FLEET_WORKSPACE_ROOTS": workspace,
        "FLEET_CONFIG": str(operator / "fleet.yaml"),
        "FLEET_ALLOW_SCRIPTED": "1",
        **extra,
    }


def fleet(
    url: str, operator: Path, *args: str, cwd: Path | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEET, *args],
        env=run_env(url, operator, **extra),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def writer(path: Path, name: str, *, after_turns: int = 0) -> str:
    """Writes `name` after `after_turns` listings: the call id names its turn."""
    listing = {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]}
    write = {"name": "write_file", "arguments": {"path": name, "content": "pwned"}}
    steps: list[dict[str, Any]] = [listing] * after_turns + [{"tool_calls": [write]}]
    path.write_text(
        yaml.safe_dump({"scripts": [{"match": ".*", "steps": [*steps, {"content": "done"}]}]})
    )
    return f"scripted:{path}"


def waiting(url: str, operator: Path, model: str) -> tuple[str, str]:
    """An inline run left waiting for approval: its trace id and the pending call's id."""
    run = fleet(url, operator, "run", "--inline", "--json", "--model", model, "write")
    assert run.returncode == 3, run.stdout + run.stderr
    trace_id = str(yaml.safe_load(run.stdout)["trace_id"])
    store = RedisStore.from_url(url)
    try:
        pending = approval.pending(store.get_trace(trace_id))
    finally:
        store.close()
    assert pending is not None
    return trace_id, str(pending["tool_call_id"])


def refused(result: subprocess.CompletedProcess[str], part: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and part in lines[0] and "Traceback" not in result.stderr, lines


def still_waiting(url: str, trace_id: str) -> bool:
    store = RedisStore.from_url(url)
    try:
        return approval.pending(store.get_trace(trace_id)) is not None
    finally:
        store.close()


@pytest.mark.integration
def test_a_forged_approval_id_is_refused(url: str, operator: Path, tmp_path: Path) -> None:
    trace_id, _ = waiting(url, operator, writer(tmp_path / "m.yaml", "a.txt"))
    refused(fleet(url, operator, "approve", trace_id, "--id", "call_forged"), "is not the call")
    refused(fleet(url, operator, "deny", trace_id, "x", "--id", "call_forged"), "is not the call")
    assert still_waiting(url, trace_id) and not (operator / "workspace" / "a.txt").exists()


@pytest.mark.integration
def test_an_approval_for_another_tree_is_refused(url: str, operator: Path, tmp_path: Path) -> None:
    first, first_call = waiting(url, operator, writer(tmp_path / "a.yaml", "a.txt"))
    second, second_call = waiting(
        url, operator, writer(tmp_path / "b.yaml", "b.txt", after_turns=1)
    )
    assert first_call != second_call
    refused(fleet(url, operator, "approve", first, "--id", second_call), "is not the call")
    refused(fleet(url, operator, "approve", second, "--id", first_call), "is not the call")
    assert still_waiting(url, first) and still_waiting(url, second)
    assert list((operator / "workspace").iterdir()) == []


@pytest.mark.integration
def test_a_hook_module_inside_a_workspace_root_is_never_imported(
    url: str, operator: Path, tmp_path: Path
) -> None:
    # `python -m` puts the working directory on sys.path: an agent's file there would shadow.
    workspace = operator / "workspace"
    (workspace / "agent_hooks.py").write_text(EVIL_HOOK)
    model = writer(tmp_path / "m.yaml", "a.txt")
    run = fleet(
        url, operator, "run", "--inline", "--model", model, "x", cwd=workspace,
        FLEET_HOOKS="agent_hooks:HOOK",
    )  # fmt: skip
    refused(run, "inside a workspace root")
    env = run_env(url, operator, FLEET_HOOKS="agent_hooks:HOOK", PYTHONPATH=str(workspace))
    with start_worker(url, env_extra=env) as worker:
        assert worker.process.wait(TIMEOUT_S) == 2
        log = worker.log()
    assert "inside a workspace root" in log and "Traceback" not in log
    assert not (workspace / "hook-was-imported").exists(), "the agent's module never ran"


@pytest.mark.integration
def test_hooks_named_in_a_workspace_fleet_yaml_are_not_loaded(
    url: str, operator: Path, tmp_path: Path
) -> None:
    workspace = operator / "workspace"
    (workspace / "agent_hooks.py").write_text(EVIL_HOOK)
    (workspace / "fleet.yaml").write_text(yaml.safe_dump({"hooks": ["agent_hooks:HOOK"]}))
    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": [{"content": "done"}]}]}))
    run = fleet(
        url, operator, "run", "--inline", "--model", f"scripted:{model}", "x", cwd=workspace
    )
    assert run.returncode == 0, run.stderr
    assert not (workspace / "hook-was-imported").exists()
