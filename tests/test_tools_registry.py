from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest

from fleet.errors import ConfigError, ToolError
from fleet.presets import BUILTIN_PRESETS, AgentPreset
from fleet.tools import registry as registry_module
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.registry import ToolRegistry, default_registry
from fleet.tools.schema import json_schema, parse_docstring

DEFAULT = BUILTIN_PRESETS["default"]
EXPLORE = BUILTIN_PRESETS["explore"]


def search(
    ctx: ToolContext,
    query: str,
    limit: int = 10,
    ratio: float = 0.5,
    exact: bool = False,
    tags: list[str] | None = None,
    mode: Literal["fast", "deep"] = "fast",
    extra: dict[str, int] | None = None,
) -> ToolResult:
    """Search the index.

    Results are ranked by score.

    Args:
        ctx: Where it runs.
        query: What to look for.
        limit: Most results to return;
            more are dropped.
        ratio: Minimum score.
        exact: Match whole words only.
        tags: Only documents with these tags.
        mode: How hard to look.
        extra: Per-field boosts.

    Returns:
        The matches.
    """
    shown = {"query": query, "limit": limit, "ratio": ratio, "exact": exact}
    shown |= {"tags": tags, "mode": mode, "extra": extra}
    return ToolResult(title="search", output=repr(shown))


def crash(ctx: ToolContext) -> ToolResult:
    """Always fails with a bug.

    Args:
        ctx: Where it runs.
    """
    raise KeyError("boom")


def refuse(ctx: ToolContext) -> ToolResult:
    """Always refuses.

    Args:
        ctx: Where it runs.
    """
    raise ToolError("no, because reasons")


def chatty(ctx: ToolContext) -> ToolResult:
    """Prints too much.

    Args:
        ctx: Where it runs.
    """
    return ToolResult(title="chatty", output="y" * 1000)


@pytest.fixture
def registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.register(search, read_only=True)
    reg.register(crash, read_only=True)
    reg.register(refuse, read_only=True)
    reg.register(chatty, read_only=True)
    return reg


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path)


# --- schemas -----------------------------------------------------------------------


def test_schema_from_signature_and_docstring(registry: ToolRegistry) -> None:
    [schema] = registry.schemas(["search"])
    assert schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index.\n\nResults are ranked by score.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {
                        "type": "integer",
                        "description": "Most results to return; more are dropped.",
                        "default": 10,
                    },
                    "ratio": {"type": "number", "description": "Minimum score.", "default": 0.5},
                    "exact": {
                        "type": "boolean",
                        "description": "Match whole words only.",
                        "default": False,
                    },
                    "tags": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Only documents with these tags.",
                    },
                    "mode": {
                        "type": "string",
                        "enum": ["fast", "deep"],
                        "description": "How hard to look.",
                        "default": "fast",
                    },
                    "extra": {
                        "type": "object",
                        "additionalProperties": {"type": "integer"},
                        "description": "Per-field boosts.",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (str, {"type": "string"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (
            list[list[str]],
            {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
        ),
        (dict[str, Any], {"type": "object"}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
        (str | None, {"anyOf": [{"type": "string"}, {"type": "null"}]}),
        (
            str | list[str],
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        ),
        (Any, {}),
    ],
)
def test_json_schema_of_types(hint: Any, expected: dict[str, Any]) -> None:
    assert json_schema(hint) == expected


def test_json_schema_refuses_unknown_types() -> None:
    with pytest.raises(TypeError, match=r"no JSON schema"):
        json_schema(Path)


def test_parse_docstring_ignores_other_sections() -> None:
    description, args = parse_docstring(search.__doc__)
    assert description == "Search the index.\n\nResults are ranked by score."
    assert args["limit"] == "Most results to return; more are dropped."
    assert "Returns" not in args


def test_register_refuses_undocumented_parameter() -> None:
    def undocumented(ctx: ToolContext, path: str) -> ToolResult:
        """No Args section."""
        return ToolResult(title="", output=path)

    with pytest.raises(TypeError, match=r"undocumented: \['path'\]"):
        ToolRegistry().register(undocumented, read_only=True)


def test_register_refuses_missing_ctx_and_duplicates(registry: ToolRegistry) -> None:
    def no_ctx(path: str) -> ToolResult:
        """Bad.

        Args:
            path: A path.
        """
        return ToolResult(title="", output=path)

    with pytest.raises(TypeError, match=r"ctx: ToolContext"):
        registry.register(no_ctx, read_only=True)
    with pytest.raises(TypeError, match=r"already registered"):
        registry.register(search, read_only=True)


def test_schemas_of_unknown_tool(registry: ToolRegistry) -> None:
    with pytest.raises(ConfigError, match=r"unknown tool 'nope'"):
        registry.schemas(["nope"])


def test_default_registry_has_every_builtin_tool() -> None:
    registry = default_registry()
    names = "read_file read_image list_dir glob grep write_file edit_file bash web_fetch"
    names += " web_search skill"
    expected = set(names.split())
    assert set(registry.names()) == expected
    for schema in registry.schemas(registry.names()):
        assert schema["function"]["description"]
        for prop in schema["function"]["parameters"]["properties"].values():
            assert prop["description"]


# --- execute -----------------------------------------------------------------------


def test_execute_validates_and_coerces(registry: ToolRegistry, ctx: ToolContext) -> None:
    args = {"query": "q", "limit": "5", "tags": ["a"], "mode": "deep", "extra": {"x": 2}}
    result = registry.execute("search", args, ctx, DEFAULT)
    assert not result.is_error
    assert "'limit': 5," in result.output
    assert "'mode': 'deep'" in result.output


def test_execute_treats_null_optional_as_default(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = registry.execute("search", {"query": "q", "limit": None}, ctx, DEFAULT)
    assert "'limit': 10," in result.output


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument 'query'"),
        ({"query": "q", "colour": "red"}, "unknown argument 'colour'"),
        ({"query": "q", "limit": "many"}, "argument 'limit': Input should be a valid integer"),
        ({"query": 5}, "argument 'query': Input should be a valid string"),
        ({"query": "q", "mode": "slow"}, "argument 'mode': Input should be 'fast' or 'deep'"),
        ({"query": "q", "tags": "a"}, "argument 'tags'"),
    ],
)
def test_execute_reports_bad_arguments(
    registry: ToolRegistry, ctx: ToolContext, arguments: dict[str, Any], message: str
) -> None:
    result = registry.execute("search", arguments, ctx, DEFAULT)
    assert result.is_error
    assert message in result.output


def test_execute_turns_exceptions_into_error_results(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    crashed = registry.execute("crash", {}, ctx, DEFAULT)
    assert crashed.is_error
    assert crashed.output == "KeyError: 'boom'"
    refused = registry.execute("refuse", {}, ctx, DEFAULT)
    assert (refused.is_error, refused.output) == (True, "no, because reasons")


def test_execute_caps_output(registry: ToolRegistry, tmp_path: Path) -> None:
    small = ToolContext(workspace=tmp_path, output_limit_chars=50)
    result = registry.execute("chatty", {}, small, DEFAULT)
    assert result.output == "y" * 50 + "\n… [truncated 950 chars]"


def test_a_tool_that_never_returns_gives_the_slot_back(
    registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def stuck(ctx: ToolContext) -> ToolResult:
        """Wait for ever, as a custom tool with a bug would."""
        release.wait(30)
        return ToolResult(title="late", output="late")

    registry.register(stuck, read_only=True)
    monkeypatch.setattr(registry_module, "TOOL_TIMEOUT_GRACE_S", 0.1)
    try:
        result = registry.execute("stuck", {}, ToolContext(tmp_path, tool_timeout_s=0.2), DEFAULT)
    finally:
        release.set()
    assert result.is_error
    assert result.output == "tool 'stuck' did not finish within 0.2s"


def where(ctx: ToolContext) -> ToolResult:
    """Name the thread it runs in."""
    return ToolResult(title="where", output=threading.current_thread().name)


def test_a_bounded_tool_runs_in_the_agents_thread(tmp_path: Path) -> None:
    """No thread start per call for a tool that ends itself; the backstop for the rest."""
    registry = ToolRegistry()
    registry.register(where, read_only=True, bounded=True)
    registry.register(where, name="where_else", read_only=True)
    ctx = ToolContext(tmp_path)
    here = threading.current_thread().name
    assert registry.execute("where", {}, ctx, DEFAULT).output == here
    assert registry.execute("where_else", {}, ctx, DEFAULT).output == "tool:where_else"


def test_only_self_limiting_built_ins_skip_the_backstop() -> None:
    """A shell's grandchildren, a DNS lookup or a FIFO as a skill file are outside the
    tools' own limits: bash, web_fetch and skill keep their thread."""
    registry = default_registry()
    bounded = {name for name in registry.names() if registry.get(name).bounded}
    files_and_search = {
        "read_file",
        "read_image",
        "list_dir",
        "glob",
        "grep",
        "write_file",
        "edit_file",
    }
    assert bounded == files_and_search


def test_a_fifo_planted_for_a_bounded_tool_does_not_hold_the_slot(tmp_path: Path) -> None:
    """An agent's FIFO in the workspace: the bounded file tools refuse it at once."""
    os.mkfifo(tmp_path / "pipe")
    registry = default_registry()
    ctx = ToolContext(tmp_path, tool_timeout_s=0.5)
    for name, arguments in (
        ("read_file", {"path": "pipe"}),
        ("read_image", {"path": "pipe"}),
        ("edit_file", {"path": "pipe", "old_text": "a", "new_text": "b"}),
        ("write_file", {"path": "pipe", "content": "x"}),
    ):
        started = time.monotonic()
        result = registry.execute(name, arguments, ctx, DEFAULT)
        assert time.monotonic() - started < 5, name
        assert result.is_error, (name, result.output)
    # grep skips it: no error, where reading the FIFO would hang until the timeout (an error).
    # 30 s, not 0.5: its process may take longer than that to start on a loaded machine.
    result = registry.execute("grep", {"pattern": "x"}, replace(ctx, tool_timeout_s=30.0), DEFAULT)
    assert not result.is_error, result.output


def test_execute_unknown_tool(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = registry.execute("nope", {}, ctx, DEFAULT)
    assert result.is_error
    assert "unknown tool 'nope'" in result.output


def test_explore_preset_cannot_write(tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path, allow_shell=True)
    registry = default_registry()
    write = registry.execute("write_file", {"path": "x.txt", "content": "hi"}, ctx, EXPLORE)
    assert write.is_error
    assert write.output == "tool 'write_file' is not allowed for preset 'explore'"
    shell = registry.execute("bash", {"command": "touch y.txt"}, ctx, EXPLORE)
    assert shell.output == "tool 'bash' is not allowed for preset 'explore'"
    assert list(tmp_path.iterdir()) == []


def test_read_only_preset_refuses_writing_tools_even_if_listed(tmp_path: Path) -> None:
    sneaky = AgentPreset(name="sneaky", read_only=True)  # every tool "allowed"
    registry = default_registry()
    ctx = ToolContext(workspace=tmp_path)
    result = registry.execute("write_file", {"path": "x.txt", "content": "hi"}, ctx, sneaky)
    assert result.is_error
    assert "read-only" in result.output
    assert not (tmp_path / "x.txt").exists()
    assert "write_file" not in registry.names_for(sneaky)
    assert "read_file" in registry.names_for(sneaky)


def test_denied_tools_win(tmp_path: Path) -> None:
    preset = AgentPreset(name="careful", denied_tools=frozenset({"edit_file"}))
    registry = default_registry()
    assert "edit_file" not in registry.names_for(preset)
    result = registry.execute("edit_file", {}, ToolContext(workspace=tmp_path), preset)
    assert result.output == "tool 'edit_file' is not allowed for preset 'careful'"


def test_default_preset_can_write(tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path)
    result = default_registry().execute(
        "write_file", {"path": "x.txt", "content": "hi"}, ctx, DEFAULT
    )
    assert not result.is_error
    assert (tmp_path / "x.txt").read_text() == "hi"


def test_external_schemas_are_listed_but_run_by_the_runner(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    params = {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}
    registry.register_schema("agent", "Start a sub-agent.", params, read_only=False)
    assert registry.schemas(["agent"]) == [
        {
            "type": "function",
            "function": {
                "name": "agent",
                "description": "Start a sub-agent.",
                "parameters": params,
            },
        }
    ]
    with pytest.raises(ToolError, match=r"handled by the runner"):
        registry.execute("agent", {"task": "x"}, ctx, DEFAULT)
    refused = registry.execute("agent", {"task": "x"}, ctx, EXPLORE)
    assert refused.output == "tool 'agent' is not allowed for preset 'explore'"


def test_names_for_sees_a_tool_registered_after_it_was_asked() -> None:
    registry = default_registry()
    preset = AgentPreset(name="reader", read_only=True)
    before = registry.names_for(preset)
    before.append("mutated")  # each answer is the caller's own list
    registry.register_schema("lookup", "Look up.", {"type": "object"}, read_only=True)
    assert registry.names_for(preset) == [*before[:-1], "lookup"]
