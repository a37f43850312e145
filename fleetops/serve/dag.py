"""`GET /api/traces/{id}/dag`: the plan as a graph, derived from the goal plan and messages.

As the seeds' DAG view: nodes are results (messages, grouped by the goal in focus when each
was written), edges are actions (`parent_sequence` links; a rewind is a fork). Messages
carry no goal id, so the goal calls are replayed in sequence order over every branch (the
`goal` tool's own rules, `fleet.goals`), which numbers goals as the trace's plan does;
each goal's status is the plan's. A goal whose messages are all off the main path (a
rewind left it behind) is `rewound`, and the page greys it as it greys an abandoned one.
Sub-agents hang under the goal whose message spawned them. No HTTP here.
"""

from __future__ import annotations

import json
from typing import Any

from fleet.conversation.continuation import branches
from fleet.errors import ToolError
from fleet.goals import GoalTree, apply_goal_action
from fleet.history import main_path
from fleet.models import Message, Trace, text_of
from fleet.storage.store import TraceStore

MAX_LABEL_CHARS = 160


def trace_dag(store: TraceStore, trace_id: str) -> dict[str, Any]:
    """The DAG of one trace: goals with their messages and sub-agents, and the branches."""
    trace = store.get_trace(trace_id)
    messages = store.messages(trace_id)
    children = store.get_traces(store.children(trace_id))
    return dag(trace, messages, children)


def dag(trace: Trace, messages: list[Message], children: list[Trace]) -> dict[str, Any]:
    """`trace_dag` on values already read."""
    on_path = {m.sequence for m in main_path(messages, trace.head_sequence)}
    owner = goal_of_messages(messages)
    nodes = [_node(m, owner.get(m.sequence), m.sequence in on_path) for m in messages]
    by_call = {c["id"]: m.sequence for m in messages for c in m.tool_calls or ()}
    agents = [_agent(c, _spawner(owner, by_call, c)) for c in children]
    goals = [_goal(g.model_dump(mode="json"), nodes, agents) for g in trace.goals.goals]
    return {
        "trace_id": trace.trace_id,
        "status": trace.status,
        "head_sequence": trace.head_sequence,
        "focus_id": trace.goals.focus_id,
        "goals": goals,
        "unplanned": [n["sequence"] for n in nodes if n["goal_id"] is None],
        "messages": nodes,
        "sub_agents": agents,
        "branches": [_fork(b, messages, on_path) for b in branches(messages, trace.head_sequence)],
    }


def _spawner(owner: dict[int, str | None], by_call: dict[str, int], child: Trace) -> str | None:
    """The goal of the message whose tool call spawned `child`."""
    sequence = by_call.get(child.parent_tool_call_id or "")
    return owner.get(sequence) if sequence is not None else None


def goal_of_messages(messages: list[Message]) -> dict[int, str | None]:
    """Each message's goal: the one in focus when it was written (replaying goal calls)."""
    tree = GoalTree()
    owner: dict[int, str | None] = {}
    for message in sorted(messages, key=lambda m: m.sequence):
        before = tree.focus_id
        for call in message.tool_calls or ():
            if call.get("function", {}).get("name") == "goal":
                _replay(tree, call)
        owner[message.sequence] = before if before is not None else tree.focus_id
    return owner


def _replay(tree: GoalTree, call: dict[str, Any]) -> None:
    try:
        args = json.loads(call["function"].get("arguments") or "{}")
        if isinstance(args, dict):
            apply_goal_action(tree, args)
    except (ToolError, ValueError, TypeError):
        pass  # the tool refused it when it ran too


def _node(message: Message, goal_id: str | None, main: bool) -> dict[str, Any]:
    tools = [c.get("function", {}).get("name", "") for c in message.tool_calls or ()]
    label = " ".join(text_of(message.content).split())[:MAX_LABEL_CHARS]
    return {
        "sequence": message.sequence,
        "parent_sequence": message.parent_sequence,
        "role": message.role,
        "label": label or (f"calls {', '.join(tools)}" if tools else ""),
        "tools": tools,
        "goal_id": goal_id,
        "main": main,
        "side_branch": message.metadata.get("branch"),
    }


def _agent(child: Trace, goal_id: str | None) -> dict[str, Any]:
    return {
        "trace_id": child.trace_id,
        "name": child.name,
        "mode": child.mode,
        "status": child.status,
        "goal_id": goal_id,
    }


def _goal(
    goal: dict[str, Any], nodes: list[dict[str, Any]], agents: list[dict[str, Any]]
) -> dict[str, Any]:
    mine = [n for n in nodes if n["goal_id"] == goal["id"]]
    rewound = bool(mine) and not any(n["main"] for n in mine)
    spawned = {a["trace_id"] for a in agents if a["goal_id"] == goal["id"]}
    spawned |= set(goal.get("sub_trace_ids") or ())
    return {
        **goal,
        "messages": [n["sequence"] for n in mine],
        "sub_agents": sorted(spawned),
        "rewound": rewound,
        "greyed": rewound or goal["status"] == "abandoned",
    }


def _fork(branch: dict[str, Any], messages: list[Message], on_path: set[int]) -> dict[str, Any]:
    """A branch with where it leaves the main path (None for the main path itself)."""
    path = main_path(messages, branch["leaf_sequence"])
    off = [m for m in path if m.sequence not in on_path]
    fork = off[0].parent_sequence if off else None
    return {**branch, "fork_sequence": fork, "messages": [m.sequence for m in off]}
