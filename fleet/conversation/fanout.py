"""Fan-out roots: a root that explores a list of tasks with no model choosing to.

`Fleet.explore_tree` (and so `fleet mcp`'s `explore`) submits one root whose trace carries
its tasks in `run.fan_out`. Its runner makes the two turns a model would have made,
without a model call: first an `agent` call with the tasks (one read-only explore branch
per task, dispatched as any explore is: a chord on the fleet, threads in process), then,
once the branches are collected, the tool result as its answer. So the tree has one root,
its branches are its collaborators, its budget and limits apply as for any tree, and
`stop` on the root stops every branch. A continued conversation goes to the real model.
"""

from __future__ import annotations

import json
from typing import Any

from fleet.errors import ConfigError
from fleet.llm.base import LLMResponse, ToolCall
from fleet.models import Trace
from fleet.runstate import FanOutPlan

FAN_OUT_MODEL = "fan-out"
"""The `model` recorded on a fan-out root's own turns (no model answered them)."""
CALL_ID = "call_fan_out"


def fan_out_plan(tasks: tuple[str, ...], preset: str) -> FanOutPlan:
    """What `create_root` stores for a fan-out root (its `run.fan_out`).

    Raises:
        ConfigError: no task, or an empty one.
    """
    if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise ConfigError("explore: every task must be a non-empty string")
    return FanOutPlan(tasks=list(tasks), preset=preset)


def fan_out_task(tasks: tuple[str, ...]) -> str:
    """The root's task text: what it does, for `trace show` and the event stream."""
    lines = "\n".join(f"{i}. {task}" for i, task in enumerate(tasks, start=1))
    return f"Explore {len(tasks)} tasks in parallel, one read-only branch each:\n{lines}"


def planned_turn(trace: Trace, path: list[Any]) -> LLMResponse | None:
    """A fan-out root's next turn, or None: the model answers (not a fan-out, or continued).

    `path` is the trace's main path of `Message`s.
    """
    plan = trace.run.fan_out
    if plan is None:
        return None
    said = [m for m in path if m.role == "assistant"]
    if not said:
        arguments = {"task": list(plan.tasks), "agent_type": plan.preset}
        call = ToolCall(CALL_ID, "agent", json.dumps(arguments))
        return LLMResponse(content=None, tool_calls=(call,), model=FAN_OUT_MODEL)
    if len(said) == 1 and path[-1].role == "tool":
        return LLMResponse(content=path[-1].content or "(no results)", model=FAN_OUT_MODEL)
    return None
