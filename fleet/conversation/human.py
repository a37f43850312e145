"""Waiting on a person: the `ask_human` tool, the reply, and every way a wait ends.

`ask_human(question)` leaves its tool call without a result and puts the trace in
`waiting` with a `{type: human, status: waiting}` collaborator holding the question; the
run's task then ends, so no worker slot is held. `reply` writes the answer as the tool
result (once: two replies cannot both land) and queues the trace for any worker. A stop
ends the wait leaving the call open (a later continue heals it); `human_timeout_s` (or a
budget, through `end_wait`) answers it with a note so the agent finishes with what it has.
The status changes themselves live in `fleet.lifecycle`.
"""

from __future__ import annotations

from typing import Any

from fleet import lifecycle
from fleet.control import existing
from fleet.errors import ConversationError, TraceNotFound
from fleet.lifecycle import human_id
from fleet.llm.base import ToolCall
from fleet.models import Message, Trace, now_ms
from fleet.presets import AgentPreset
from fleet.runstate import RunPatch
from fleet.runtime import Runtime
from fleet.storage.store import TraceContent, TraceStore
from fleet.tools.base import ToolResult

__all__ = [
    "ASK_HUMAN",
    "ask",
    "human_id",
    "question_of",
    "reply",
    "time_out_waits",
    "wait_for_person",
]

ASK_HUMAN = "ask_human"
MAX_QUESTION_CHARS = lifecycle.PERSON_SUMMARY_CHARS

ASK_HUMAN_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": ASK_HUMAN,
        "description": (
            "Ask the person you work for a question and wait for the answer (it may take "
            "hours). Use it only when you cannot go on without a decision or a fact that "
            "only they have. The answer comes back as this tool's result."
        ),
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "string", "description": "One clear question."}},
            "required": ["question"],
        },
    },
}


def may_ask(preset: AgentPreset, trace: Trace) -> bool:
    """Only a main agent whose preset allows it; explore/evaluate and read-only never."""
    return (
        trace.mode == "main"
        and not preset.read_only
        and preset.name not in ("explore", "evaluate")
        and preset.allows(ASK_HUMAN)
    )


def question_of(runtime: Runtime, trace: Trace, call: ToolCall) -> str | ToolResult:
    """The question an `ask_human` call may put to a person, or the refusal to return.

    Enforced here, whatever the model was offered: only a main agent whose preset (and
    ceiling) allows it may ask; explore and evaluate never.
    """
    preset = runtime.permissions(trace)
    if not may_ask(preset, trace):
        return _refusal(
            f"tool {ASK_HUMAN!r} is not allowed for preset {preset.name!r} in a {trace.mode} "
            "trace (only a main agent may ask a person)"
        )
    try:
        question = call.parsed_arguments().get("question")
    except ValueError as exc:
        return _refusal(f"bad arguments: {exc}")
    if not isinstance(question, str) or not question.strip():
        return _refusal("ask_human needs a non-empty `question` string")
    return question.strip()[:MAX_QUESTION_CHARS]


def ask(runtime: Runtime, trace: Trace, tool_call_id: str, question: str) -> Trace:
    """Put the trace in `waiting` on a person; its run then ends and holds no slot.

    The trace's own `run.human_timeout_s` (`fleet run --human-timeout-s`) beats the fleet's.
    """
    waiting = {"kind": "human", "tool_call_id": tool_call_id, "question": question}
    return wait_for_person(runtime, trace, waiting)


def wait_for_person(
    runtime: Runtime, trace: Trace, waiting: dict[str, Any], *, also: RunPatch | None = None
) -> Trace:
    """`waiting` on a person until a deadline: the fleet's timeout, or the tree's wall_s.

    `waiting` (kind, tool_call_id, question, ...) gets the deadline fields added; `also`:
    other run-state fields written with it (a remote child's call that asked).
    """
    timeout_s = trace.run.human_timeout_s or runtime.settings.human_timeout_s
    asked = now_ms()
    deadline_ms = asked + timeout_s * 1000
    budgets = runtime.gate.budgets
    wall_ms = budgets.deadline_ms(trace.root_trace_id) if budgets is not None else None
    ends = "timeout"
    if wall_ms is not None and wall_ms < deadline_ms:  # the tree's wall_s budget ends it first
        deadline_ms, ends = max(wall_ms, asked), "budget"
    waiting = waiting | {"asked_at_ms": asked, "deadline_ms": deadline_ms}
    waiting |= {"timeout_s": timeout_s, "ends": ends}
    # Indexed first: a wait is never left without its deadline (the sweeper ignores an
    # entry whose trace no longer waits).
    runtime.store.index_human_wait(trace.trace_id, deadline_ms)
    return lifecycle.wait_on_person(runtime, trace, waiting, also)


def _refusal(text: str) -> ToolResult:
    return ToolResult(title=f"{ASK_HUMAN} refused", output=text, is_error=True)


def waiting_on(trace: Trace) -> dict[str, Any] | None:
    """The open question of a trace waiting on a person, else None."""
    waiting = trace.run.waiting_on
    return waiting if trace.status == "waiting" else None


def waiting_traces(store: TraceStore, limit: int = 50) -> list[Trace]:
    """Traces waiting on a person (a question or an approval), newest first.

    Read from the index of waits (`TraceStore.expired_human_waits` before a deadline no
    wait reaches: every one), not from the newest traces: a wait is listed however many
    traces were created after it.
    """
    return [t for t in indexed_waits(store) if waiting_on(t) is not None][:limit]


def indexed_waits(store: TraceStore) -> list[Trace]:
    """Every trace in the index of waits on a person, newest first.

    A wait may have ended since it was indexed: the caller checks each trace's own state.
    """
    found = existing(store, store.expired_human_waits(EVERY_WAIT_MS))
    return sorted(found, key=lambda t: (t.created_at_ms, t.trace_id), reverse=True)


EVERY_WAIT_MS = 2**62
"""Later than any wait's deadline (ms): the waits "expired" before it are all of them."""


def still_waiting(trace: Trace, tool_call_id: str) -> bool:
    """Whether this `ask_human` call is the one the trace waits on (for a redelivered run)."""
    waiting = trace.run.waiting_on
    return waiting is not None and waiting.get("tool_call_id") == tool_call_id


def reply(runtime: Runtime, trace_id: str, answer: str) -> Trace:
    """Answer the question a trace waits on and queue it; the caller enqueues or runs it.

    Raises:
        ConversationError: empty answer, a trace not waiting on a person, or a question
            answered already; nothing was written.
        TraceNotFound: no such trace.
    """
    if not answer.strip():
        raise ConversationError("the answer is empty")
    trace = runtime.store.get_trace(trace_id)
    waiting = waiting_on(trace)
    if waiting is None:
        raise ConversationError(
            f"trace {trace_id!r} is not waiting on a person (it is {trace.status})"
        )
    if waiting.get("kind") == "approval":
        raise ConversationError(
            f"trace {trace_id!r} waits for an approval: answer with `fleet approve` or `fleet deny`"
        )
    if not _answer(runtime.store, trace, waiting, answer, {"human": True}):
        raise ConversationError(f"trace {trace_id!r}: that question was answered already")
    return lifecycle.person_answered(runtime, trace, "completed", answer)


def end_wait(runtime: Runtime, trace_id: str, *, reason: str, text: str) -> Trace | None:
    """End a wait with `text` as the tool result (timeout, budget); None if it no longer waits.

    The trace is left `queued` for the caller to enqueue, so the agent reads the note and
    finishes with what it has.
    """
    trace = runtime.store.get_trace(trace_id)
    waiting = waiting_on(trace)
    if waiting is None or not _answer(runtime.store, trace, waiting, text, {"ended": reason}):
        return None
    return lifecycle.person_answered(runtime, trace, "failed", text)


def _answer(
    store: TraceContent, trace: Trace, waiting: dict[str, Any], text: str, meta: dict[str, Any]
) -> bool:
    """The tool result of the `ask_human` call, written at most once (a once-mark)."""
    written = store.append_collected(
        Message(
            trace_id=trace.trace_id,
            role="tool",
            tool_call_id=str(waiting["tool_call_id"]),
            name=str(waiting.get("tool") or ASK_HUMAN),
            content=text,
            metadata={"title": str(waiting.get("tool") or ASK_HUMAN), **meta},
        )
    )
    return written is not None


def time_out_waits(runtime: Runtime, at_ms: int | None = None) -> list[str]:
    """Answer every wait past its deadline with a timeout note; the ids to resume.

    Each expired entry is claimed by exactly one caller (every worker's sweeper calls this).
    """
    store = runtime.store
    resumed = []
    for trace_id in store.expired_human_waits(now_ms() if at_ms is None else at_ms):
        if not store.forget_human_wait(trace_id):
            continue
        try:
            waiting = waiting_on(store.get_trace(trace_id)) or {}
        except TraceNotFound:  # expired with its TTL; nothing to resume
            continue
        reason = str(waiting.get("ends") or "timeout")
        text = (
            f"No reply from a person within {waiting.get('timeout_s', '?')} s. Go on "
            "without it; say in your final answer what you still need from them."
        )
        if reason == "budget":
            text = "The tree's time budget (wall_s) ran out before a person replied."
        if waiting.get("kind") == "approval":  # a timeout denies: the call never runs
            text = f"Not run: no person approved it in time ({reason}). {text}"
        if end_wait(runtime, trace_id, reason=reason, text=text) is not None:
            resumed.append(trace_id)
    return resumed
