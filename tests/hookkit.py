"""Operator hooks for the tests: `FLEET_HOOKS=tests.hookkit:NAME` on workers and inline runs.

Each writes the events it sees as JSON lines to the file `HOOKKIT_LOG` names, so a test
reads what a worker's hook saw.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from fleet.errors import HookBlocked
from fleet.goals import Goal
from fleet.llm.base import ToolCall
from fleet.models import Trace
from fleet.observe.hooks import Hooks
from fleet.tools.base import ToolResult

LOG_ENV = "HOOKKIT_LOG"
CONTEXT_LINE = "memory at 85 % (from the operator's context hook)"


def _log(event: str, **data: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, **data}) + "\n")


class Recorder(Hooks):
    """Writes turn, tool, goal and child events."""

    def turn_started(self, trace: Trace, iteration: int) -> None:
        _log("turn_started", trace_id=trace.trace_id, iteration=iteration)

    def turn_ended(self, trace: Trace, iteration: int) -> None:
        _log("turn_ended", trace_id=trace.trace_id, iteration=iteration)

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        _log("tool_started", trace_id=trace.trace_id, tool=call.name)

    def tool_finished(self, trace: Trace, call: ToolCall, result: ToolResult | None) -> None:
        _log("tool_finished", trace_id=trace.trace_id, tool=call.name, pid=os.getpid())

    def goal_completed(self, trace: Trace, goal: Goal) -> None:
        _log("goal_completed", trace_id=trace.trace_id, goal=goal.description)

    def child_spawned(self, parent: Trace, child: Trace) -> None:
        _log("child_spawned", trace_id=parent.trace_id, child=child.trace_id)

    def child_settled(self, parent_trace_id: str, child: Trace) -> None:
        _log("child_settled", trace_id=parent_trace_id, child=child.trace_id)


class BashBlocker(Hooks):
    """Refuses every bash call."""

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        if call.name == "bash":
            raise HookBlocked("no shell on this fleet today")


class ModelBlocker(Hooks):
    """Refuses every model call."""

    def model_requested(self, trace: Trace, model: str, messages: list[dict[str, Any]]) -> None:
        raise HookBlocked("model calls are paused by the operator")


class Context(Hooks):
    """Adds one line to the periodic injection."""

    def context_lines(self, trace: Trace) -> list[str]:
        return [CONTEXT_LINE]


class Raiser(Hooks):
    """Raises in every event it has."""

    def turn_started(self, trace: Trace, iteration: int) -> None:
        raise RuntimeError("a broken hook")

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        raise RuntimeError("a broken hook")

    def context_lines(self, trace: Trace) -> list[str]:
        raise RuntimeError("a broken hook")


class Hanger(Hooks):
    """Never returns from tool_started (well, after a minute)."""

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        threading.Event().wait(60)


class ToolTagger(Hooks):
    """Writes each finished tool call with its own tag (to tell two loaded hooks apart)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def tool_finished(self, trace: Trace, call: ToolCall, result: ToolResult | None) -> None:
        _log(self.tag, trace_id=trace.trace_id, tool=call.name)


RECORDER = Recorder()
ENTRY_POINT_TAGGER = ToolTagger("from_entry_point")
"""Loaded through a `fleet.hooks` entry point (`write_dist`) in the tests that install one."""
BASH_BLOCKER = BashBlocker()
MODEL_BLOCKER = ModelBlocker()
CONTEXT = Context()
RAISER = Raiser()
HANGER = Hanger()
NOT_A_HOOK = object()


def write_dist(folder: Path, name: str, entries: dict[str, str]) -> Path:
    """An installed distribution in `folder` declaring `fleet.hooks` entry points.

    What `pip install` leaves in site-packages, reduced to what importlib.metadata reads:
    with `folder` on `sys.path` (or PYTHONPATH), `entry_points(group="fleet.hooks")` finds
    `entries` (name -> `module:attr`). Returns `folder`.
    """
    info = folder / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entries.items())
    (info / "entry_points.txt").write_text(f"[fleet.hooks]\n{lines}")
    return folder
