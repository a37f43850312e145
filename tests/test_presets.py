from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.memory.config import MEMORY_TOOLS, MemoryUse
from fleet.presets import (
    AGENTS_DIR_ENV,
    BUILTIN_PRESETS,
    AgentPreset,
    get_preset,
    load_preset_file,
    load_presets,
)

RESEARCHER = """\
---
name: researcher
description: Reads code and the web, writes nothing.
tools: [read_file, grep, web_fetch]
denied_tools: [bash]
max_iterations: 12
temperature: 0.2
model: openai:gpt-4o-mini
skills: [planning]
read_only: true
cache: {ttl_s: 3600, keys: [task, context]}
---
You are a careful researcher.

Cite your sources.
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_builtin_presets() -> None:
    default, explore = BUILTIN_PRESETS["default"], BUILTIN_PRESETS["explore"]
    analyst, evaluate = BUILTIN_PRESETS["analyst"], BUILTIN_PRESETS["evaluate"]
    assert (default.allowed_tools, default.max_iterations) == (None, 30)
    assert explore.allowed_tools == frozenset(
        {"read_file", "read_image", "list_dir", "glob", "grep", "skill"}
        | {"memory_read", "memory_search"}  # offered only to a tree bound to memory
    )
    assert (explore.read_only, explore.max_iterations) == (True, 15)
    assert "web_fetch" in (analyst.allowed_tools or set())
    assert (analyst.temperature, analyst.max_iterations) == (0.3, 25)
    assert evaluate.read_only
    assert "VERDICT: pass|fail" in evaluate.system_prompt


@pytest.mark.parametrize(
    ("preset", "tool", "allowed"),
    [
        (AgentPreset(name="all"), "bash", True),
        (AgentPreset(name="some", allowed_tools=frozenset({"grep"})), "grep", True),
        (AgentPreset(name="some", allowed_tools=frozenset({"grep"})), "bash", False),
        (AgentPreset(name="deny", denied_tools=frozenset({"bash"})), "bash", False),
        (
            AgentPreset(
                name="both", allowed_tools=frozenset({"bash"}), denied_tools=frozenset({"bash"})
            ),
            "bash",
            False,
        ),
        (BUILTIN_PRESETS["explore"], "write_file", False),
        (BUILTIN_PRESETS["explore"], "agent", False),
    ],
)
def test_allows(preset: AgentPreset, tool: str, allowed: bool) -> None:
    assert preset.allows(tool) is allowed


def test_markdown_preset_file_loads(tmp_path: Path) -> None:
    preset = load_preset_file(write(tmp_path, "researcher.md", RESEARCHER))
    assert preset == AgentPreset(
        name="researcher",
        description="Reads code and the web, writes nothing.",
        allowed_tools=frozenset({"read_file", "grep", "web_fetch"}),
        denied_tools=frozenset({"bash"}),
        max_iterations=12,
        temperature=0.2,
        skills=("planning",),
        system_prompt="You are a careful researcher.\n\nCite your sources.",
        model="openai:gpt-4o-mini",
        read_only=True,
        cache_ttl_s=3600,
        cache_keys=("task", "context"),
    )


def test_minimal_file_takes_name_from_file_and_defaults(tmp_path: Path) -> None:
    preset = load_preset_file(write(tmp_path, "helper.md", "---\n---\nHelp.\n"))
    assert preset == AgentPreset(name="helper", system_prompt="Help.")


def test_load_presets_adds_files_to_builtins_from_env(tmp_path: Path) -> None:
    write(tmp_path, "researcher.md", RESEARCHER)
    write(tmp_path, "explore.md", "---\nname: explore\nmax_iterations: 5\n---\nLook.\n")
    write(tmp_path, "notes.txt", "not a preset")
    presets = load_presets(None, {AGENTS_DIR_ENV: str(tmp_path)})
    assert set(presets) == {"default", "explore", "analyst", "evaluate", "recorder", "researcher"}
    assert presets["explore"].max_iterations == 5  # a file replaces the built-in


def test_load_presets_without_folder_is_builtins() -> None:
    assert load_presets(None, {}) == dict(BUILTIN_PRESETS)


def test_explicit_folder_wins_over_env(tmp_path: Path) -> None:
    write(tmp_path, "researcher.md", RESEARCHER)
    presets = load_presets(tmp_path, {AGENTS_DIR_ENV: str(tmp_path / "elsewhere")})
    assert "researcher" in presets


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_presets(tmp_path / "nope", {})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no frontmatter here\n", "missing YAML frontmatter"),
        ("---\nname: x\n", "not closed"),
        ("---\nname: [unclosed\n---\n", "invalid YAML frontmatter"),
        ("---\n- a list\n---\n", "must be a mapping"),
        ("---\nmax_iterations: 0\n---\n", "max_iterations: Input should be greater than 0"),
        ("---\ntemperature: 7\n---\n", "temperature: Input should be less than or equal to 2"),
        ("---\ntools: read_file\n---\n", "tools: Input should be a valid list"),
        ("---\ncolour: red\n---\n", "colour: unknown setting"),
        ("---\ntools: [wirte_file]\n---\n", "tools: unknown tool 'wirte_file'"),
        ("---\ncache: {ttl_s: 60}\n---\n", "cache needs keys (its answer) or tools"),
        ("---\nname: 'bad name'\n---\n", "name: String should match pattern"),
    ],
)
def test_bad_frontmatter_is_one_line_with_file(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path, "broken.md", text)
    with pytest.raises(ConfigError) as info:
        load_presets(tmp_path, {})
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert reason in message
    assert "\n" not in message


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    write(tmp_path, "a.md", "---\nname: twin\n---\n")
    write(tmp_path, "b.md", "---\nname: twin\n---\n")
    with pytest.raises(ConfigError, match=r"b\.md: preset 'twin' is also defined in .*a\.md"):
        load_presets(tmp_path, {})


def test_custom_tool_names_can_be_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "db.md", "---\ntools: [sql_query]\n---\n")
    preset = load_preset_file(path, known_tools={"sql_query"})
    assert preset.allowed_tools == frozenset({"sql_query"})


def test_get_preset() -> None:
    presets = load_presets(None, {})
    assert get_preset(presets, "analyst") is BUILTIN_PRESETS["analyst"]
    with pytest.raises(ConfigError) as info:
        get_preset(presets, "x")
    assert str(info.value) == (
        "unknown preset 'x' (known: default, explore, analyst, evaluate, recorder)"
    )


def test_a_preset_file_asks_for_memory(tmp_path: Path) -> None:
    reader = load_preset_file(write(tmp_path, "r.md", "---\nmemory: read\n---\nR.\n"))
    assert reader.memory == MemoryUse("read")
    memory = "memory: {access: write, inject: [profile], record: true}"
    front = f"---\ntools: [read_file]\n{memory}\n---\nW.\n"
    writer = load_preset_file(write(tmp_path, "w.md", front))
    assert writer.memory == MemoryUse("write", ("profile",), record=True)
    assert writer.allowed_tools == frozenset({"read_file", *MEMORY_TOOLS})
    recorder = BUILTIN_PRESETS["recorder"]
    assert recorder.memory.access == "write" and recorder.allowed_tools == MEMORY_TOOLS


@pytest.mark.parametrize(
    "memory",
    ["admin", "{inject: ['a:b']}", "{inject: ['ok'], access: root}", "{extra: 1}"],
)
def test_a_bad_memory_section_is_refused_in_one_line(tmp_path: Path, memory: str) -> None:
    path = write(tmp_path, "bad.md", f"---\nmemory: {memory}\n---\nB.\n")
    with pytest.raises(ConfigError) as refused:
        load_preset_file(path)
    assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)
