"""Prompt files: front matter, `$system$`/`$user$`, `%variables%`, and hostile files.

`fleet run --prompt FILE --var k=v`, `InProcessFleet.run(prompt=..., variables=...)` (as
`Fleet.submit`), batch entries naming one inside their workspace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.batch.file import BatchInputError, check_entries, entries_from
from fleet.batch.values import entry_spec
from fleet.conversation.prompts import MAX_PROMPT_BYTES, load_prompt, parse_vars, render
from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.testing import MemoryStore, ScriptedModel, text

REVIEW = """---
model: test
temperature: 0.7
description: a code review
---
$system$
You review code for %team%.
$user$
Review %file% for thread safety.
"""


class Recording(ScriptedModel):
    """Keeps the temperature of every call."""

    def __init__(self) -> None:
        super().__init__(function=lambda messages, tools: text("reviewed"))
        self.temperatures: list[float | None] = []

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kw: Any
    ) -> LLMResponse:
        self.temperatures.append(kw.get("temperature"))
        return super().complete(messages, tools, **kw)


def local(workspace: Path) -> tuple[InProcessFleet, Recording]:
    model = Recording()
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, MemoryStore(), InProcessDispatcher(), clients={"test": model})
    return InProcessFleet(runtime), model


def test_a_prompt_file_gives_the_task_the_system_part_the_model_and_temperature(
    tmp_path: Path,
) -> None:
    path = tmp_path / "review.prompt"
    path.write_text(REVIEW)
    fleet, model = local(tmp_path)
    trace = fleet.run(prompt=path, variables={"team": "payments", "file": "pool.py"})
    assert trace.status == "completed" and trace.task == "Review pool.py for thread safety."
    assert trace.model == "test", "the front matter's model"
    system, user = model.requests[0][0], model.requests[0][1]
    assert system["role"] == "system" and system["content"].endswith(
        "You review code for payments."
    )
    assert user["content"] == "Review pool.py for thread safety."
    assert model.temperatures == [0.7]


def test_render_fills_each_variable_once_and_without_sections_all_is_the_task() -> None:
    found = render("Say %a% and %a% but keep %b%", {"a": "%b%", "b": "B"}, "x.prompt")
    assert found.user == "Say %b% and %b% but keep B", "a value is never expanded again"
    assert found.system is None and found.model is None


@pytest.mark.parametrize(
    ("content", "variables", "part"),
    [
        (REVIEW, {"team": "x"}, "variable %file% is not given (--var file=...)"),
        (REVIEW, {"team": "x", "file": "y", "tema": "z"}, "names no %tema%"),
        ("hello\n$user$\nhi", {}, "text before the first"),
        ("$user$\na\n$user$\nb", {}, "$user$ appears twice"),
        ("$system$\nonly a system part", {}, "the $user$ part is empty"),
        ("---\nmodel: [1, 2]\n---\nhi", {}, "model"),
        ("---\nshell: rm -rf /\n---\nhi", {}, "shell"),
        ("---\ntemperature: 7\n---\nhi", {}, "temperature"),
        ("---\ntemperature: .nan\n---\nhi", {}, "temperature"),
        ("---\nmodel: x\nhi", {}, "not closed"),
        ("---\n" + "a: " * 1 + "[" * 200 + "]" * 200 + "\n---\nhi", {}, "nest"),
        (
            "---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n"
            "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n---\nhi",
            {},
            "alias",
        ),
    ],
)
def test_a_prompt_that_does_not_fit_is_one_line_naming_the_file(
    tmp_path: Path, content: str, variables: dict[str, str], part: str
) -> None:
    path = tmp_path / "bad.prompt"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_prompt(path, variables)
    message = str(caught.value)
    assert part in message and "\n" not in message, message
    if "prompt" in message:
        assert "bad.prompt" in message


def test_a_huge_or_binary_prompt_file_is_refused_unread(tmp_path: Path) -> None:
    huge = tmp_path / "huge.prompt"
    huge.write_text("x" * (MAX_PROMPT_BYTES + 1))
    binary = tmp_path / "bin.prompt"
    binary.write_bytes(b"\xff\xfe\x00hi")
    with pytest.raises(ConfigError, match="over 262144 bytes"):
        load_prompt(huge)
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_prompt(binary)
    with pytest.raises(ConfigError, match="No such file"):
        load_prompt(tmp_path / "missing.prompt")


def test_a_preset_that_fixes_its_temperature_refuses_another(tmp_path: Path) -> None:
    path = tmp_path / "hot.prompt"
    path.write_text("---\ntemperature: 1.5\n---\nsearch the web")
    fleet, _ = local(tmp_path)
    with pytest.raises(ConfigError, match="preset 'analyst' runs at temperature 0.3 only"):
        fleet.run(prompt=path, preset="analyst", model="test")
    assert fleet.store.list_traces() == [], "nothing was created"


@pytest.mark.parametrize(
    ("pairs", "part"),
    [(["novalue"], "NAME=VALUE"), (["bad-name=1"], "NAME=VALUE"), (["a=1", "a=2"], "twice")],
)
def test_bad_var_flags_are_one_line_errors(pairs: list[str], part: str) -> None:
    with pytest.raises(ConfigError, match=part):
        parse_vars(pairs)
    assert parse_vars(["a=1=2", "b="]) == {"a": "1=2", "b": ""}


# -- batch entries: confined to their workspace, like their images ------------------------


def test_a_batch_entry_names_a_prompt_file_inside_its_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "review.prompt").write_text(REVIEW)
    fleet, _ = local(workspace)
    (entry,) = entries_from(
        [{"prompt": "review.prompt", "variables": {"team": "t", "file": "f.py"}}]
    )
    check_entries(fleet.runtime, [entry], "<batch>")
    spec = entry_spec(fleet.runtime, entry, {})
    assert spec.task == "Review f.py for thread safety." and spec.system == "You review code for t."


@pytest.mark.parametrize(
    ("entry", "part"),
    [
        ({"prompt": "../outside.prompt"}, "outside"),
        ({"prompt": "/etc/passwd"}, "passwd"),
        ({"prompt": "link.prompt"}, "link.prompt"),
        ({"prompt": "review.prompt"}, "variable %file% is not given"),
        ({"prompt": "review.prompt", "task": "x"}, "not both"),
        ({"task": "x", "variables": {"a": "b"}}, "go with a 'prompt'"),
        ({"prompt": "review.prompt", "variables": {"team": 1}}, "variables"),
    ],
)
def test_a_batch_prompt_outside_the_workspace_or_incomplete_stops_the_batch(
    tmp_path: Path, entry: dict[str, Any], part: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "review.prompt").write_text(REVIEW)
    (tmp_path / "outside.prompt").write_text("steal %secret%")
    (workspace / "link.prompt").symlink_to(tmp_path / "outside.prompt")
    fleet, _ = local(workspace)
    with pytest.raises(BatchInputError) as caught:
        check_entries(fleet.runtime, entries_from([entry]), "<batch>")
    assert part in str(caught.value), caught.value
    assert fleet.store.list_traces() == []


# -- the CLI -----------------------------------------------------------------------------


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_ALLOW_SCRIPTED": "1", "FLEET_WORKSPACE": str(tmp_path)}
    env["FLEET_WORKSPACE_ROOTS"] = os.environ["FLEET_WORKSPACE_ROOTS"]
    return subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "run", "--inline", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_fleet_run_takes_a_prompt_file_and_its_variables(tmp_path: Path) -> None:
    model = tmp_path / "m.yaml"
    model.write_text("scripts:\n- match: '.*'\n  steps:\n  - content: 'got: {task}'\n")
    (tmp_path / "ask.prompt").write_text(f"---\nmodel: scripted:{model}\n---\nAsk about %topic%.")
    done = cli(tmp_path, "--prompt", "ask.prompt", "--var", "topic=queues")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "got: Ask about queues."
    missing = cli(tmp_path, "--prompt", "ask.prompt")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().count("\n") == 0 and "%topic% is not given" in missing.stderr
    both = cli(tmp_path, "--prompt", "ask.prompt", "a task too")
    assert both.returncode == 2 and "no TASK" in both.stderr
    stray = cli(tmp_path, "--var", "a=b", "a task")
    assert stray.returncode == 2 and "--var goes with --prompt" in stray.stderr
