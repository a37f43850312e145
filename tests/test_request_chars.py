"""The size a model call books: the same count as encoding the whole request, made cheaper."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleet.children.subagents import AGENT_SCHEMA, EVALUATE_SCHEMA
from fleet.conversation.human import ASK_HUMAN_SCHEMA
from fleet.limits.gate import request_chars
from fleet.models import Message
from fleet.tools.registry import default_registry


def encoded(path: list[Message], tools: list[dict[str, Any]]) -> int:
    """What `request_chars` counted before: every turn encoded its tools and tool calls."""
    text = sum(len(m.content or "") + len(json.dumps(m.tool_calls or "")) for m in path)
    return text + len(json.dumps(tools))


CALL = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
PATH = [
    Message(trace_id="t", role="system", content="be brief"),
    Message(trace_id="t", role="user", content="survey \u00e9 the workspace"),
    Message(trace_id="t", role="assistant", content=None, tool_calls=[CALL, CALL]),
    Message(trace_id="t", role="tool", content="x" * 300, tool_call_id="c1"),
    Message(trace_id="t", role="assistant", content="", tool_calls=[]),
]
REGISTRY = default_registry().schemas(("read_file", "list_dir", "grep"))


@pytest.mark.parametrize(
    "tools",
    [
        [],
        [AGENT_SCHEMA],
        [*REGISTRY, AGENT_SCHEMA, EVALUATE_SCHEMA, ASK_HUMAN_SCHEMA],
        [{"type": "function", "function": {"name": "fresh", "parameters": {"n": [1, 2]}}}],
    ],
)
def test_request_chars_is_the_encoded_size(tools: list[dict[str, Any]]) -> None:
    for path in ([], PATH[:2], PATH):
        assert request_chars(path, tools) == encoded(path, tools)
        assert request_chars(path, tools) == encoded(path, tools)  # a remembered schema too


def test_a_new_schema_with_the_id_of_a_dead_one_is_measured_again() -> None:
    for size in range(50):
        schema = {"type": "function", "function": {"name": "x" * size}}
        assert request_chars([], [schema]) == len(json.dumps([schema]))
        del schema
