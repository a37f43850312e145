"""The real `mcp-server-git` (the reference git MCP server, stdio) on a real worker process:
its read-only tools serve a delegate; its writing tools are refused to an explore branch,
and the repository is left as it was."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fleet.client import Fleet
from tests.fleetkit import client, fleet_settings
from tests.mcpkit import write_config
from tests.procs import start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

pytestmark = pytest.mark.integration

GIT_DB = 8
TIMEOUT_S = 60.0
GIT_SERVER = Path(sys.executable).with_name("mcp-server-git")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def calls(name: str, **arguments: object) -> dict[str, object]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


@dataclass
class Setup:
    fleet: Fleet
    repo: Path
    model: str


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    url = database_url(redis_url, GIT_DB)
    operator, repo = tmp_path_factory.mktemp("operator"), tmp_path_factory.mktemp("repo")
    git(repo, "init", "-q")
    (repo / "README.md").write_text("hello\n")
    git(repo, "add", "README.md")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "First commit")
    (repo / "new.txt").write_text("untracked\n")
    entry = {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}
    config = write_config(operator / "fleet.yaml", {"git": entry})
    stage = calls("mcp__git__git_add", repo_path=str(repo), files=["new.txt"])
    answer = {"content": "{last_tool}"}
    rules = [
        {
            "match": "^Show the log",
            "steps": [calls("mcp__git__git_log", repo_path=str(repo)), answer],
        },
        {"match": "^Stage it", "steps": [stage, answer]},
        {"match": "^Main explores", "steps": [calls("agent", task=["Stage it"]), answer]},
    ]
    (operator / "script.yaml").write_text(yaml.safe_dump({"scripts": rules}))
    env = {
        "FLEET_CONFIG": str(config),
        "FLEET_WORKSPACE": str(repo),
        "FLEET_WORKSPACE_ROOTS": str(repo),
        "FLEET_ALLOW_SCRIPTED": "1",
    }
    with start_worker(url, concurrency=4, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=60)
        fleet = client(fleet_settings(url, repo, **env))
        yield Setup(fleet, repo, f"scripted:{operator / 'script.yaml'}")
        fleet.store.close()


def test_a_delegate_reads_the_log_through_mcp_server_git(setup: Setup) -> None:
    trace = setup.fleet.delegate("Show the log", model=setup.model).wait(TIMEOUT_S)

    assert trace.status == "completed", trace.error
    assert trace.answer is not None and "First commit" in trace.answer


def test_an_explore_branch_cannot_stage_and_the_repository_is_unchanged(setup: Setup) -> None:
    before = git(setup.repo, "status", "--porcelain")

    trace = setup.fleet.submit("Main explores", model=setup.model).wait(TIMEOUT_S)

    assert trace.status == "completed", trace.error
    (branch,) = setup.fleet.store.children(trace.trace_id)
    (result,) = [m for m in setup.fleet.store.messages(branch) if m.role == "tool"]
    assert result.metadata["is_error"] is True and "read-only" in str(result.content)
    assert git(setup.repo, "status", "--porcelain") == before == "?? new.txt\n"
