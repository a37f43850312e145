"""Conversations: continue a finished root with a new user message, or rewind it first.

A root that completed, failed or was stopped takes a new user message and runs again with
its whole history (the seeds' "continue"). With `after_sequence` the head first moves to
that message, so the new turn branches off there (the seeds' "rewind"/"regenerate"); the
old branch stays in the message tree, and the children and collaborators of old turns stay
readable. `regenerate` is a rewind with no new message: the model answers the message at
`after_sequence` again. Every check runs before the first write: bad input writes nothing.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from typing import Any

from fleet import lifecycle
from fleet.errors import ConversationError
from fleet.history import healed_result, main_path, open_turn
from fleet.models import Message, Trace, text_of
from fleet.runtime import Runtime
from fleet.storage.store import Leases

TURN_KEY = "turn"
"""Message metadata of a continue's user message, and its event's data: the turn number."""
RELEASE_WAIT_S = 2.0
"""A finished run releases its lease just after its finish event: a continue sent right
away waits this long for it."""


def stamp(trace_id: str, turn: int) -> str:
    """The value a task of this turn is stamped (and revoked) with.

    A worker remembers revoked stamps until it restarts, so a continued root needs new
    values: after `fleet stop`, the first run's stamps stay revoked and the next turn's
    tasks must not match them. Turn 0 keeps the bare trace id.
    """
    return trace_id if turn == 0 else f"{trace_id}~{turn}"


def turn_of(trace: Trace) -> int:
    """Which turn of its root this trace belongs to."""
    return trace.run.turn


def continue_trace(
    runtime: Runtime, trace_id: str, message: str, after_sequence: int | None = None
) -> Trace:
    """Append a user message to a finished root (after `after_sequence`) and queue it.

    Returns:
        The trace, `queued`, ready to be run or enqueued.

    Raises:
        ConversationError: empty message, a sub-trace, a trace that has not ended, a
            sequence that is not in the trace; nothing was written.
        TraceNotFound: no such trace.
    """
    if not message.strip():
        raise ConversationError("the message is empty")
    return _reopen(runtime, trace_id, after_sequence, message)


def regenerate(runtime: Runtime, trace_id: str, after_sequence: int) -> Trace:
    """Run a finished root again from message `after_sequence`, with no new message.

    The seeds' "regenerate": the head goes back to that message and the model answers it
    once more; the answer it gave before stays in the message tree, off the main path. The
    message must be one a model answers (the task, a user turn, a tool result; an assistant
    turn with tool calls stands for its last result), never an answer or the system prompt.

    Raises:
        ConversationError: a sub-trace, a trace that has not ended, a sequence that is not
            in the trace or that nothing answers; nothing was written.
        TraceNotFound: no such trace.
    """
    return _reopen(runtime, trace_id, after_sequence, None)


def _reopen(
    runtime: Runtime, trace_id: str, after_sequence: int | None, message: str | None
) -> Trace:
    """Under the trace's lease: the checks, then the new turn (`message` None: regenerate)."""
    store = runtime.store
    _check_continuable(store.get_trace(trace_id))
    owner = uuid.uuid4().hex  # hold the lease: no runner and no second continue meanwhile
    if not _take_lease(store, trace_id, owner, runtime.settings.lease_ttl_ms):
        raise ConversationError(f"trace {trace_id!r} is busy: another run holds it")
    try:
        snapshot = store.snapshot(trace_id)
        trace = snapshot.trace
        _check_continuable(trace)
        head = rewind_point(snapshot.messages, trace, after_sequence)
        if message is None:
            _check_answerable(snapshot.messages, trace, head, after_sequence)
        return _write_turn(runtime, trace, snapshot.messages, head, message, after_sequence)
    finally:
        store.release_lease(trace_id, owner)


def _check_answerable(
    messages: list[Message], trace: Trace, head: int | None, after: int | None
) -> None:
    """`ConversationError` unless the message at `head` is one a model answers."""
    point = next((m for m in messages if m.sequence == head), None)
    if point is None or point.role in ("user", "tool") or point.tool_calls:
        return  # tool calls at the head: an interrupted turn, its results healed on the way
    what = "the system prompt" if point.role == "system" else "an answer of the model"
    before = f" (its parent is {point.parent_sequence})" if point.parent_sequence else ""
    raise ConversationError(
        f"trace {trace.trace_id!r}: message {after} is {what}: regenerate from a message the"
        f" model answers{before}"
    )


def _take_lease(store: Leases, trace_id: str, owner: str, ttl_ms: int) -> bool:
    """The lease, waiting out a runner that wrote its finish and is letting go of it."""
    deadline = time.monotonic() + RELEASE_WAIT_S
    while not store.acquire_lease(trace_id, owner, ttl_ms):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _check_continuable(trace: Trace) -> None:
    if trace.parent_trace_id is not None:
        raise ConversationError(
            f"trace {trace.trace_id!r} is a sub-trace: continue its root "
            f"{trace.root_trace_id!r} (its parent resumes it with continue_from)"
        )
    if trace.status == "waiting" and trace.run.waiting_on is not None:
        raise ConversationError(
            f"trace {trace.trace_id!r} is waiting on a person: answer it with "
            f"`fleet reply {trace.trace_id} ANSWER`"
        )
    if not trace.is_terminal:
        raise ConversationError(
            f"trace {trace.trace_id!r} is {trace.status}: only a completed, failed or "
            "stopped trace can be continued"
        )


def rewind_point(messages: list[Message], trace: Trace, after: int | None) -> int | None:
    """The sequence the new user message hangs under.

    `after` may name any message of the tree. An assistant turn is never cut between its
    tool calls and their results: the point moves down to its last result, as in the seeds.
    """
    if after is None:
        return trace.head_sequence
    by_sequence = {m.sequence: m for m in messages}
    if after not in by_sequence:
        last = trace.last_sequence
        raise ConversationError(
            f"trace {trace.trace_id!r} has no message {after} (its messages are 1..{last})"
        )
    below: dict[int | None, list[Message]] = defaultdict(list)
    for m in messages:
        below[m.parent_sequence].append(m)
    cursor = after
    while open_turn(main_path(messages, cursor)) is not None:
        results = [m for m in below[cursor] if m.role == "tool"]
        if not results:
            break  # an interrupted turn: its missing results are healed below
        cursor = results[-1].sequence
    return cursor


def _write_turn(
    runtime: Runtime,
    trace: Trace,
    messages: list[Message],
    head: int | None,
    text: str | None,
    after: int | None,
) -> Trace:
    """Move the head, heal an open turn, add the user message (if any), reopen the root."""
    store = runtime.store
    if head != trace.head_sequence:
        store.set_head(trace.trace_id, head)
    # A stop or crash may have left the turn at the head open: providers refuse a user
    # message between tool calls and their results, so those get synthetic results first.
    turn = open_turn(main_path(messages, head))
    for missing in turn.missing if turn else ():
        store.append_message(healed_result(trace.trace_id, missing, None))
    number = turn_of(trace) + 1
    data: dict[str, Any] = {TURN_KEY: number, "after_sequence": after}
    if text is None:
        data["regenerate"] = True
    else:
        user = store.append_message(
            Message(
                trace_id=trace.trace_id,
                role="user",
                content=text,
                metadata={TURN_KEY: number, "after_sequence": after},
            )
        )
        data["sequence"] = user.sequence
    lifecycle.reopen_root(runtime, trace, number, data)
    return store.get_trace(trace.trace_id)


def branches(messages: list[Message], head: int | None) -> list[dict[str, Any]]:
    """Every branch of the message tree: its leaf, whether it is the main path, its turns.

    A branch is the path from the root to a message nothing hangs under; `user_turns` are
    the sequences and texts of its user messages (injected notes left out).
    """
    parents = {m.parent_sequence for m in messages}
    leaves = [m.sequence for m in messages if m.sequence not in parents]
    main = {m.sequence for m in main_path(messages, head)}
    out = []
    for leaf in leaves:
        path = main_path(messages, leaf)
        turns = [
            {"sequence": m.sequence, "content": text_of(m.content)}
            for m in path
            if m.role == "user" and not m.metadata.get("injected")
        ]
        last = path[-1]
        out.append(
            {
                "leaf_sequence": leaf,
                "main": leaf in main,
                "user_turns": turns,
                "last": {"role": last.role, "content": text_of(last.content)},
            }
        )
    return out
