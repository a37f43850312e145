"""Route 2: workspaces outside the operator's roots, and `scripted:` models naming any file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.security.trust import check_workspace_root
from fleet.settings import Settings
from tests.security.attacker import SECRET, SECRET_ENV, leaked, redis_text
from tests.security.conftest import HardenedFleet, run_forged

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
EXAMPLE = Path(__file__).resolve().parents[2] / "fleet" / "examples" / "explore.yaml"
STEAL_ENVIRON = {
    "scripts": [
        {
            "match": ".*",
            "steps": [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "proc/self/environ"}}]},
                {"content": "{last_tool}"},
            ],
        }
    ]
}


def cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [*FLEET, *args],
        env={**clean, **SECRET_ENV, "FLEET_ALLOW_SCRIPTED": "1", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_batch_line_with_workspace_slash_is_refused_naming_file_and_line(
    tmp_path: Path,
) -> None:
    """Route: a batch line `"workspace": "/"` was accepted; a read-only branch then read
    `proc/self/environ`. Control: workspaces are checked against FLEET_WORKSPACE_ROOTS at
    submission: exit 2, `FILE:LINE`, nothing submitted."""
    batch = tmp_path / "tasks.jsonl"
    lines = [{"task": "fine"}, {"task": "steal", "workspace": "/", "preset": "explore"}]
    batch.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    unreachable = "redis://127.0.0.1:1/0"  # validation runs before any connection

    error = one_line_error(
        cli(
            ["batch", str(batch), "--model", f"scripted:{EXAMPLE}"],
            tmp_path,
            FLEET_REDIS_URL=unreachable,
            FLEET_WORKSPACE_ROOTS=str(tmp_path),
        )
    )

    assert error.startswith(f"fleet: error: {batch}:2: "), error
    assert "outside FLEET_WORKSPACE_ROOTS" in error and not leaked(error)


def test_fleet_run_with_a_workspace_outside_the_roots_exits_2(tmp_path: Path) -> None:
    """Route: `fleet run --workspace /` ran an agent over the whole file system.
    Control: the CLI refuses it with a one-line error, exit 2, before any run."""
    result = cli(
        ["run", "--inline", "--model", f"scripted:{EXAMPLE}", "--workspace", "/", "survey"],
        tmp_path,
        FLEET_WORKSPACE_ROOTS=str(tmp_path),
    )

    assert "outside FLEET_WORKSPACE_ROOTS" in one_line_error(result)
    assert result.stdout == ""


def test_the_python_api_refuses_a_workspace_outside_the_roots(tmp_path: Path) -> None:
    """Route: `Fleet.submit(workspace="/")` created a root trace over `/`.
    Control: `create_root` checks the roots; nothing is stored."""
    settings = Settings.from_env({"FLEET_WORKSPACE": str(tmp_path), "FLEET_ALLOW_SCRIPTED": "1"})
    local = InProcessFleet.from_settings(settings)
    for outside in (Path("/"), tmp_path.parent, tmp_path / ".." / ".."):
        with pytest.raises(ConfigError, match="outside FLEET_WORKSPACE_ROOTS"):
            create_root(local.runtime, TaskSpec("t", f"scripted:{EXAMPLE}", workspace=outside))
    link = tmp_path / "escape"
    link.symlink_to("/")
    with pytest.raises(ConfigError, match="outside FLEET_WORKSPACE_ROOTS"):
        create_root(local.runtime, TaskSpec("t", f"scripted:{EXAMPLE}", workspace=link))
    assert local.store.list_traces() == []


@pytest.mark.integration
def test_a_forged_task_outside_the_roots_fails_and_reads_nothing(
    hardened: HardenedFleet, tmp_path: Path
) -> None:
    """Route: a task message (or a trace written into Redis) naming workspace `/` made the
    worker `read_file proc/self/environ`, and OPENAI_API_KEY landed in the trace.
    Control: the worker checks the trace's workspace against its own roots before the
    first model call and again where every tool runs: a failed trace, nothing read."""
    script = tmp_path / "steal.yaml"
    script.write_text(yaml.safe_dump(STEAL_ENVIRON))

    trace = run_forged(hardened, script, "/")

    assert trace.status == "failed", trace
    assert "outside FLEET_WORKSPACE_ROOTS" in (trace.error or "")
    with redis.Redis.from_url(hardened.url) as client:
        dump = redis_text(client)
    assert not leaked(dump)
    assert "proc/self/environ" not in dump.replace(str(script), "")  # no tool call ran


@pytest.mark.integration
def test_a_scripted_model_naming_a_credentials_file_never_quotes_it(
    hardened: HardenedFleet, tmp_path: Path
) -> None:
    """Route: `model: "scripted:/path/to/credentials"` made the worker parse that file and
    its YAML error copied a line of it into `trace.error`. Control: scripted-model errors
    name the file and position only."""
    credentials = hardened.root / "credentials"
    credentials.write_text(f"[default]\naws_secret_access_key = {SECRET}\n")

    trace = run_forged(hardened, credentials, str(hardened.root))

    assert trace.status == "failed"
    assert "scripted model" in (trace.error or "")
    with redis.Redis.from_url(hardened.url) as client:
        assert SECRET not in redis_text(client)


def test_scripted_models_load_only_when_the_operator_enables_them(tmp_path: Path) -> None:
    """Route: any submitter could name `scripted:ANY_FILE` and make a worker open it.
    Control: `scripted:` models load only with FLEET_ALLOW_SCRIPTED=1."""
    script = tmp_path / "steal.yaml"
    script.write_text(yaml.safe_dump(STEAL_ENVIRON))
    env = {"FLEET_WORKSPACE": str(tmp_path), "FLEET_ALLOW_SCRIPTED": "0"}
    local = InProcessFleet.from_settings(Settings.from_env(env))

    with pytest.raises(ConfigError, match="scripted models are disabled"):
        local.run("steal", model=f"scripted:{script}")
    with pytest.raises(ConfigError, match="scripted models are disabled"):
        local.runtime.client(f"scripted:{script}")  # a forged trace reaches the worker here


def test_a_workspace_swapped_for_a_symlink_after_a_check_is_refused(tmp_path: Path) -> None:
    """Route: the roots are resolved once per process now; a workspace that passed a check
    and is then replaced by a symlink out of the root must still be refused (the workspace
    itself is resolved at every check). A root named through a symlink admits its inside."""
    real_root = tmp_path / "real"
    (real_root / "ws").mkdir(parents=True)
    via_link = tmp_path / "root-link"
    via_link.symlink_to(real_root)
    roots = (via_link,)
    assert check_workspace_root(via_link / "ws", roots) == real_root / "ws"
    (real_root / "ws").rmdir()
    (real_root / "ws").symlink_to("/")
    with pytest.raises(ConfigError, match="outside FLEET_WORKSPACE_ROOTS"):
        check_workspace_root(via_link / "ws", roots)
