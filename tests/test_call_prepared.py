"""A run's prepared model-call inputs (`fleet.loop.call.Prepared`) follow what may change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessFleet
from fleet.loop.call import prepare
from fleet.loop.toolcalls import tool_schemas
from fleet.settings import Settings
from fleet.storage.writes import InboxSeen
from fleet.testing import ScriptedModel, text


def names(tools: list[dict[str, Any]]) -> set[str]:
    return {t["function"]["name"] for t in tools}


def test_the_tools_follow_the_inbox_and_the_registry_as_per_call_schemas_do(
    tmp_path: Path,
) -> None:
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}), clients={"test": ScriptedModel([text("done")])}
    )
    runtime = local.runtime
    trace = create_root(runtime, TaskSpec(task="work", model="test"))
    prepared = prepare(runtime, trace, "test")
    assert prepared.tools(trace, None) == tool_schemas(runtime, trace)  # the same list
    assert "check_messages" not in names(prepared.tools(trace, InboxSeen(None)))
    assert "check_messages" in names(prepared.tools(trace, InboxSeen("1-0"))), "mail came"
    # A tool listed mid-run (an MCP server's listing changed): the next call is offered it.
    schema = {"type": "object", "properties": {}}
    runtime.tools.register_schema("late_tool", "listed mid-run", schema, read_only=True)
    assert "late_tool" in names(prepared.tools(trace, InboxSeen(None)))
    assert prepared.tools(trace, None) == tool_schemas(runtime, trace)
