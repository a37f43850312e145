"""MCP servers as tools, in one process against real stdio servers (`tests/mcp_test_server.py`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fleet.config.mcp import McpServerConfig
from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.llm.cancel import Cancel, cancelling
from fleet.llm.config import load_config
from fleet.mcp.sessions import McpSessions
from fleet.mcp.tools import sync
from fleet.presets import BUILTIN_PRESETS, AgentPreset, load_preset_file
from fleet.settings import Settings
from fleet.testing import ScriptedModel, call, text
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.registry import ToolRegistry
from tests.mcpkit import TEST_SERVER, listed, server_entry, write_config

DEFAULT, EXPLORE = BUILTIN_PRESETS["default"], BUILTIN_PRESETS["explore"]


@pytest.fixture
def sessions() -> Iterator[McpSessions]:
    entry = McpServerConfig.model_validate(server_entry(read_only=["write_note"]))
    started = McpSessions({"test": entry}, {"WORKER_SECRET": "s3cr3t", "GIVEN": "given-value"})
    yield started
    started.close()


@pytest.fixture
def registry(sessions: McpSessions) -> ToolRegistry:
    return listed(sessions, "test")


def run(registry: ToolRegistry, tool: str, preset: AgentPreset, **arguments: Any) -> ToolResult:
    ctx = ToolContext(workspace=Path("."), tool_timeout_s=5.0)
    return registry.execute(tool, arguments, ctx, preset)


def test_fleet_yaml_declares_servers(tmp_path: Path) -> None:
    path = write_config(tmp_path / "fleet.yaml", {"git": {"command": "mcp-server-git"}})
    config = load_config(path, env={})
    assert config.mcp_servers["git"].transport == "stdio"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"command": "x", "url": "https://h/mcp"}, "exactly one of command"),
        ({}, "exactly one of command"),
        ({"url": "http://mcp.example.com/mcp"}, "use https://"),
        ({"url": "ftp://user:hunter2@h/"}, "use https://"),
        ({"command": "x", "env": {"A": "not a name"}}, "invalid worker variable"),
        ({"command": "x", "headers_env": {"Authorization": "T"}}, "headers_env is for HTTP"),
        ({"command": "x", "colour": "red"}, "Extra inputs"),
    ],
)
def test_a_bad_server_entry_is_one_clear_line(
    tmp_path: Path, entry: dict[str, Any], says: str
) -> None:
    path = write_config(tmp_path / "fleet.yaml", {"git": entry})
    with pytest.raises(ConfigError) as raised:
        load_config(path, env={})
    message = str(raised.value)
    assert says in message and "mcp_servers.git" in message and "\n" not in message
    assert "hunter2" not in message


@pytest.mark.parametrize("name", ["a__b", "a_", "_a", "a.b", "a" * 33])
def test_a_server_name_that_would_blur_tool_names_is_refused(tmp_path: Path, name: str) -> None:
    path = write_config(tmp_path / "fleet.yaml", {name: {"command": "x"}})
    with pytest.raises(ConfigError, match="server name"):
        load_config(path, env={})


def test_tools_are_named_by_server_and_hint_read_only(registry: ToolRegistry) -> None:
    offered = registry.names_for(EXPLORE)
    assert "mcp__test__echo" in offered  # readOnlyHint: true
    assert "mcp__test__write_note" in offered  # the operator's read_only list
    assert "mcp__test__grow" in registry.names_for(DEFAULT)
    assert run(registry, "mcp__test__echo", EXPLORE, text="hi").output == "echo: hi"


def test_a_preset_uses_only_the_servers_it_lists(registry: ToolRegistry) -> None:
    other = AgentPreset(name="other", mcp_servers=frozenset({"git"}))
    assert not [n for n in registry.names_for(other) if n.startswith("mcp__")]
    refused = run(registry, "mcp__test__echo", other, text="hi")
    assert refused.is_error and "not allowed" in refused.output


def test_a_preset_file_may_list_servers_and_mcp_tools(tmp_path: Path) -> None:
    path = tmp_path / "gitter.md"
    path.write_text("---\ntools: [read_file, mcp__git__git_status]\nmcp: [git]\n---\nHi")
    preset = load_preset_file(path)
    assert preset.mcp_servers == frozenset({"git"})
    assert preset.allows("mcp__git__git_status") and not preset.allows("mcp__git__git_commit")


def test_a_changed_tool_list_is_read_again(registry: ToolRegistry, sessions: McpSessions) -> None:
    before = registry.generation
    assert not run(registry, "mcp__test__grow", DEFAULT).is_error
    deadline = time.monotonic() + 10
    while "mcp__test__added" not in registry.names() and time.monotonic() < deadline:
        sessions.changed.wait(0.1)  # set by the notification
        sync(registry, sessions)  # what every turn does
    assert run(registry, "mcp__test__added", EXPLORE).output == "added here"
    assert registry.generation > before


def test_a_call_past_its_timeout_is_an_error_result(registry: ToolRegistry) -> None:
    ctx = ToolContext(workspace=Path("."), tool_timeout_s=0.5)
    started = time.monotonic()
    result = registry.execute("mcp__test__slow", {"seconds": 30}, ctx, EXPLORE)
    assert result.is_error and "did not finish within 0.5s" in result.output
    assert time.monotonic() - started < 3
    assert run(registry, "mcp__test__echo", EXPLORE, text="still").output == "echo: still"


def test_a_call_a_stop_cuts_is_abandoned_at_once_and_its_server_told(
    registry: ToolRegistry, sessions: McpSessions, tmp_path: Path
) -> None:
    # A stop cuts the run's tool call (`fleet.loop.cut` cancels its handle): the MCP request
    # must end then, not at its timeout, with the server told, and the session go on.
    handle, mark, outcome = Cancel(), tmp_path / "call", []
    ctx = ToolContext(workspace=Path("."), tool_timeout_s=120.0)

    def call() -> None:
        with cancelling(handle):
            arguments = {"seconds": 120, "mark": str(mark)}
            outcome.append(registry.execute("mcp__test__slow", arguments, ctx, EXPLORE))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    wait_for(lambda: Path(f"{mark}.started").exists(), "the server to start the call")
    assert handle.cancel() == 1, "the call's one abandon"
    thread.join(30)  # 120 s when the request is not abandoned
    assert not thread.is_alive() and outcome[0].is_error
    assert "abandoned: its run was stopped" in outcome[0].output
    wait_for(lambda: Path(f"{mark}.cancelled").exists(), "notifications/cancelled")
    assert run(registry, "mcp__test__echo", EXPLORE, text="on").output == "echo: on"
    assert sessions.starts("test") == 1, "the same session"


def test_a_stop_of_an_inline_run_abandons_its_mcp_call(tmp_path: Path) -> None:
    # The same through the loop: the stop's cut reaches the MCP request in flight.
    (tmp_path / "operator").mkdir()
    (workspace := tmp_path / "workspace").mkdir()
    config = write_config(tmp_path / "operator" / "fleet.yaml", {"test": server_entry()})
    mark = tmp_path / "call"
    model = ScriptedModel([call("mcp__test__slow", seconds=120, mark=str(mark)), text("unused")])
    settings = Settings(workspace=workspace, env={}, config_path=config, tool_timeout_s=180)
    fleet = InProcessFleet.from_settings(settings, clients={"test": model})
    ended: list[str] = []
    runner = threading.Thread(
        target=lambda: ended.append(fleet.run("wait", model="test").status), daemon=True
    )
    try:
        runner.start()
        wait_for(lambda: Path(f"{mark}.started").exists(), "the server to start the call")
        (root,) = [t for t in fleet.store.list_traces(10) if t.parent_trace_id is None]
        fleet.stop(root.trace_id)
        wait_for(lambda: Path(f"{mark}.cancelled").exists(), "notifications/cancelled")
        runner.join(30)
    finally:
        assert fleet.runtime.mcp is not None
        fleet.runtime.mcp.close()
    assert ended == ["stopped"]


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_calls_from_many_threads_share_one_session_concurrently(
    registry: ToolRegistry, sessions: McpSessions
) -> None:
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(
            pool.map(lambda _: run(registry, "mcp__test__slow", EXPLORE, seconds=1.0), range(10))
        )
    elapsed_s = time.monotonic() - started
    assert [r.output for r in results] == ["slow done"] * 10
    assert elapsed_s < 4.0, elapsed_s  # ten 1 s calls at once, not one after another
    assert sessions.starts("test") == 1


def test_a_server_sees_only_the_variables_the_operator_passed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WORKER_SECRET", "s3cr3t")  # in the worker's own environment too
    monkeypatch.chdir(tmp_path)  # a worker's working directory is a workspace
    entry = McpServerConfig.model_validate(
        server_entry(env={"PASSED": "GIVEN"}, env_values={"PLAIN": "p"})
    )
    sessions = McpSessions({"test": entry}, {"WORKER_SECRET": "s3cr3t", "GIVEN": "given-value"})
    try:
        registry = listed(sessions, "test")
        seen = {
            name: run(registry, "mcp__test__getenv", EXPLORE, name=name).output
            for name in ("PASSED", "PLAIN", "WORKER_SECRET", "GIVEN", "FLEET_REDIS_URL")
        }
        started_in = run(registry, "mcp__test__cwd", EXPLORE).output
    finally:
        sessions.close()
    assert seen == {
        "PASSED": "given-value",
        "PLAIN": "p",
        "WORKER_SECRET": "<unset>",
        "GIVEN": "<unset>",
        "FLEET_REDIS_URL": "<unset>",
    }
    assert started_in == "/"  # not the workspace the worker runs in


def test_an_inline_run_starts_servers_only_when_a_trace_needs_tools(tmp_path: Path) -> None:
    (tmp_path / "operator").mkdir()
    (workspace := tmp_path / "workspace").mkdir()
    config = write_config(tmp_path / "operator" / "fleet.yaml", {"test": server_entry()})
    model = ScriptedModel([call("mcp__test__echo", text="inline"), text("done")])
    settings = Settings(workspace=workspace, env={}, config_path=config)
    fleet = InProcessFleet.from_settings(settings, clients={"test": model})
    assert fleet.runtime.mcp is not None and fleet.runtime.mcp.starts("test") == 0
    try:
        trace = fleet.run("echo it", model="test")
    finally:
        fleet.runtime.mcp.close()
    assert trace.status == "completed"
    tool = next(m for m in fleet.store.messages(trace.trace_id) if m.role == "tool")
    assert tool.content == "echo: inline"
    # Offered to the model: at the first turn, or (a first listing past its 5 s wait, as
    # under load) at the next; called either way, the call waiting for the listing.
    offered = [{t["function"]["name"] for t in tools} for tools in model.tools_seen]
    assert any("mcp__test__echo" in names for names in offered), offered


def test_an_unreachable_server_leaves_the_others_working(tmp_path: Path) -> None:
    missing = McpServerConfig(command=str(tmp_path / "no-such-server"))
    good = McpServerConfig.model_validate(server_entry())
    sessions = McpSessions({"gone": missing, "test": good}, {})
    try:
        registry = listed(sessions, "test")
        assert "mcp__test__echo" in registry.names()
        assert not [n for n in registry.names() if n.startswith("mcp__gone__")]
        assert not sessions.due("gone")  # tried again later, not every turn
    finally:
        sessions.close()


def test_a_streamable_http_server_gets_the_headers_the_operator_named(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    token = "http-test-token"
    argv = [sys.executable, str(TEST_SERVER), "--http", str(port), token]
    env = {**os.environ, "PYTHONPATH": str(TEST_SERVER.parent.parent)}
    log = tmp_path / "server.log"  # why it did not answer, if it does not (seen once at load 25)
    with log.open("wb") as out:
        server = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    good = McpServerConfig(url=url, headers_env={"Authorization": "DOCS_AUTH"})
    bad = McpServerConfig(url=url)
    sessions = McpSessions({"docs": good, "nokey": bad}, {"DOCS_AUTH": f"Bearer {token}"})
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _answering(url):
            assert server.poll() is None, log.read_text(errors="replace")[-2000:]
            time.sleep(0.05)
        try:
            registry = listed(sessions, "docs")
        except AssertionError as exc:
            alive = "running" if server.poll() is None else f"exited {server.returncode}"
            raise AssertionError(f"{exc}; the server {alive}: {log.read_text()[-2000:]}") from exc
        assert run(registry, "mcp__docs__echo", EXPLORE, text="web").output == "echo: web"
        assert not [n for n in registry.names() if n.startswith("mcp__nokey__")]  # 401
    finally:
        sessions.close()
        server.terminate()
        server.wait(10)


def _answering(url: str) -> bool:
    """The server's app answers HTTP (any status): a socket that listens is not enough, and a
    first listing that finds no answer is tried again only `RETRY_LISTING_S` later."""
    import httpx

    try:
        httpx.get(url, timeout=5)
    except httpx.TransportError:
        return False
    return True
