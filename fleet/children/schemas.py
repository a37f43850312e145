"""The `agent` and `evaluate` tools' schemas, as the model is offered them."""

from __future__ import annotations

from typing import Any

AGENT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "agent",
        "description": (
            "Start sub-agents. A string `task` delegates to one sub-agent with full tools "
            "(it cannot start sub-agents itself). A list of tasks explores: one read-only "
            "sub-agent per item, run in parallel, results summarised together."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "task": {
                    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
                },
                "messages": {
                    "type": "array",
                    "description": "Context messages: one list shared, or one list per branch.",
                    "items": {},
                },
                "continue_from": {
                    "type": "string",
                    "description": "A delegate sub_trace_id (or a remote agent's agent://...).",
                },
                "agent": {
                    "type": "string",
                    "description": "A remote agent the fleet's operator named (by its name, "
                    "never a URL): the task goes to it instead of a local sub-agent.",
                },
                "agent_type": {
                    "type": "string",
                    "description": "Preset for a delegate, or for every branch of an explore "
                    "(default explore; branches stay read-only whatever the preset).",
                },
                "skills": {"type": "array", "items": {"type": "string"}},
                "context": {"type": "object"},
            },
            "required": ["task"],
        },
    },
}

EVALUATE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "evaluate",
        "description": "Ask a read-only judge whether a goal is met; returns a verdict.",
        "parameters": {
            "type": "object",
            "properties": {
                "messages": {"type": "array", "items": {}},
                "target_goal_id": {"type": "string"},
                "continue_from": {"type": "string"},
                "context": {"type": "object"},
            },
        },
    },
}
