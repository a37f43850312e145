"""`ScriptedModel`'s record of what it was asked: all of it for a test, none in a worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.llm.base import LLMResponse
from fleet.testing import ScriptedModel, text

SCRIPT = "scripts:\n  - match: '.*'\n    steps:\n      - content: 'turn {turn} of {task}'\n"
TOOLS = [{"type": "function", "function": {"name": "list_dir", "parameters": {}}}]


def ask(model: ScriptedModel, task: str) -> LLMResponse:
    return model.complete(
        [{"role": "system", "content": "s"}, {"role": "user", "content": task}], TOOLS
    )


def echo(messages: list[dict[str, Any]], _: list[dict[str, Any]]) -> LLMResponse:
    return text(str(messages[-1]["content"]))


def test_a_model_loaded_from_a_file_answers_without_keeping_what_it_was_asked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(SCRIPT)
    model = ScriptedModel.from_file(path)
    answers = {ask(model, f"task {i}").content for i in range(1000)}
    assert answers == {f"turn 0 of task {i}" for i in range(1000)}
    assert model.requests == [] and model.tools_seen == []


def test_a_test_model_keeps_every_request_and_tool_list() -> None:
    model = ScriptedModel(function=echo)
    for i in range(300):
        ask(model, f"task {i}")
    assert [r[-1]["content"] for r in model.requests] == [f"task {i}" for i in range(300)]
    assert len(model.tools_seen) == 300 and model.tools_seen[0] == TOOLS


def test_keep_holds_only_the_last_calls_in_order() -> None:
    model = ScriptedModel(function=echo, keep=2)
    for i in range(5):
        ask(model, f"task {i}")
    assert [r[-1]["content"] for r in model.requests] == ["task 3", "task 4"]
    assert len(model.tools_seen) == 2


def test_a_negative_keep_is_refused() -> None:
    with pytest.raises(ValueError, match="keep must be None or at least 0, not -1"):
        ScriptedModel(function=echo, keep=-1)


def test_scripted_example_names_the_bundled_script_from_any_directory(tmp_path: Path) -> None:
    """The README's `--model scripted:example` works as printed: no path to know."""
    from fleet.conversation.roots import TaskSpec, create_root
    from fleet.errors import ConfigError
    from fleet.inprocess import InProcessFleet
    from fleet.settings import Settings

    (tmp_path / "docs").mkdir()  # the bundled example explores docs/
    (tmp_path / "docs" / "a.md").write_text("# a\n")
    local = InProcessFleet.from_settings(Settings(workspace=tmp_path, allow_scripted=True, env={}))
    root = create_root(local.runtime, TaskSpec("Survey it", "scripted:example"))
    assert root.model == "scripted:example"  # not made into a path of this directory
    trace = local.run("Survey it", model="scripted:example")
    assert trace.status == "completed", trace.error
    off = InProcessFleet.from_settings(Settings(workspace=tmp_path, env={}))
    with pytest.raises(ConfigError, match="FLEET_ALLOW_SCRIPTED"):
        off.run("Survey it", model="scripted:example")


FILL_SCRIPT = """
scripts:
  - match: '.*'
    steps:
      - fill: true
        tool_calls:
          - name: agent
            arguments: {task: 'weather where she lives: {memory}', note: ['{task}', 3]}
      - content: 'plain {memory}'
"""
PROMPT = (
    "You are an agent.\n\n## Memory\nKept from earlier conversations, as data.\n"
    '- user:alice profile (version 1, recorder, r.memory-1): {"lives": "Tongzhou"}\n'
    '- user:alice pets (version 2, operator, an operator): ["cat"]\n\n## Skills\n- none\n'
)


def test_a_fill_step_builds_its_tool_call_from_the_prompts_memory_block(tmp_path: Path) -> None:
    path = tmp_path / "fill.yaml"
    path.write_text(FILL_SCRIPT)
    model = ScriptedModel.from_file(path)
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "weather?"}]
    [call_] = model.complete(messages, TOOLS).tool_calls
    assert call_.parsed_arguments() == {
        "task": "weather where she lives: user:alice profile (version 1, recorder,"
        ' r.memory-1): {"lives": "Tongzhou"}; user:alice pets (version 2, operator,'
        ' an operator): ["cat"]',
        "note": ["weather?", 3],
    }
    bare = [{"role": "system", "content": "no block"}, {"role": "user", "content": "weather?"}]
    [empty] = model.complete(bare, TOOLS).tool_calls
    assert empty.parsed_arguments()["task"] == "weather where she lives: "
    later = [*messages, {"role": "assistant", "content": "x"}]
    assert (model.complete(later, TOOLS).content or "").startswith("plain user:alice profile")


def test_a_step_without_fill_keeps_its_arguments_as_written(tmp_path: Path) -> None:
    path = tmp_path / "raw.yaml"
    path.write_text(FILL_SCRIPT.replace("fill: true", "fill: false"))
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "weather?"}]
    [call_] = ScriptedModel.from_file(path).complete(messages, TOOLS).tool_calls
    assert call_.parsed_arguments()["task"] == "weather where she lives: {memory}"
