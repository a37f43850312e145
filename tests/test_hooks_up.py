"""Operator hooks under `fleet up`: its workers load FLEET_HOOKS and the `fleet.hooks` group.

Issue 25's hook row, literally: `fleet up` starts Redis and a worker; `fleet run` submits a
scripted run that plans, completes a goal, tries `rm` through bash and turns ten times.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import hookkit
from tests.security.attacker import shell_writable
from tests.test_cli_ops import FLEET, assert_one_line_error, up_env, up_state_dir
from tests.test_fleet_recovery import fleet_client
from tests.test_hooks_fleet import script, tool
from tests.test_supervisor import fleet_up

pytestmark = pytest.mark.integration

CHECKOUT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 90.0
HOOKS = ("RECORDER", "BASH_BLOCKER", "CONTEXT", "RAISER", "HANGER")


def test_under_fleet_up_hooks_see_turns_tools_goals_block_bash_and_add_context(
    tmp_path: Path,
) -> None:
    workspace = shell_writable(tmp_path / "ws")
    precious = workspace / "precious.txt"
    precious.write_text("keep me")
    entry = {"tagger": "tests.hookkit:ENTRY_POINT_TAGGER"}
    site = hookkit.write_dist(tmp_path / "site", "acme-audit", entry)  # outside the root
    log = tmp_path / "hooks.jsonl"
    log.touch()
    env = {
        "FLEET_HOOKS": ",".join(f"tests.hookkit:{name}" for name in HOOKS),
        "FLEET_HOOK_TIMEOUT_S": "0.3",
        "FLEET_ALLOW_SHELL": "1",
        hookkit.LOG_ENV: str(log),
        "PYTHONPATH": f"{CHECKOUT}:{site}",  # tests.hookkit, and the installed acme-audit
    }
    steps = [
        tool("goal", action="add", description="tidy the workspace"),
        tool("goal", action="done", goal_id="1", summary="tidied"),
        tool("bash", command="rm precious.txt"),
        # Seven more turns: the periodic injection comes before the eleventh model call.
        *(tool("list_files", path=f"d{i}") for i in range(7)),  # distinct: no doom loop
        {"content": "finished"},
    ]
    model = script(tmp_path / "m.yaml", steps)
    with fleet_up(workspace, "--workers", "1", "--concurrency", "2", **env) as (up, state):
        run = subprocess.run(
            [*FLEET, "run", "--model", model, "--json", "tidy up"],
            env=up_env(workspace, FLEET_ALLOW_SCRIPTED="1", **env),
            cwd=workspace,  # finds the fleet `fleet up` started here
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        trace_id = json.loads(run.stdout)["trace_id"]
        with fleet_client(state.redis_url, state.redis_url, workspace) as fleet:
            trace = fleet.trace(trace_id)
            messages = fleet.store.messages(trace_id)
        assert up.poll() is None, "fleet up still runs"
    assert trace.status == "completed" and trace.answer == "finished", trace.error
    assert precious.read_text() == "keep me", "the hook blocked bash: nothing ran"
    (refusal,) = [m for m in messages if m.role == "tool" and m.name == "bash"]
    assert refusal.content == "blocked by the operator's policy: no shell on this fleet today"
    (injected,) = [m for m in messages if m.metadata.get("injected")]
    assert hookkit.CONTEXT_LINE in (injected.content or ""), "the context line reached the model"
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    mine = [e for e in seen if e["trace_id"] == trace_id]
    kinds = [e["event"] for e in mine]
    assert kinds.count("turn_started") == 11 and kinds.count("turn_ended") == 10
    tools = [e["tool"] for e in mine if e["event"] == "tool_finished"]
    assert tools[:3] == ["goal", "goal", "bash"] and len(tools) == 10
    assert [e["goal"] for e in mine if e["event"] == "goal_completed"] == ["tidy the workspace"]
    assert [e["tool"] for e in mine if e["event"] == "from_entry_point"] == tools, (
        "the entry point's hook ran on the worker too"
    )
    # RAISER raised and HANGER hung on every tool call: the run went on regardless.


def test_fleet_up_refuses_a_hook_distribution_an_agent_planted_in_its_workspace(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = workspace / "imported.txt"
    (workspace / "planted_hook_abc.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from fleet.observe.hooks import Hooks\nHOOK = Hooks()\n"
    )
    # `python -m` puts the working directory on sys.path: an agent's *.dist-info there
    # would be an installed package to importlib.metadata.
    hookkit.write_dist(workspace, "helpful-audit", {"audit": "planted_hook_abc:HOOK"})
    up = subprocess.run(
        [*FLEET, "up"],
        env=up_env(workspace, FLEET_WORKSPACE=str(workspace)),
        cwd=workspace,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    line = assert_one_line_error(up)
    assert "fleet.hooks entry point 'audit' of 'helpful-audit'" in line
    assert "inside a workspace root" in line
    assert not marker.exists(), "nothing of it ran"
    assert not up_state_dir(workspace).exists(), "no state folder, no Redis: nothing started"
