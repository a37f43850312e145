"""Tool calls that wait for `fleet approve` / `fleet deny`, on a real worker and a real Redis."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from fleet.client import Fleet, Handle
from fleet.conversation import approval
from fleet.models import Trace
from fleet.storage import keys
from tests.fleetkit import wait_until
from tests.procs import WorkerProcess, read_until_exit
from tests.test_fleet_recovery import database_url, fleet_client, start_workers

pytestmark = pytest.mark.integration

APPROVAL_DB = 5
FLEET = [sys.executable, "-m", "fleetops.cli.main"]
TIMEOUT_S = 60.0
SETTLED_BY_THE_BRANCH_S = 10.0


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's folder (fleet.yaml) beside the only workspace root."""
    home = tmp_path_factory.mktemp("approval")
    secrets = {"tool": "read_file", "arguments": {"path": "secret*"}}
    (home / "fleet.yaml").write_text(yaml.safe_dump({"approve": ["write_file", secrets]}))
    (home / "workspace").mkdir()
    return home


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, APPROVAL_DB)


def operator_env(url: str, home: Path) -> dict[str, str]:
    workspace = str(home / "workspace")
    return {
        "FLEET_REDIS_URL": url,
        "FLEET_WORKSPACE": workspace,
        "FLEET_WORKSPACE_ROOTS": workspace,
        "FLEET_CONFIG": str(home / "fleet.yaml"),
        "FLEET_ALLOW_SCRIPTED": "1",
    }


@pytest.fixture(scope="module")
def workers(url: str, home: Path) -> Iterator[list[WorkerProcess]]:
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 1, concurrency=4, env_extra=operator_env(url, home))


@pytest.fixture
def fleet(url: str, home: Path, workers: list[WorkerProcess]) -> Iterator[Fleet]:
    with fleet_client(url, url, home / "workspace") as client:
        yield client


def cli(url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [*FLEET, *args],
        env=env | operator_env(url, home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def writer(path: Path, name: str, content: str) -> str:
    """A scripted model that writes `name` once, then answers with the tool's result."""
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": name, "content": content}}]},
        {"content": "tool said: {last_tool}"},
    ]
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    return f"scripted:{path}"


def waiting_run(url: str, home: Path, model: str, task: str) -> Trace:
    """`fleet run` off a terminal: it ends with exit 3, the trace waiting for approval."""
    run = cli(url, home, "run", "--model", model, task)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "fleet approve" in run.stderr and "approve write_file" in run.stderr
    trace_id = run.stderr.split("submitted ", 1)[1].split()[0]
    with fleet_client(url, url, home / "workspace") as client:
        return client.trace(trace_id)


def one_line_error(result: subprocess.CompletedProcess[str], part: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: ") and part in lines[0], lines


def results_of(fleet: Fleet, trace_id: str, call_id: str) -> int:
    return sum(
        m.tool_call_id == call_id for m in fleet.store.messages(trace_id) if m.role == "tool"
    )


def test_write_file_waits_unwritten_and_fleet_approve_writes_it_once(
    url: str, home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    target = home / "workspace" / "approved.txt"
    trace = waiting_run(url, home, writer(tmp_path / "m.yaml", target.name, "yes"), "write")
    pending = approval.pending(trace)
    assert trace.status == "waiting" and pending is not None and not target.exists()
    assert pending["arguments"] == {"path": "approved.txt", "content": "yes"}
    (entry,) = fleet.store.collaborators(trace.trace_id)
    assert (entry.type, entry.status) == ("approval", "waiting")
    with redis.Redis.from_url(url) as conn:
        assert not conn.exists(keys.lease(trace.trace_id)), "no runner holds it"
        assert conn.zscore(keys.RUNNING, trace.trace_id) is None
    listed = cli(url, home, "trace", "list", "--waiting")
    assert trace.trace_id in listed.stdout and "approve write_file" in listed.stdout
    approved = cli(url, home, "approve", trace.trace_id, "--id", pending["tool_call_id"])
    assert approved.returncode == 0, approved.stderr
    wait_until(lambda: fleet.trace(trace.trace_id).is_terminal, TIMEOUT_S, "the tree to end")
    done = fleet.trace(trace.trace_id)
    assert done.status == "completed" and target.read_text() == "yes"
    assert "tool said: created approved.txt" in (done.answer or ""), done.answer
    target.unlink()  # a second run of the call would write it again
    one_line_error(cli(url, home, "approve", trace.trace_id), "no approval pending")
    one_line_error(cli(url, home, "deny", trace.trace_id, "late"), "no approval pending")
    assert not target.exists() and results_of(fleet, trace.trace_id, pending["tool_call_id"]) == 1


def test_fleet_deny_gives_the_model_the_reason_and_writes_nothing(
    url: str, home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    target = home / "workspace" / "denied.txt"
    trace = waiting_run(url, home, writer(tmp_path / "m.yaml", target.name, "no"), "write")
    denied = cli(url, home, "deny", trace.trace_id, "not on a Friday")
    assert denied.returncode == 0, denied.stderr
    wait_until(lambda: fleet.trace(trace.trace_id).is_terminal, TIMEOUT_S, "the tree to end")
    done = fleet.trace(trace.trace_id)
    assert done.status == "completed" and "not on a Friday" in (done.answer or "")
    assert not target.exists()
    one_line_error(cli(url, home, "approve", trace.trace_id), "no approval pending")
    assert not target.exists()
    assert fleet.store.collaborators(trace.trace_id)[0].status == "failed"


def test_on_a_terminal_fleet_run_asks_y_or_n(
    url: str, home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    target = home / "workspace" / "prompted.txt"
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    model = writer(tmp_path / "m.yaml", target.name, "from the prompt")
    process = subprocess.Popen(
        [*FLEET, "run", "--model", model, "write at the terminal"],
        env=env | operator_env(url, home) | {"TERM": "xterm"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    wait_until(lambda: bool(fleet.waiting()), TIMEOUT_S, "the approval")
    os.write(controller, b"y\n")
    screen = read_until_exit(controller, process, TIMEOUT_S)
    assert process.returncode == 0, screen
    assert "approve? [y/n]" in screen and "tool said: created prompted.txt" in screen
    assert target.read_text() == "from the prompt"


def read(path: str, then: str) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]},
        {"content": then + " {last_tool}"},
    ]


def test_a_branch_waits_alone_and_its_approval_completes_the_tree(
    url: str, home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    workspace = home / "workspace"
    (workspace / "secret-plan.txt").write_text("the secret plan")
    (workspace / "notes.txt").write_text("plain notes")
    explore = {"name": "agent", "arguments": {"task": ["look at the plan", "look at the notes"]}}
    scripts = [
        {"match": "^survey", "steps": [{"tool_calls": [explore]}, {"content": "{last_tool}"}]},
        {"match": "plan", "steps": read("secret-plan.txt", "plan:")},
        {"match": "notes", "steps": read("notes.txt", "notes:")},
    ]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"scripts": scripts}))
    run = cli(url, home, "run", "--model", f"scripted:{tmp_path / 'm.yaml'}", "survey the ws")
    assert run.returncode == 3, run.stdout + run.stderr  # off a terminal: nobody to ask
    root = Handle(run.stderr.split("submitted ", 1)[1].split()[0], fleet)

    def branches() -> list[Trace]:
        ids = [c.trace_id for c in fleet.store.collaborators(root.trace_id)]
        return [fleet.trace(i) for i in ids]

    wait_until(
        lambda: [t.status for t in branches()] == ["waiting", "completed"],
        TIMEOUT_S,
        "the plan's branch to wait for approval, the notes' branch to finish",
    )
    plan, _ = branches()
    assert f"fleet approve {plan.trace_id}" in run.stderr, run.stderr
    pending = approval.pending(plan)
    assert pending is not None and pending["arguments"] == {"path": "secret-plan.txt"}
    assert fleet.trace(root.trace_id).status == "waiting", "the root waits on its branch"
    approved = cli(url, home, "approve", plan.trace_id, "--id", pending["tool_call_id"])
    assert approved.returncode == 0, approved.stderr
    # Settled by the branch's own run (a sweeper's owner check would take >= 15 s).
    done = root.wait(timeout_s=SETTLED_BY_THE_BRANCH_S)
    assert done.status == "completed", done.error
    answer = done.answer or ""
    assert "2 branches, 2 completed" in answer, answer
    assert "the secret plan" in answer and "plain notes" in answer, answer


def test_the_trees_wall_time_ends_an_approval_wait_as_a_denial(
    home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    from fleet.limits.budget import Budget

    target = home / "workspace" / "late.txt"
    model = writer(tmp_path / "m.yaml", target.name, "too late")
    handle = fleet.submit("write late", model=model, budget=Budget(wall_s=2))
    wait_until(lambda: bool(fleet.waiting()), TIMEOUT_S, "the approval")
    pending = approval.pending(fleet.trace(handle.trace_id))
    assert pending is not None and pending["ends"] == "budget"
    done = handle.wait(timeout_s=TIMEOUT_S)  # a sweeper ends the wait when wall_s runs out
    assert done.status == "completed" and done.run.stop_reason == "budget", done
    assert not target.exists(), "the call never ran"
    entry = fleet.store.collaborators(done.trace_id)[0]
    assert (entry.type, entry.status) == ("approval", "failed")
    assert "Not run" in entry.summary
