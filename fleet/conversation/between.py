"""`send_message(to, text)`: one agent of a tree writes to another of the same tree.

For presets with `messages: true`. `to` names a collaborator: `parent`, a child or a
sibling by its name (`explore-003`) or trace id. Never a trace of another tree, nor one
that is no parent, child or sibling (a forged id is refused whatever it names), nor itself.
The message goes through `fleet.conversation.messages.send`, so the recipient's inbox caps
apply, and the sender's own fan-out cap (`LIMITS.sends_per_minute`) in the same step.
"""

from __future__ import annotations

from typing import Any

from fleet.conversation.messages import MAX_MESSAGE_CHARS, send
from fleet.errors import ConversationError, InvalidTraceId, ToolError, TraceNotFound
from fleet.ids import check_trace_id
from fleet.llm.base import ToolCall
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.tools.base import ToolResult

SEND_MESSAGE = "send_message"

SEND_MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEND_MESSAGE,
        "description": (
            "Send a short message to another agent of your team while it works: `parent`, "
            "one of your sub-agents, or a sibling, by name (as in Active Collaborators) or "
            "trace id. It reads it before its next model call."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "parent, a name or a trace id"},
                "text": {"type": "string", "description": "The message."},
            },
            "required": ["to", "text"],
            "additionalProperties": False,
        },
    },
}


def may_send(runtime: Runtime, trace: Trace) -> bool:
    """Whether `send_message` is offered: the preset opts in and does not deny it."""
    preset = runtime.preset(trace.preset)
    return preset.messages and SEND_MESSAGE not in runtime.permissions(trace).denied_tools


def send_message(runtime: Runtime, trace: Trace, call: ToolCall) -> ToolResult:
    """Run a `send_message` call; a refusal is the tool's error result."""
    try:
        if not may_send(runtime, trace):
            raise ToolError(f"tool {SEND_MESSAGE!r} is not allowed for preset {trace.preset!r}")
        to, text = _arguments(call)
        target = recipient(runtime, trace, to)
        sent = send(
            runtime,
            target.trace_id,
            text,
            sender=trace.name or trace.mode,
            sender_trace_id=trace.trace_id,
        )
    except (ToolError, ConversationError, TraceNotFound) as exc:
        return ToolResult(title=f"{SEND_MESSAGE} refused", output=str(exc), is_error=True)
    shown = target.name or target.trace_id
    return ToolResult(
        title=f"message sent to {shown}",
        output=f"Sent to {shown} ({target.trace_id}); it reads it before its next model call.",
        metadata={"entry_id": sent.entry_id},
    )


def _arguments(call: ToolCall) -> tuple[str, str]:
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        raise ToolError(f"bad arguments: {exc}") from None
    to, text = arguments.get("to"), arguments.get("text")
    if not isinstance(to, str) or not to.strip():
        raise ToolError("`to` must name parent, a sub-agent or a sibling")
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_MESSAGE_CHARS:
        raise ToolError(f"`text` must be a non-empty string of at most {MAX_MESSAGE_CHARS} chars")
    return to.strip(), text


def recipient(runtime: Runtime, sender: Trace, to: str) -> Trace:
    """The trace `to` names among the sender's parent, children and siblings.

    Raises:
        ToolError: Nothing of the sender's tree by that name; another tree; itself.
    """
    store = runtime.store
    family = _family(runtime, sender)
    if to == "parent":
        if sender.parent_trace_id is None:
            raise ToolError("this agent has no parent")
        return store.get_trace(sender.parent_trace_id)
    by_name = [t for t in family.values() if t.name == to]
    if len(by_name) == 1:
        return by_name[0]
    if len(by_name) > 1:
        raise ToolError(f"{to[:60]!r} names {len(by_name)} agents: use a trace id")
    try:
        check_trace_id(to)
    except InvalidTraceId:
        raise ToolError(f"no parent, sub-agent or sibling named {to[:60]!r}") from None
    if to == sender.trace_id:
        raise ToolError("an agent does not send messages to itself")
    if to not in family:  # another tree, or no collaborator of this one: the same answer
        raise ToolError(f"{to[:80]!r} is not this agent's parent, sub-agent or sibling")
    return family[to]


def _family(runtime: Runtime, sender: Trace) -> dict[str, Trace]:
    """Parent, children and siblings by trace id; all of the sender's tree."""
    store = runtime.store
    ids = list(store.children(sender.trace_id))
    if sender.parent_trace_id is not None:
        ids.append(sender.parent_trace_id)
        ids += [i for i in store.children(sender.parent_trace_id) if i != sender.trace_id]
    traces = store.get_traces(list(dict.fromkeys(ids)))
    # Children are created by the fleet under their parent's id; the root check is a second
    # wall: nothing outside the sender's tree is ever a recipient.
    return {t.trace_id: t for t in traces if t.root_trace_id == sender.root_trace_id}
