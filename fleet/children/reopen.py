"""`continue_from`: an ended delegate or evaluate sub-trace answers a new call."""

from __future__ import annotations

import json
from typing import Any

from fleet import lifecycle
from fleet.errors import ToolError
from fleet.history import healed_result, main_path, open_turn
from fleet.llm.base import ToolCall
from fleet.models import Message, Trace
from fleet.remote.spawn import find_remote_child, reopened
from fleet.runtime import Runtime


def reopen(runtime: Runtime, parent: Trace, call: ToolCall, args: dict[str, Any]) -> Trace:
    """`continue_from`: hand an earlier delegate/evaluate sub-trace a new message."""
    if isinstance(args.get("task"), list):
        raise ToolError("agent: continue_from works with a single task, not an explore list")
    sub_id = str(args["continue_from"])
    store = runtime.store
    sub_id = find_remote_child(store, parent, sub_id) or sub_id  # agent://NAME/<task id>
    child = store.get_trace(sub_id) if sub_id in store.children(parent.trace_id) else None
    if child is None:
        raise ToolError(f"{call.name}: {sub_id!r} is not a sub-trace of this trace")
    if not child.is_terminal:
        raise ToolError(f"{call.name}: {sub_id!r} is still {child.status}")
    text = str(args.get("task") or "Continue, taking the new context into account.")
    if args.get("context"):
        text += "\n\nContext:\n" + json.dumps(args["context"], ensure_ascii=False)
    # A child that ended mid-turn (doom loop, crash) gets its open calls answered first:
    # providers refuse a user message between tool calls and their results.
    turn = open_turn(main_path(store.messages(sub_id), child.head_sequence))
    for missing in turn.missing if turn else ():
        store.append_message(healed_result(sub_id, missing, None))
    store.append_message(Message(trace_id=sub_id, role="user", content=text))
    otel = runtime.hooks.child_context(parent, call.id)  # this call is its parent span now
    # A remote child's new message goes to the same remote conversation.
    lifecycle.reopen(runtime, child, call.id, otel=otel, remote_call=reopened(child))
    return store.get_trace(sub_id)
