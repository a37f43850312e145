"""MCP servers are untrusted: what they say stays data, only the operator's servers exist,
and a huge or malformed answer is refused in one clean line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.config.mcp import McpServerConfig
from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.mcp.sessions import McpSessions
from fleet.mcp.tools import MAX_RESULT_CHARS
from fleet.models import Message
from fleet.presets import BUILTIN_PRESETS
from fleet.runtime import operator_config
from fleet.settings import Settings
from fleet.testing import ScriptedModel, call, text
from fleet.tools.base import ToolContext
from tests.mcp_test_server import INJECTION
from tests.mcpkit import RAW_SERVER, listed, server_entry, write_config

DEFAULT = BUILTIN_PRESETS["default"]


@pytest.fixture
def operator(tmp_path: Path) -> Path:
    (tmp_path / "operator").mkdir()
    (tmp_path / "workspace").mkdir()
    return write_config(tmp_path / "operator" / "fleet.yaml", {"test": server_entry()})


def inline(operator: Path, model: ScriptedModel) -> InProcessFleet:
    settings = Settings(
        workspace=operator.parent.parent / "workspace", env={}, config_path=operator
    )
    return InProcessFleet.from_settings(settings, clients={"test": model})


@pytest.fixture
def raw() -> Iterator[McpSessions]:
    servers = {
        mode: McpServerConfig(command=sys.executable, args=("-I", str(RAW_SERVER), mode))
        for mode in ("shape", "garbage")
    }
    sessions = McpSessions(servers, {})
    yield sessions
    sessions.close()


def tool_messages(fleet: InProcessFleet, trace_id: str) -> list[Message]:
    return [m for m in fleet.store.messages(trace_id) if m.role == "tool"]


def test_instructions_in_a_description_or_result_stay_data(operator: Path) -> None:
    model = ScriptedModel([call("mcp__test__inject"), text("done")])
    fleet = inline(operator, model)
    try:
        trace = fleet.run("read the page", model="test")
    finally:
        assert fleet.runtime.mcp is not None
        fleet.runtime.mcp.close()

    assert trace.status == "completed"
    second: list[dict[str, Any]] = model.requests[1]
    system = " ".join(str(m["content"]) for m in second if m["role"] in ("system", "developer"))
    assert INJECTION not in system
    (result,) = [m for m in second if INJECTION in str(m.get("content"))]
    assert result["role"] == "tool"  # the model reads it as a tool's output, nothing more
    # The last turn's tools: the first turn waits at most FIRST_LISTING_WAIT_S for the
    # listing, and a loaded machine may start the server's Python slower than that.
    last = model.tools_seen[-1]
    described = {t["function"]["name"]: t["function"]["description"] for t in last}
    assert described["mcp__test__inject"].startswith("(MCP server 'test') ")


def test_a_server_the_operator_did_not_declare_cannot_be_reached(operator: Path) -> None:
    model = ScriptedModel([call("mcp__evil__x", cmd="id"), text("done")])
    fleet = inline(operator, model)
    try:
        trace = fleet.run("reach evil", model="test")
    finally:
        assert fleet.runtime.mcp is not None
        fleet.runtime.mcp.close()

    (result,) = tool_messages(fleet, trace.trace_id)
    assert result.metadata["is_error"] is True
    assert "unknown tool 'mcp__evil__x'" in str(result.content)
    assert fleet.runtime.mcp.names == ["test"]


def test_a_huge_result_is_refused_and_a_long_one_capped(operator: Path) -> None:
    sessions = McpSessions({"test": McpServerConfig.model_validate(server_entry())}, {})
    ctx = ToolContext(workspace=Path("."), output_limit_chars=1000)
    try:
        registry = listed(sessions, "test")
        huge = registry.execute("mcp__test__huge", {"chars": MAX_RESULT_CHARS + 1}, ctx, DEFAULT)
        long = registry.execute("mcp__test__huge", {"chars": 50_000}, ctx, DEFAULT)
    finally:
        sessions.close()

    assert huge.is_error and huge.output.startswith("refused: the server's result has")
    assert len(huge.output) < 200
    assert (
        not long.is_error and len(long.output) < 1100 and "[truncated 49000 chars]" in long.output
    )


def test_a_malformed_result_is_refused_in_one_line(
    raw: McpSessions, caplog: pytest.LogCaptureFixture
) -> None:
    registry = listed(raw, "shape", "garbage")
    ctx = ToolContext(workspace=Path("."), tool_timeout_s=2.0)

    shape = registry.execute("mcp__shape__bad", {}, ctx, DEFAULT)
    garbage = registry.execute("mcp__garbage__bad", {}, ctx, DEFAULT)

    for result in (shape, garbage):
        assert result.is_error
        assert "\n" not in result.output and len(result.output) < 300, result.output
        assert "PAYLOAD" not in result.output and "Traceback" not in result.output
    assert "malformed" in shape.output
    assert "did not finish within 2s" in garbage.output
    assert "PAYLOAD" not in caplog.text and "xxxxxxxx" not in caplog.text  # nor in the log


def test_a_workspace_fleet_yaml_declaring_servers_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    planted = write_config(workspace / "fleet.yaml", {"evil": {"command": "sh"}})
    monkeypatch.chdir(workspace)  # a worker's working directory is a workspace

    settings = Settings.from_env({"FLEET_WORKSPACE": str(workspace)})
    assert operator_config(settings).mcp_servers == {}

    pointed = Settings.from_env({"FLEET_WORKSPACE": str(workspace), "FLEET_CONFIG": str(planted)})
    with pytest.raises(ConfigError, match="inside a workspace root"):
        operator_config(pointed)
