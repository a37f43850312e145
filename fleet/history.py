"""The message tree read back: the main path, the open turn, and healing."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fleet.llm.base import LLMResponse
from fleet.models import Message

SUB_AGENT_TOOLS = frozenset({"agent", "evaluate"})


def main_path(messages: list[Message], head: int | None) -> list[Message]:
    """The messages from the root down to `head`, following `parent_sequence`."""
    by_sequence = {m.sequence: m for m in messages}
    path: list[Message] = []
    cursor = head
    while cursor is not None:
        message = by_sequence[cursor]
        path.append(message)
        cursor = message.parent_sequence
    path.reverse()
    return path


@dataclass(frozen=True)
class OpenTurn:
    """The last assistant turn on the path and which of its tool calls lack a result."""

    assistant: Message
    missing: tuple[dict[str, Any], ...]


def open_turn(path: list[Message]) -> OpenTurn | None:
    """The last assistant turn with tool calls, if any of them has no result yet."""
    for index in range(len(path) - 1, -1, -1):
        message = path[index]
        if message.role == "assistant":
            answered = {m.tool_call_id for m in path[index + 1 :] if m.role == "tool"}
            missing = tuple(c for c in message.tool_calls or [] if c["id"] not in answered)
            return OpenTurn(message, missing) if missing else None
    return None


def healed_result(trace_id: str, call: dict[str, Any], sub_trace_id: str | None) -> Message:
    """A synthetic tool result for a call interrupted by a crash or a stop."""
    name = call["function"]["name"]
    content = f"Tool call {name!r} was interrupted before it returned a result."
    if name in SUB_AGENT_TOOLS and sub_trace_id:
        content += (
            f" sub_trace_id: {sub_trace_id}. Call {name} again with "
            f"continue_from={sub_trace_id!r} to pick that sub-agent up."
        )
    return Message(
        trace_id=trace_id,
        role="tool",
        tool_call_id=call["id"],
        name=name,
        content=content,
        metadata={"healed": True, "sub_trace_id": sub_trace_id},
    )


def to_wire(path: list[Message]) -> list[dict[str, Any]]:
    """OpenAI-format messages; tool outputs older than the last turn use their short form."""
    last_assistant = max((i for i, m in enumerate(path) if m.role == "assistant"), default=-1)
    return [m.to_openai(compact=i < last_assistant) for i, m in enumerate(path)]


def recent_calls(path: list[Message], count: int) -> list[tuple[str, str]]:
    """The last `count` tool calls on the path as (name, arguments), oldest first."""
    seen: list[tuple[str, str]] = []
    for message in reversed(path):
        for call in reversed(message.tool_calls or []):
            seen.append((call["function"]["name"], call["function"]["arguments"]))
            if len(seen) == count:
                return list(reversed(seen))
    return list(reversed(seen))


def fresh_call_ids(response: LLMResponse, messages: list[Message], salt: int) -> LLMResponse:
    """The response with tool call ids unique in the trace (all branches).

    After a rewind a model may hand out an id it used on the old branch, and a tool
    result, like the once-mark of its collected children, is keyed by that id.
    """
    used = {str(c["id"]) for m in messages for c in m.tool_calls or []}
    if not any(c.id in used for c in response.tool_calls):
        return response
    calls = tuple(
        replace(c, id=f"{c.id}~{salt}") if c.id in used else c for c in response.tool_calls
    )
    return replace(response, tool_calls=calls)
