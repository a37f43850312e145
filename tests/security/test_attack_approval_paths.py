"""Attacks on approval patterns: a path written so that `*.py` does not match it as text
while the file tool writes a `.py` file all the same (issue 39, item 8).

The rule `{tool: write_file, arguments: {path: "*.py"}}` must hold for the path the tool
acts on: `evil1.py/.`, `sub/../evil2.py/` and a symlink `note.txt -> real.py` each write
a `.py` file, so each must wait for a person, unwritten.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet.config.approval_rules import ApprovalRuleIn, rules_of
from fleet.conversation import approval
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text

PY_ONLY = rules_of([ApprovalRuleIn(tool="write_file", arguments={"path": "*.py"})])


def local_fleet(store: TraceStore, workspace: Path, model: ScriptedModel) -> InProcessFleet:
    settings = Settings(workspace=workspace, workspace_roots=(workspace,), env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    default = replace(runtime.presets["default"], approve=PY_ONLY)
    return InProcessFleet(replace(runtime, presets={**runtime.presets, "default": default}))


def writer(path: str) -> ScriptedModel:
    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if not any(m["role"] == "tool" for m in messages):
            return call("write_file", call_id="w1", path=path, content="print('pwned')")
        return text("done")

    return ScriptedModel(function=answer)


@pytest.mark.parametrize(
    ("written", "lands"),
    [
        ("evil1.py/.", "evil1.py"),
        ("sub/../evil2.py/", "evil2.py"),
        ("./evil3.py", "evil3.py"),
        ("note.txt", "real.py"),  # a symlink in the workspace: the tool writes its target
    ],
)
def test_a_py_pattern_holds_for_the_path_the_tool_writes(
    store: TraceStore, tmp_path: Path, written: str, lands: str
) -> None:
    (tmp_path / "sub").mkdir()
    os.symlink("real.py", tmp_path / "note.txt")
    local = local_fleet(store, tmp_path, writer(written))
    trace = local.run("write it", model="test")
    assert trace.status == "waiting", (trace.status, trace.answer)
    assert approval.pending(trace) is not None
    assert not (tmp_path / lands).exists(), f"{written!r} wrote {lands} unapproved"


def test_a_txt_file_still_runs_without_asking(store: TraceStore, tmp_path: Path) -> None:
    local = local_fleet(store, tmp_path, writer("notes/../plain.txt"))
    trace = local.run("write it", model="test")
    assert trace.status == "completed", trace.error
    assert (tmp_path / "plain.txt").exists()
