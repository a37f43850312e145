"""Compaction by a side branch: a summary of the main path takes its place in what is sent.

A model alias with `context_strategy: compact` (fleet.yaml; `elide`, the default, only cuts
old tool outputs in the request, `fleet.loop.fit`) has its trace compacted before a turn
whose request would pass `context_threshold` of its `context_window`, and `fleet compact
ID` / `POST /api/traces/{id}/compact` compact a finished root at once. As the seeds say:

- a read-only side branch summarises the main path: the model is asked, with no tools at
  all, for a summary of everything after the task; that request and its answer are stored
  as messages hanging under the old head (`metadata.branch: compaction`), off the main path;
- a summary message then hangs under the task, skipping the summarised range, and the last
  user turn (with anything after it) is copied below it: the main path is now system,
  task, summary, that turn; the trace goes on from there;
- nothing is deleted: every original message stays in storage and in `?mode=all`, and a
  rewind to a message inside the summarised range (`--after-sequence N`) puts the original
  messages back on the main path (the summary is then off it).

The summary's model call goes through the gate like any turn (limits, budget, stats): a
call the gate holds back skips the compaction, and fitting (elision) applies as before.

Faults: the writes are several (side branch, head, summary, copies), each atomic. A run
that dies between them leaves either the old main path (the side branch hangs off it;
compaction is tried again next turn) or a main path that ends early at the task or the
summary: the original messages are all in storage, and `fleet run --continue ID
--after-sequence N` puts them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.errors import ConversationError
from fleet.history import main_path, to_wire
from fleet.limits.gate import Go, Wait, request_chars
from fleet.llm.base import LLMResponse
from fleet.loop.call import call_model, prepare
from fleet.loop.fit import estimate_tokens
from fleet.loop.toolcalls import tool_schemas
from fleet.models import Event, Message, Trace
from fleet.runstate import ContextNote
from fleet.runtime import Runtime
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import TraceWrite

BRANCH = "compaction"
INSTRUCTION = (
    "Summarise the conversation above so that it can go on without it: keep every fact,"
    " name, number, decision, result and open question the user or the tools gave, and say"
    " what was done and what remains. Answer with the summary only; call no tool."
)
SUMMARY_HEAD = "Summary of the conversation so far (messages {first}..{last}, kept in the trace):"
MIN_SUMMARISED = 4
"""Messages between the task and the last user turn below which compacting is not worth a
call (fitting elides outputs instead)."""


@dataclass(frozen=True)
class Plan:
    """What a compaction of a main path summarises and keeps."""

    task: Message
    """The summary hangs under it (the system prompt and the task stay)."""
    summarised: list[Message]
    tail: list[Message]
    """The last user turn and what follows it: copied below the summary."""


@dataclass(frozen=True)
class Compacted:
    """What a compaction did (also the `context` event's data)."""

    summarised: int
    first_sequence: int
    last_sequence: int
    summary_sequence: int
    side_branch_sequence: int
    tokens_before: int
    tokens_after: int


def plan(path: list[Message]) -> Plan | None:
    """The compaction of `path`, or None when there is too little to summarise."""
    turns = [
        i
        for i, m in enumerate(path)
        if i >= 2 and m.role == "user" and not m.metadata.get("injected")
    ]
    if len(path) < 2 or path[1].role != "user" or not turns:
        return None
    start = turns[-1]
    if start - 2 < MIN_SUMMARISED:
        return None
    return Plan(path[1], path[2:start], path[start:])


def due(runtime: Runtime, trace: Trace, path: list[Message], model_name: str) -> bool:
    """Whether the next request passes the threshold of a `compact` alias's window."""
    alias = runtime.config.models.get(model_name)
    if alias is None or alias.context_window is None or alias.context_strategy != "compact":
        return False
    tools = tool_schemas(runtime, trace)
    size = estimate_tokens(to_wire(path), tools, runtime.wire_of(model_name))
    return size > alias.context_window * runtime.config.context_threshold


def compacted(runtime: Runtime, snapshot: TraceSnapshot, model_name: str) -> TraceSnapshot | None:
    """Before a turn: compact the trace if its request would pass the threshold.

    Returns the trace read again after compacting, or None (nothing done).
    """
    trace = snapshot.trace
    path = main_path(snapshot.messages, trace.head_sequence)
    if not due(runtime, trace, path, model_name) or (found := plan(path)) is None:
        return None
    done = compact(runtime, trace, path, found, model_name, snapshot.pauses)
    return None if done is None else runtime.store.snapshot(trace.trace_id)


def compact(
    runtime: Runtime,
    trace: Trace,
    path: list[Message],
    found: Plan,
    model_name: str,
    pauses: Any,
    call: Callable[..., LLMResponse | Wait] = call_model,
) -> Compacted | None:
    """Summarise `found` through a side branch and put the summary on the main path.

    None when the gate holds the call back or the model answers nothing.
    """
    request = [
        *to_wire(path[: len(path) - len(found.tail)]),
        {"role": "user", "content": INSTRUCTION},
    ]
    verdict = runtime.gate.before(trace, model_name, request_chars(path, []), pauses)
    if not isinstance(verdict, Go):
        return None
    if verdict.budget.final:  # the tree's last call is its answer's, not a summary's
        runtime.gate.after(verdict, None, None)
        return None
    response = call(prepare(runtime, trace, model_name), trace, verdict, request, [])
    if not isinstance(response, LLMResponse) or not (response.content or "").strip():
        return None
    summary = runtime.redactor.values_only(response.content or "")
    return _write(runtime, trace, path, found, summary, response, model_name)


def _write(
    runtime: Runtime,
    trace: Trace,
    path: list[Message],
    found: Plan,
    summary: str,
    response: LLMResponse,
    model_name: str,
) -> Compacted:
    store, trace_id = runtime.store, trace.trace_id
    side = {"branch": BRANCH, "injected": True}
    store.set_head(trace_id, trace.head_sequence)
    asked = store.append_message(
        Message(trace_id=trace_id, role="user", content=INSTRUCTION, metadata=side)
    )
    store.append_message(
        Message(
            trace_id=trace_id,
            role="assistant",
            content=summary,
            model=model_name,
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
            metadata={"branch": BRANCH},
        )
    )
    first, last = found.summarised[0].sequence, found.summarised[-1].sequence
    store.set_head(trace_id, found.task.sequence)
    head = store.append_message(
        Message(
            trace_id=trace_id,
            role="user",
            content=f"{SUMMARY_HEAD.format(first=first, last=last)}\n\n{summary}",
            metadata={"injected": True, "compaction": {"first": first, "last": last}},
        )
    )
    for message in found.tail:
        copied = {**message.metadata, "copied_from": message.sequence}
        store.append_message(message.model_copy(update={"metadata": copied}))
    before = estimate_tokens(to_wire(path), [])
    after = estimate_tokens(to_wire([*path[:2], head, *found.tail]), [])
    done = Compacted(
        len(found.summarised), first, last, head.sequence, asked.sequence, before, after
    )
    _note(runtime, trace, done)
    return done


def _note(runtime: Runtime, trace: Trace, done: Compacted) -> None:
    """The trace's run state (`run.context`) and a `context` event say it happened."""
    previous = runtime.store.get_trace(trace.trace_id).run.context or ContextNote()
    note = previous.model_copy(
        update={
            "compactions": previous.compactions + 1,
            "tokens_before": done.tokens_before,
            "tokens_after": done.tokens_after,
        }
    )
    data = {"compacted": done.summarised, **done.__dict__}
    event = Event(kind="context", trace_id=trace.trace_id, data=data)
    runtime.store.apply(
        TraceWrite(trace.trace_id, trace.root_trace_id).emit(event).update_run(context=note)
    )


def compact_now(runtime: Runtime, trace_id: str) -> Compacted:
    """`fleet compact ID`: compact a finished root now, in this process, under its lease.

    Raises:
        ConversationError: not a finished root, busy, or too little to summarise (nothing
            written), or the model answered nothing.
        TraceNotFound: no such trace.
    """
    store = runtime.store
    owner = uuid.uuid4().hex
    if not store.acquire_lease(trace_id, owner, runtime.settings.lease_ttl_ms):
        raise ConversationError(f"trace {trace_id!r} is busy: another run holds it")
    try:
        snapshot = store.snapshot(trace_id)
        trace = snapshot.trace
        if trace.parent_trace_id is not None or not trace.is_terminal:
            raise ConversationError(f"trace {trace_id!r}: compact a finished root only")
        path = main_path(snapshot.messages, trace.head_sequence)
        found = plan(path)
        if found is None:
            raise ConversationError(
                f"trace {trace_id!r}: too little to compact (fewer than {MIN_SUMMARISED}"
                " messages between the task and the last user turn)"
            )
        model_name = runtime.model_name(trace.model, trace.preset)
        done = compact(runtime, trace, path, found, model_name, snapshot.pauses)
        if done is None:
            raise ConversationError(
                f"trace {trace_id!r}: the model gave no summary (held or empty)"
            )
        return done
    finally:
        store.release_lease(trace_id, owner)
