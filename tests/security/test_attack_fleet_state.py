"""Issue 24, route 2 (and the Redis part of 4): the fleet's own state inside a workspace.

`fleet up` kept `.fleet/` in its directory, the default workspace root: an explore branch
grepped Redis's append-only file for another tree's task, read the worker logs, and an
agent rewrote `.fleet/up.json` so the operator's next plain `fleet run` went to the
attacker's Redis; bash reached the embedded Redis over loopback without a password.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from fleet.inprocess import InProcessFleet
from fleet.models import text_of
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleetops.discovery import UP_FILE, UpState
from fleetops.redis_server import RedisServer, start_redis_server
from tests.security.attacker import SECRET_ENV, leaked
from tests.security.conftest import steps_script, tool_step
from tests.test_cli_ops import FLEET, up_env, up_state_dir
from tests.test_supervisor import fleet_up

CONFIDENTIAL = "CONFIDENTIAL-merger-plan-7f3a"
"""A task text another tree ran: it must not reach the attacker's tree."""
RUN_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class LocalFleet:
    """A `fleet up` running for `workspace`, as the README lays it out."""

    workspace: Path
    scripts: Path
    """Scripted models, outside the workspace (a grep there would find their text)."""
    state: UpState
    output: list[str]
    """What `fleet up` printed, read at the end of the module."""


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """`fleet up` in a fresh directory with secrets, scripted models and bash allowed."""
    workspace = tmp_path_factory.mktemp("project").resolve()
    scripts = tmp_path_factory.mktemp("scripts")
    env = {**SECRET_ENV, "FLEET_ALLOW_SHELL": "1", "FLEET_NO_WORKER_TIMEOUT_S": "5"}
    with fleet_up(workspace, "--workers", "1", "--concurrency", "4", **env) as (up, state):
        fleet = LocalFleet(workspace, scripts, state, [])
        done = run(fleet, "remember it", task=f"Summarise {CONFIDENTIAL}", steps=[])
        assert done.returncode == 0, done.stderr  # another tree's task, now in Redis
        yield fleet
        up.terminate()
        fleet.output.append(up.communicate(timeout=60)[0].decode(errors="replace"))


def run(
    fleet: LocalFleet, name: str, task: str, steps: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    """The operator's plain `fleet run` in the fleet's directory: no URL, no state dir given."""
    script = steps_script(fleet.scripts / f"{name}.yaml", steps)
    return subprocess.run(
        [*FLEET, "run", "--json", "--model", f"scripted:{script}", task],
        env=up_env(fleet.workspace, FLEET_ALLOW_SCRIPTED="1", FLEET_NO_WORKER_TIMEOUT_S="5"),
        cwd=fleet.workspace,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def tool_outputs(fleet: LocalFleet, done: subprocess.CompletedProcess[str]) -> list[str]:
    """Every tool result of the trace `fleet run --json` printed."""
    trace_id = json.loads(done.stdout)["trace_id"]
    with RedisStore.from_url(fleet.state.redis_url) as store:
        return [text_of(m.content) for m in store.messages(trace_id) if m.role == "tool"]


STATE_READS = [
    tool_step("grep", pattern=CONFIDENTIAL, path="."),
    tool_step("grep", pattern="redis://|requirepass", path="."),
    tool_step("glob", pattern="**/*"),
    tool_step("list_dir", path=".fleet"),
    tool_step("read_file", path=".fleet/up.json"),
    tool_step("read_file", path=".fleet/logs/worker-1.log"),
    tool_step("bash", command="grep -ra merger . ; cat .fleet/up.json; ls -la"),
]


@pytest.mark.integration
def test_an_agent_finds_no_aof_log_or_up_json_in_the_fleets_directory(
    local_fleet: LocalFleet,
) -> None:
    """Route: a read-only branch grepped `.fleet/redis/` for another tree's task and read
    `.fleet/logs/worker-1.log` and `.fleet/up.json`. Control: the state lives in a 0700
    folder outside every workspace root; the directory holds nothing of the fleet."""
    done = run(local_fleet, "snoop", "look around", STATE_READS)

    assert done.returncode == 0, done.stderr
    outputs = tool_outputs(local_fleet, done)
    assert len(outputs) == len(STATE_READS)
    seen = "\n".join(outputs)
    password = urlsplit(local_fleet.state.redis_url).password or ""
    assert CONFIDENTIAL not in seen and "redis://" not in seen and password not in seen
    assert not leaked(seen)
    state_dir = up_state_dir(local_fleet.workspace)
    assert not state_dir.is_relative_to(local_fleet.workspace)
    assert state_dir.stat().st_mode & 0o777 == 0o700
    assert (state_dir / UP_FILE).stat().st_mode & 0o777 == 0o600


@pytest.mark.integration
def test_an_up_json_written_in_the_workspace_does_not_redirect_fleet_run(
    local_fleet: LocalFleet,
) -> None:
    """Route: an agent rewrote `.fleet/up.json` to name the attacker's Redis; the operator's
    next plain `fleet run` there sent its confidential task to it. Control: commands read
    `up.json` only from the private state folder, keyed by the directory, never from it."""
    with start_redis_server() as attacker:
        forged = forged_state(attacker)
        plant = [
            tool_step("write_file", path=".fleet/up.json", content=forged),
            tool_step("write_file", path=f".local/state/agent-fleet/{UP_FILE}", content=forged),
        ]
        assert run(local_fleet, "plant", "plant it", plant).returncode == 0

        done = run(local_fleet, "victim", f"Review {CONFIDENTIAL} again", [])

        with redis.Redis.from_url(attacker.url) as client:
            assert client.dbsize() == 0, "the operator's task went to the attacker's Redis"
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"


def forged_state(attacker: RedisServer) -> str:
    """An `up.json` as `fleet up` would write it, naming the attacker's Redis."""
    now_ms = int(time.time() * 1000)
    forged = {"pid": 1, "directory": "/", "redis_url": attacker.url, "started_at_ms": now_ms}
    return json.dumps({**forged, "embedded_redis_pid": attacker.process.pid, "ready": True})


@pytest.mark.integration
def test_the_embedded_redis_refuses_clients_without_its_password(
    local_fleet: LocalFleet,
) -> None:
    """Route: bash reached the embedded Redis over loopback, read another tree's task and
    wrote a key. Control: `requirepass` with a random password that reaches the server on
    stdin and the workers in their environment, which bash never sees."""
    port = urlsplit(local_fleet.state.redis_url).port
    probe = f"redis-cli -p {port} ping; redis-cli -p {port} keys '*'; redis-cli -p {port} info"
    done = run(local_fleet, "bash-redis", "poke redis", [tool_step("bash", command=probe)])

    assert done.returncode == 0, done.stderr
    (output,) = tool_outputs(local_fleet, done)
    assert "NOAUTH" in output and "PONG" not in output and "fleet:" not in output
    assert raw_ping(port or 0).startswith(b"-NOAUTH")
    listed = subprocess.run(
        [*FLEET, "trace", "list", "--json"],
        env=up_env(local_fleet.workspace),
        cwd=local_fleet.workspace,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert listed.returncode == 0 and CONFIDENTIAL in listed.stdout, listed.stderr


def raw_ping(port: int) -> bytes:
    """What a client that knows no password hears back to PING."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(100)


@pytest.mark.integration
def test_the_password_is_in_no_argv_log_or_output(local_fleet: LocalFleet) -> None:
    """Where else a password hides: a process's argv (any local user reads it), the fleet's
    logs, what `fleet up` prints. It is in `up.json` (0600) and the workers' environment."""
    password = urlsplit(local_fleet.state.redis_url).password or ""
    assert len(password) >= 32
    redis_pid = local_fleet.state.embedded_redis_pid
    assert password.encode() not in Path(f"/proc/{redis_pid}/cmdline").read_bytes()
    for pid in local_fleet.state.worker_pids:
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    state_dir = up_state_dir(local_fleet.workspace)
    for log in (state_dir / "logs").iterdir():
        assert password not in log.read_text(errors="replace"), log
    assert password not in (state_dir / "redis" / "redis-server.log").read_text()


def test_the_file_tools_refuse_the_state_folder_even_inside_a_root(tmp_path: Path) -> None:
    """Route: an operator whose root holds the state folder (FLEET_WORKSPACE_ROOTS=$HOME,
    say) let agents read `up.json` and the append-only file. Control: the file tools
    refuse the state folders (XDG_STATE_HOME/agent-fleet and FLEET_STATE_DIR) whatever the
    roots say: by real path (links, folders not made yet) and by inode."""
    home = tmp_path / "home"
    custom = home / "custom-state"
    settings = Settings.from_env(
        {
            "FLEET_WORKSPACE": str(home),
            "FLEET_WORKSPACE_ROOTS": str(home),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "FLEET_STATE_DIR": str(custom),
            "FLEET_ALLOW_SCRIPTED": "1",
        }
    )
    state_home = home / ".local" / "state" / "agent-fleet"
    xdg = state_home / "0123456789abcdef"
    for folder in (xdg, custom):
        (folder / "redis").mkdir(parents=True)
        (folder / "redis" / "appendonly.aof").write_text(f"SET task {CONFIDENTIAL}\n")
        (folder / UP_FILE).write_text(f'{{"redis_url": "redis://:{CONFIDENTIAL}@h/0"}}')
    (home / "peek").symlink_to(xdg)
    steps = [
        tool_step("read_file", path=".local/state/agent-fleet/0123456789abcdef/up.json"),
        tool_step("read_file", path="custom-state/redis/appendonly.aof"),
        tool_step("read_file", path="peek/up.json"),
        tool_step("read_file", path=str(custom / UP_FILE)),
        tool_step("grep", pattern=CONFIDENTIAL, path="."),
        tool_step("grep", pattern=CONFIDENTIAL, path="custom-state"),
        tool_step("glob", pattern="**/*.aof"),
        tool_step("list_dir", path="custom-state"),
        tool_step("write_file", path="custom-state/up.json", content="{}"),
        tool_step("write_file", path=".local/state/agent-fleet/new/up.json", content="{}"),
        tool_step("edit_file", path="peek/up.json", old_text="redis", new_text="evil"),
    ]
    local = InProcessFleet.from_settings(settings)

    trace = local.run("snoop", model=f"scripted:{steps_script(tmp_path / 's.yaml', steps)}")

    outputs = [text_of(m.content) for m in local.store.messages(trace.trace_id) if m.role == "tool"]
    assert len(outputs) == len(steps), outputs
    assert not any(CONFIDENTIAL in output for output in outputs), outputs
    assert outputs[4] == outputs[6] == "no matches", outputs
    refused = [i for i, output in enumerate(outputs) if "fleet's own state" in output]
    assert refused == [0, 1, 2, 3, 5, 7, 8, 9, 10], outputs
    assert (custom / UP_FILE).read_text().startswith('{"redis_url"')
    assert not (state_home / "new").exists()


@pytest.mark.parametrize(
    ("where", "roots"),
    [("state", None), (".", None), (None, "..")],
    ids=["state-dir-in-the-directory", "state-dir-is-the-directory", "root-holds-xdg-state"],
)
def test_fleet_up_refuses_a_state_folder_inside_a_workspace_root(
    tmp_path: Path, where: str | None, roots: str | None
) -> None:
    """Route: the state folder inside a root is readable by every agent there. Control:
    `fleet up` refuses it before starting anything: exit 2, one line, no `up.json`."""
    env = up_env(tmp_path)
    if where is not None:
        env["FLEET_STATE_DIR"] = str(tmp_path / where)
    if roots is not None:
        env["FLEET_WORKSPACE_ROOTS"] = str((tmp_path / roots).resolve())

    done = subprocess.run(
        [*FLEET, "up"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )

    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("fleet: error: state folder") and "FLEET_STATE_DIR" in line
    assert "overlaps workspace root" in line and "Traceback" not in done.stderr
    assert not list(tmp_path.rglob(UP_FILE)) and not (up_state_dir(tmp_path) / UP_FILE).exists()
