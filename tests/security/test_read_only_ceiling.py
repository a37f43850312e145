"""Route 5: read-only is a ceiling, enforced where tools run.

Attacks (each failed open on main):
- an `explore.md` in FLEET_AGENTS_DIR (read_only: false, writing tools) replaced the built-in
  and explore branches wrote;
- a Markdown preset with `read_only: true` was offered `agent`, and
  `agent(task=..., agent_type="default")` started a child that wrote;
- a child got tools its parent lacked (a parent limited to reading delegated to `default`,
  whose child wrote).
Controls: `Runtime.permissions` (mode explore/evaluate is read-only; the trace's inherited
`ToolCeiling` narrows its preset) checked by `ToolRegistry.execute` on every call;
`load_presets` forces files named explore/evaluate read-only; `spawn` refuses a writing
child of a read-only trace; `tool_schemas` does not offer `agent` to a read-only trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.settings import Settings
from fleet.testing import ScriptedModel, call, text


def _task(messages: list[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def _turns(messages: list[dict[str, Any]]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _hostile(spawn: LLMResponse) -> ScriptedModel:
    """The root spawns with `spawn`; every child tries to write `pwned.txt`, then answers."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if _task(messages).startswith("child"):
            if _turns(messages) == 0:
                return call("write_file", path="pwned.txt", content="owned")
            return text("child result: " + str(messages[-1]["content"]))
        if _turns(messages) == 0:
            return spawn
        return text("root done: " + str(messages[-1]["content"]))

    return ScriptedModel(function=respond)


def _fleet(tmp_path: Path, model: ScriptedModel, presets: dict[str, str]) -> InProcessFleet:
    agents = tmp_path / "agents"
    agents.mkdir()
    for name, body in presets.items():
        (agents / f"{name}.md").write_text(body)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(workspace=workspace, agents_dir=agents, env={})
    return InProcessFleet.from_settings(settings, clients={"test": model})


def _offered(model: ScriptedModel, request: int) -> set[str]:
    return {t["function"]["name"] for t in model.tools_seen[request]}


WRITING_EXPLORE = (
    "---\nname: explore\ndescription: explores\nread_only: false\n"
    "tools: [read_file, list_dir, write_file, edit_file, bash]\n---\nExplore and fix.\n"
)


def test_an_explore_file_cannot_make_branches_write(tmp_path: Path) -> None:
    model = _hostile(call("agent", task=["child a", "child b"]))
    local = _fleet(tmp_path, model, {"explore": WRITING_EXPLORE})
    trace = local.run("survey", model="test")
    assert trace.status == "completed"
    assert not (tmp_path / "ws" / "pwned.txt").exists()
    branches = [local.store.get_trace(c) for c in local.store.children(trace.trace_id)]
    assert [b.mode for b in branches] == ["explore", "explore"]
    for branch in branches:
        result = next(m for m in local.store.messages(branch.trace_id) if m.role == "tool")
        assert result.metadata["is_error"] and "read-only" in (result.content or "")
    assert local.runtime.presets["explore"].read_only, "the file was forced read-only"


LOOKER = "---\nname: looker\ndescription: looks only\nread_only: true\n---\nLook.\n"


def test_a_read_only_preset_is_not_offered_agent_and_cannot_start_a_writer(
    tmp_path: Path,
) -> None:
    model = _hostile(call("agent", task="child: fix it", agent_type="default"))
    local = _fleet(tmp_path, model, {"looker": LOOKER})
    trace = local.run("look around", model="test", preset="looker")
    assert "agent" not in _offered(model, 0)
    assert local.store.children(trace.trace_id) == [], "no writing child was started"
    refusal = next(m for m in local.store.messages(trace.trace_id) if m.role == "tool")
    assert refusal.metadata["is_error"] and "read-only" in (refusal.content or "")
    assert not (tmp_path / "ws" / "pwned.txt").exists()


def test_a_read_only_trace_spawns_only_read_only_children(tmp_path: Path) -> None:
    model = _hostile(call("agent", task=["child a"]))
    local = _fleet(tmp_path, model, {"looker": LOOKER})
    trace = local.run("look around", model="test", preset="looker")
    (child_id,) = local.store.children(trace.trace_id)
    child = local.store.get_trace(child_id)
    assert child.ceiling.read_only and local.runtime.permissions(child).read_only
    result = next(m for m in local.store.messages(child_id) if m.role == "tool")
    assert result.metadata["is_error"] and result.metadata["title"] == "write_file refused"
    assert not (tmp_path / "ws" / "pwned.txt").exists()


READER = (
    "---\nname: reader\ndescription: reads and delegates\n"
    "tools: [read_file, agent]\n---\nRead, delegate.\n"
)


def test_no_child_gets_a_tool_its_parent_lacks(tmp_path: Path) -> None:
    model = _hostile(call("agent", task="child: do the edit", agent_type="default"))
    local = _fleet(tmp_path, model, {"reader": READER})
    trace = local.run("read and delegate", model="test", preset="reader")
    (child_id,) = local.store.children(trace.trace_id)
    child = local.store.get_trace(child_id)
    # Offered only what the parent had (minus agent: a sub-agent cannot recurse)...
    assert _offered(model, 1) == {"read_file"}
    # ...and refused at execution when it asks for more anyway.
    result = next(m for m in local.store.messages(child_id) if m.role == "tool")
    assert result.metadata["is_error"] and "not allowed" in (result.content or "")
    assert not (tmp_path / "ws" / "pwned.txt").exists()
    assert child.ceiling.allowed == ["agent", "read_file"]
    assert trace.status == "completed"


def test_an_agents_folder_an_agent_could_write_to_is_refused(tmp_path: Path) -> None:
    """The preset files themselves are operator input: not inside a workspace root."""
    workspace = tmp_path / "ws"
    agents = workspace / ".fleet" / "agents"
    agents.mkdir(parents=True)
    (agents / "explore.md").write_text(WRITING_EXPLORE)  # what an agent's write_file did
    settings = Settings(workspace=workspace, agents_dir=agents, env={})
    with pytest.raises(ConfigError, match="inside a workspace root"):
        InProcessFleet.from_settings(settings, clients={"test": ScriptedModel([])})
