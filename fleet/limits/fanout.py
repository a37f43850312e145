"""Bounded fan-out and fair sharing: how wide one call may go, how many of a tree run at once.

- `max_branches` (preset, else `FLEET_MAX_BRANCHES`): an explore asking for more branches is
  refused with a tool error the model can act on.
- A tree's budget counts the sub-agents it spawns and how deep they go (`check_spawn`).
- `max_concurrent` (per root: `fleet run --max-concurrent`, `Fleet.submit`, preset): the
  children of the tree wait in a Redis list and at most that many are enqueued at once; a
  child that ends starts the next (`Trees.window`). No worker slot waits on the window:
  waiting children are not tasks yet.
- `priority`: `interactive` roots (`fleet run`, `Fleet.submit`) are served ahead of `batch`
  roots, and their children inherit it (the broker's message priority).
"""

from __future__ import annotations

from fleet.errors import ToolError
from fleet.limits.protocols import TreeBudgets
from fleet.llm.base import ToolCall
from fleet.models import Trace


def check_spawn(
    trace: Trace, call: ToolCall, *, max_branches: int, budgets: TreeBudgets | None
) -> None:
    """Refuse what the tree may not spawn; count what it may against its budget.

    Args:
        trace: The spawning trace.
        call: Its `agent` or `evaluate` call.
        max_branches: The widest explore allowed (the preset's, else the settings').
        budgets: The trees' budgets (None: no budgets kept, nothing counted).

    Raises:
        ToolError: an explore wider than `max_branches`, or more (or deeper) sub-agents than
            the tree's budget allows; the message goes back to the model.
    """
    try:
        task = call.parsed_arguments().get("task")
    except ValueError:
        return  # `spawn` reports the bad arguments
    count = len(task) if isinstance(task, list) else 1
    if isinstance(task, list) and count > max_branches:
        raise ToolError(
            f"agent: {count} branches asked for, at most {max_branches} per explore call "
            "(max_branches): explore fewer at once, or group the tasks"
        )
    if budgets is not None:
        depth = trace.trace_id.count("@") + 1  # child ids are `{parent}@...`
        refusal = budgets.spawn(trace.root_trace_id, count, depth)
        if refusal is not None:
            raise ToolError(refusal)
