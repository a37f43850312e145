"""A tool call's result as the message the model reads next: secrets masked, images stored.

Written into the turn's `TraceWrite` with its `message` event; `started_at_ms` makes the
call a timed span on the trace page (the message itself is made when the call ended).
"""

from __future__ import annotations

from typing import Any

from fleet.conversation import messages as inbox
from fleet.errors import ToolError
from fleet.llm.base import ToolCall
from fleet.models import Content, Event, Message
from fleet.runtime import Runtime
from fleet.storage.writes import TraceWrite
from fleet.tools.base import ToolResult
from fleet.tools.imagecheck import stored_ref


def write_result(
    runtime: Runtime,
    results: TraceWrite,
    call: ToolCall,
    result: ToolResult,
    started_at_ms: int | None = None,
) -> None:
    """Add the call's result, the worker's secrets masked, to `results` (not applied).

    `started_at_ms`: when the call started (its message is made when it ended).
    """
    span = {} if started_at_ms is None else {"started_at_ms": started_at_ms}
    content: Content = None
    if result.images:  # stored once per tree; the message names them, never holds them
        try:
            refs = [stored_ref(runtime.images, results.root_trace_id, i) for i in result.images]
            content = [{"type": "text", "text": ""}, *refs]
        except ToolError as exc:  # the tree's image cap: the model is told, the run goes on
            result = ToolResult(title=f"{call.name} refused", output=str(exc), is_error=True)
    # A tool may have read one of the worker's secrets (a file, a response): never stored.
    scrub = runtime.redactor.values_only
    memory = scrub(result.long_term_memory) if result.long_term_memory else None
    event = Event(
        kind="message",
        trace_id=results.trace_id,
        data={"role": "tool", "tool": call.name, "is_error": result.is_error, **span},
    )
    output = scrub(result.output)
    if isinstance(content, list):
        content[0]["text"] = output
    results.append(
        Message(
            trace_id=results.trace_id,
            role="tool",
            tool_call_id=call.id,
            name=call.name,
            content=output if content is None else content,
            long_term_memory=memory,
            metadata={"title": result.title, "is_error": result.is_error, **span}
            | _carried(result),
        ),
        event,
    )


def _carried(result: ToolResult) -> dict[str, Any]:
    """What a result's metadata keeps on its message: `check_messages`' read cursor."""
    return {k: result.metadata[k] for k in (inbox.READ_KEY, "delivered") if k in result.metadata}
