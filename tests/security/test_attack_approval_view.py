"""Attacks on what an approver sees (issue 39, item 2): 2,000 harmless characters before the
real `path` of a `write_file`, escape sequences in the call, an approval for another call.

Driven as a person would: `fleet run` on a pseudo-terminal (the `pty` module) against a
real worker and Redis, `fleet trace list --waiting`, `fleet approve --digest`, and the
function behind `GET /api/approvals`. Every answer here is a denial or a refusal: the
hostile file is never written.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.conversation import approval
from fleetops.serve.api_approvals import waiting_approvals
from tests.fleetkit import wait_until
from tests.procs import WorkerProcess, read_until_exit
from tests.test_fleet_recovery import database_url, fleet_client, start_workers

pytestmark = pytest.mark.integration

VIEW_DB = 3
FLEET = [sys.executable, "-m", "fleetops.cli.main"]
TIMEOUT_S = 60.0
PADDING = "harmless release notes. " * 84  # 2,016 characters a person scrolls past
REAL_PATH = "hooks/../sitecustomize.py"
"""Where the write really lands: nothing an approver who read 2,000 characters saw."""
CLEAR_SCREEN = "\x1b[2J\x1b[H"
HIDDEN = "\x1b[8m" + "invisible\u202e" + "\x1b[0m"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("approval-view")
    (home / "fleet.yaml").write_text(yaml.safe_dump({"approve": ["write_file"]}))
    (home / "workspace").mkdir()
    return home


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, VIEW_DB)


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
        yield start_workers(stack, url, 1, concurrency=2, env_extra=operator_env(url, home))


@pytest.fixture
def fleet(url: str, home: Path, workers: list[WorkerProcess]) -> Iterator[Fleet]:
    with fleet_client(url, url, home / "workspace") as client:
        yield client


def padded_writer(path: Path) -> str:
    """A model whose one call hides its target behind 2,000 characters and escapes."""
    arguments = {"content": CLEAR_SCREEN + HIDDEN + PADDING, "path": REAL_PATH}
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "write_file", "arguments": arguments}]},
        {"content": "tool said: {last_tool}"},
    ]
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    return f"scripted:{path}"


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


def read_until(controller: int, marker: str, timeout_s: float) -> str:
    """What the child wrote to its terminal up to and including `marker`."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while marker.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} on the terminal: {seen.decode(errors='replace')!r}"
        ready, _, _ = select.select([controller], [], [], left)
        if ready:
            seen += os.read(controller, 65536)
    return seen.decode(errors="replace")


def test_the_terminal_prompt_shows_the_real_path_and_no_escape_runs(
    url: str, home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    target = home / "workspace" / "sitecustomize.py"
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    process = subprocess.Popen(
        [*FLEET, "run", "--model", padded_writer(tmp_path / "m.yaml"), "update the notes"],
        env=env | operator_env(url, home) | {"TERM": "xterm"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    answered = False
    try:
        screen = read_until(controller, "approve? [y/n]", TIMEOUT_S)
        before_prompt = screen.split("approve? [y/n]")[0]
        assert REAL_PATH in before_prompt, "the approver never saw where the write lands"
        assert "more characters" in before_prompt, "a cut without a marker"
        assert CLEAR_SCREEN not in screen and "\x1b[8m" not in screen and "\u202e" not in screen
        assert "\\u001b[2J" in before_prompt, "the escape is shown, not obeyed"
        (waiting,) = fleet.waiting()
        digest = approval.pending(waiting)["digest"]  # type: ignore[index]
        assert digest in before_prompt
        os.write(controller, b"n\n")
        answered = True
    finally:
        if not answered:
            process.kill()  # no answer to give: the run ends, the call stays unrun
        read_until_exit(controller, process, TIMEOUT_S)
    assert not target.exists()


def test_the_listing_and_the_api_show_it_and_another_digest_is_refused(
    url: str, home: Path, fleet: Fleet, tmp_path: Path
) -> None:
    target = home / "workspace" / "sitecustomize.py"
    run = cli(url, home, "run", "--model", padded_writer(tmp_path / "m.yaml"), "notes")
    assert run.returncode == 3, run.stdout + run.stderr
    trace_id = run.stderr.split("submitted ", 1)[1].split()[0]
    assert REAL_PATH in run.stderr and CLEAR_SCREEN not in run.stderr
    pending = approval.pending(fleet.trace(trace_id))
    assert pending is not None
    listed = cli(url, home, "trace", "list", "--waiting")
    assert REAL_PATH in listed.stdout and pending["digest"] in listed.stdout
    assert "more characters" in listed.stdout and "\x1b" not in listed.stdout
    as_json = json.loads(cli(url, home, "trace", "list", "--waiting", "--json").stdout)
    (row,) = [r for r in as_json if r["trace_id"] == trace_id]
    assert REAL_PATH in row["shown"] and row["digest"] == pending["digest"]
    (api,) = [a for a in waiting_approvals(fleet, 50) if a["trace_id"] == trace_id]
    assert REAL_PATH in api["shown"] and api["digest"] == pending["digest"]
    assert "\x1b" not in api["shown"] and "\u202e" not in api["shown"]
    forged = cli(url, home, "approve", trace_id, "--digest", "0" * 32)
    assert forged.returncode == 2, forged.stdout + forged.stderr
    (line,) = forged.stderr.strip().splitlines()
    assert line.startswith("fleet: error: ") and "not the call" in line
    assert approval.pending(fleet.trace(trace_id)) is not None, "still waiting, nothing ran"
    denied = cli(url, home, "deny", trace_id, "no", "--digest", pending["digest"])
    assert denied.returncode == 0, denied.stderr
    wait_until(lambda: fleet.trace(trace_id).is_terminal, TIMEOUT_S, "the tree to end")
    assert not target.exists()
