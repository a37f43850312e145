"""Collect finished children into their parent: collaborator entries and the tool result."""

from __future__ import annotations

import re

from fleet.cache import remember
from fleet.history import main_path, open_turn
from fleet.models import Collaborator, Event, Message, Trace
from fleet.store import TraceStore

_VERDICT = re.compile(r"VERDICT:\s*(pass|fail)", re.I)


def collect(
    store: TraceStore, parent_id: str, tool_call_id: str, child_ids: list[str], summary_chars: int
) -> bool:
    """Write the children's outcome into the parent, once per tool call.

    Returns:
        True when this call completed the parent's open turn, so the parent should resume.
        False for a duplicate delivery or while other calls of the turn are still open.
    """
    if not write_result(store, parent_id, tool_call_id, child_ids, summary_chars):
        return False
    return turn_complete(store, parent_id)


def write_result(
    store: TraceStore, parent_id: str, tool_call_id: str, child_ids: list[str], summary_chars: int
) -> bool:
    """Collaborator entries plus one tool message summarising every child.

    The entries are idempotent; the message is written once per tool call (atomically with
    its mark). Returns False when another collector wrote it already.
    """
    children = [store.get_trace(c) for c in child_ids]
    for child in children:
        update_collaborator(store, parent_id, child, summary_chars)
    tool_name = "evaluate" if children[0].mode == "evaluate" else "agent"
    content = render_result(children)
    if len(children) == 1:
        remember(store, children[0], content)
    written = store.append_collected(
        Message(
            trace_id=parent_id,
            role="tool",
            tool_call_id=tool_call_id,
            name=tool_name,
            content=content,
            long_term_memory=_short(children),
            metadata={"sub_trace_ids": child_ids},
        )
    )
    if written is None:
        return False
    # A child shares its parent's tree, so the parent's events go to the child's root.
    store.emit(
        children[0].root_trace_id,
        Event(kind="message", trace_id=parent_id, data={"role": "tool"}),
    )
    return True


def update_collaborator(
    store: TraceStore, parent_trace_id: str, child: Trace, summary_chars: int
) -> None:
    """Mirror a child's status and answer into its parent's collaborator entry."""
    status = child.status if child.status in ("completed", "failed", "stopped") else "running"
    summary = child.answer if child.status == "completed" else (child.error or child.status)
    entry = Collaborator(
        name=child.name or child.mode,
        trace_id=child.trace_id,
        status=status,
        summary=(summary or "")[:summary_chars],
        mode=child.mode,
        tool_call_id=child.parent_tool_call_id,
        stats=child.stats,
    )
    event = Event(
        kind="collaborator",
        trace_id=child.trace_id,
        status=status,
        data={"parent_trace_id": parent_trace_id, "name": entry.name, "mode": child.mode},
    )
    store.put_collaborator_and_emit(parent_trace_id, child.root_trace_id, entry, event)


def turn_complete(store: TraceStore, trace_id: str) -> bool:
    """True when every tool call of the trace's last assistant turn has a result."""
    trace = store.get_trace(trace_id)
    return open_turn(main_path(store.messages(trace_id), trace.head_sequence)) is None


def render_result(children: list[Trace]) -> str:
    """The tool result the parent's model reads."""
    if len(children) == 1 and children[0].mode != "explore":
        child = children[0]
        head = f"[{child.status}] sub_trace_id: {child.trace_id}"
        if child.mode == "evaluate":
            head += f"\nverdict: {verdict(child.answer)}"
        return f"{head}\n\n{_body(child)}"
    done = sum(c.status == "completed" for c in children)
    lines = [f"Explore finished: {len(children)} branches, {done} completed."]
    for child in children:
        lines.append(f"\n### {child.name} [{child.status}] (sub_trace_id: {child.trace_id})")
        lines.append(f"Task: {child.task}")
        lines.append(_body(child))
    return "\n".join(lines)


def verdict(answer: str | None) -> str:
    """`pass`, `fail` or `unknown`, from an evaluator's answer."""
    match = _VERDICT.search(answer or "")
    return match.group(1).lower() if match else "unknown"


def _body(child: Trace) -> str:
    if child.status == "completed":
        return child.answer or "(no answer)"
    return f"error: {child.error or child.status}"


def _short(children: list[Trace]) -> str:
    parts = [f"{c.name} [{c.status}] {c.trace_id}" for c in children]
    return "sub-agents: " + "; ".join(parts)
