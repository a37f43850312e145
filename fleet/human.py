"""Waiting on a person: the `ask_human` tool, the reply, and every way a wait ends.

`ask_human(question)` leaves its tool call without a result and puts the trace in
`waiting` with a `{type: human, status: waiting}` collaborator holding the question; the
run's task then ends, so no worker slot is held. `reply` writes the answer as the tool
result (once: two replies cannot both land) and queues the trace for any worker. A stop,
a budget or `human_timeout_s` ends the wait: the first two leave the call open (a continue
heals it), a timeout answers it with a note so the agent can go on.
"""

from __future__ import annotations

from typing import Any

from fleet.errors import ConversationError, TraceNotFound
from fleet.llm.base import ToolCall
from fleet.models import Collaborator, CollaboratorStatus, Event, Message, Trace, now_ms
from fleet.presets import AgentPreset
from fleet.store import TraceStore
from fleet.tools.base import ToolResult

ASK_HUMAN = "ask_human"
WAITING_KEY = "waiting_on"
"""Trace metadata while a person is asked: tool_call_id, question, asked_at_ms, deadline_ms."""
TIMEOUT_KEY = "human_timeout_s"
"""Trace metadata: this run's own human timeout, overriding the fleet's setting."""
MAX_QUESTION_CHARS = 4000

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


def human_id(tool_call_id: str) -> str:
    """The collaborator key of the person asked by one tool call."""
    return f"human:{tool_call_id}"


def ask(
    store: TraceStore, preset: AgentPreset, trace: Trace, call: ToolCall, timeout_s: int
) -> ToolResult | None:
    """Put the trace in `waiting` on a person; a refusal or bad arguments return a result.

    Args:
        store: Where the wait is written.
        preset: The asking trace's preset (enforced here, whatever the model was offered).
        trace: The asking trace as recorded this turn.
        call: The `ask_human` call.
        timeout_s: The fleet's human timeout; the trace's own (metadata) wins.
    """
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
    question = question.strip()[:MAX_QUESTION_CHARS]
    timeout_s = int(trace.metadata.get(TIMEOUT_KEY) or timeout_s)
    asked = now_ms()
    deadline_ms = asked + timeout_s * 1000
    waiting = {
        "kind": "human",
        "tool_call_id": call.id,
        "question": question,
        "asked_at_ms": asked,
        "deadline_ms": deadline_ms,
        "timeout_s": timeout_s,
    }
    # Indexed first: a wait is never left without its deadline (the sweeper ignores an
    # entry whose trace no longer waits).
    store.index_human_wait(trace.trace_id, deadline_ms)
    metadata = {**trace.metadata, WAITING_KEY: waiting}
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "human"})
    store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="waiting", metadata=metadata
    )
    _put_person(store, trace, call.id, "waiting", question, question=question)
    return None


def _refusal(text: str) -> ToolResult:
    return ToolResult(title=f"{ASK_HUMAN} refused", output=text, is_error=True)


def _put_person(
    store: TraceStore,
    trace: Trace,
    tool_call_id: str,
    status: CollaboratorStatus,
    summary: str,
    **data: str,
) -> None:
    entry = Collaborator(
        name="human",
        type="human",
        trace_id=human_id(tool_call_id),
        status=status,
        summary=summary[:MAX_QUESTION_CHARS],
        mode=trace.mode,
        tool_call_id=tool_call_id,
    )
    event = Event(
        kind="collaborator",
        trace_id=trace.trace_id,
        status=status,
        data={"parent_trace_id": trace.trace_id, "name": "human", "type": "human", **data},
    )
    store.put_collaborator_and_emit(trace.trace_id, trace.root_trace_id, entry, event)


def waiting_on(trace: Trace) -> dict[str, Any] | None:
    """The open question of a trace waiting on a person, else None."""
    waiting = trace.metadata.get(WAITING_KEY)
    if trace.status != "waiting" or not isinstance(waiting, dict):
        return None
    return waiting


def still_waiting(trace: Trace, tool_call_id: str) -> bool:
    """Whether this `ask_human` call is the one the trace waits on (for a redelivered run)."""
    waiting = trace.metadata.get(WAITING_KEY)
    return isinstance(waiting, dict) and waiting.get("tool_call_id") == tool_call_id


def reply(store: TraceStore, trace_id: str, answer: str) -> Trace:
    """Answer the question a trace waits on and queue it; the caller enqueues or runs it.

    Raises:
        ConversationError: empty answer, a trace not waiting on a person, or a question
            answered already; nothing was written.
        TraceNotFound: no such trace.
    """
    if not answer.strip():
        raise ConversationError("the answer is empty")
    trace = store.get_trace(trace_id)
    waiting = waiting_on(trace)
    if waiting is None:
        raise ConversationError(
            f"trace {trace_id!r} is not waiting on a person (it is {trace.status})"
        )
    if not _answer(store, trace, waiting, answer, {"human": True}):
        raise ConversationError(f"trace {trace_id!r}: that question was answered already")
    _settle(store, trace, waiting, "completed", answer)
    return store.get_trace(trace_id)


def end_wait(store: TraceStore, trace_id: str, *, reason: str, text: str) -> Trace | None:
    """End a wait with `text` as the tool result (timeout, budget); None if it no longer waits.

    The trace is left `queued` for the caller to enqueue, so the agent reads the note and
    finishes with what it has.
    """
    trace = store.get_trace(trace_id)
    waiting = waiting_on(trace)
    if waiting is None or not _answer(store, trace, waiting, text, {"ended": reason}):
        return None
    _settle(store, trace, waiting, "failed", text)
    return store.get_trace(trace_id)


def _answer(
    store: TraceStore, trace: Trace, waiting: dict[str, Any], text: str, meta: dict[str, Any]
) -> bool:
    written = store.append_collected(
        Message(
            trace_id=trace.trace_id,
            role="tool",
            tool_call_id=str(waiting["tool_call_id"]),
            name=ASK_HUMAN,
            content=text,
            metadata={"title": ASK_HUMAN, **meta},
        )
    )
    return written is not None


def _settle(
    store: TraceStore,
    trace: Trace,
    waiting: dict[str, Any],
    status: CollaboratorStatus,
    summary: str,
) -> None:
    store.forget_human_wait(trace.trace_id)
    metadata = {k: v for k, v in trace.metadata.items() if k != WAITING_KEY}
    _put_person(store, trace, str(waiting["tool_call_id"]), status, summary)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "human"})
    store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="queued", metadata=metadata
    )


def on_stop(store: TraceStore, trace: Trace) -> None:
    """A stopped trace no longer waits: its person's entry says so, its deadline is dropped."""
    waiting = trace.metadata.get(WAITING_KEY)
    if not isinstance(waiting, dict):
        return
    store.forget_human_wait(trace.trace_id)
    _put_person(store, trace, str(waiting["tool_call_id"]), "stopped", "stop requested")


def time_out_waits(store: TraceStore, at_ms: int | None = None) -> list[str]:
    """Answer every wait past its deadline with a timeout note; the ids to resume.

    Each expired entry is claimed by exactly one caller (every worker's sweeper calls this).
    """
    resumed = []
    for trace_id in store.expired_human_waits(now_ms() if at_ms is None else at_ms):
        if not store.forget_human_wait(trace_id):
            continue
        try:
            waiting = waiting_on(store.get_trace(trace_id)) or {}
        except TraceNotFound:  # expired with its TTL; nothing to resume
            continue
        text = (
            f"No reply from a person within {waiting.get('timeout_s', '?')} s. Go on "
            "without it; say in your final answer what you still need from them."
        )
        if end_wait(store, trace_id, reason="timeout", text=text) is not None:
            resumed.append(trace_id)
    return resumed
