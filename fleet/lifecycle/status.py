"""Every status change of a trace: start, wait, finish, stop, a person's wait, a new turn.

The transitions of `fleet.lifecycle` (its docstring has the whole path); the parent's
collaborator entries they change are written through `fleet.lifecycle.entries`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleet import ids
from fleet.control import subtree
from fleet.lifecycle.batch import stop_batch
from fleet.lifecycle.entries import mirror, put_collaborator
from fleet.lifecycle.recorder import after_finish
from fleet.models import (
    Collaborator,
    CollaboratorStatus,
    CollaboratorType,
    Event,
    Status,
    Trace,
    TracePatch,
    now_ms,
)
from fleet.runstate import RemoteCall, RunPatch
from fleet.runtime import Runtime
from fleet.storage.store import STARTABLE, Serving, StartRun, TraceRecords
from fleet.storage.writes import TraceWrite, WriteResult

# -- the trace's own status -------------------------------------------------------------


def queue_root(
    runtime: Runtime, trace: Trace, serving: Serving | None = None, *, listed: bool = False
) -> Trace:
    """`queued`: a new root is created with its `trace` event, in one step where it can.

    `serving`: refuse first (`ConfigError`, nothing written) a workspace no live worker of
    the queue accepts. `listed`: in the roots index too (a submitted root; a recorder is
    not). The tree is tracked with it, for the owner check (`TraceStore.queue_root`). A
    child's creation is told by its parent's entry instead (`announce`).
    """
    queued = trace.model_copy(update={"status": "queued"})
    event = Event(kind="trace", trace_id=queued.trace_id, status="queued")
    runtime.store.queue_root(queued, event, serving, listed=listed)
    return queued


def start(runtime: Runtime, trace: Trace, write: TraceWrite | None = None) -> Trace:
    """`running`: a runner took the trace (first run or resume).

    With `write`, the change joins that batch (the caller applies it) instead of being
    written now; likewise for `finish`.
    """
    return _set_status(runtime.store, trace, "running", write)


def starting(trace_id: str, experiences: frozenset[str] = frozenset()) -> StartRun:
    """`running`, for `TraceStore.begin_run` to write with the lease when it reads the trace.

    The root is guessed from the id; a trace of another root is started by `start` instead.
    `experiences`: the presets that show experiences (`StartRun.experiences`).
    """
    event = Event(kind="trace", trace_id=trace_id, status="running")
    return StartRun(ids.root_of(trace_id), event, experiences)


def wait(runtime: Runtime, trace: Trace, written: WriteResult | None = None) -> Trace:
    """`waiting` on new sub-agents, or (a resumed run) again on what it still waits on.

    New children's wait is written before they are dispatched (a fast one may end first).
    A trace told to stop meanwhile ends here, `stopped`, with its subtree: with the
    children its model call spawned while the stop landed (nothing would ever run them:
    workers discard their tasks as revoked, so their chord never joins), or as a resumed
    run found its children still running (`stop_subtree` left the `running` trace to its
    runner, and its later resume is revoked). Either way the trace would otherwise wait for
    ever, or until the owner check. The status is written before the flag is read, and
    `stop_subtree` raises the flag before it reads the status, so a stop racing this call
    is seen by one side or the other. `written`: the status went with the turn's write
    (`wait_in`), which read the flag in the same step. Returns the trace `waiting`, or
    `stopped` with its children.
    """
    waiting = trace.model_copy(update={"status": "waiting"})
    if written is None:
        _set_status(runtime.store, trace, "waiting")
    if written.stop_requested if written else runtime.store.stop_requested(trace.trace_id):
        stop_subtree(runtime, trace.trace_id)
        return runtime.store.get_trace(trace.trace_id)
    return waiting


def wait_in(trace: Trace, write: TraceWrite) -> None:
    """`waiting` on new sub-agents, in the turn's `write` (then `wait` with its result)."""
    write.update(Event(kind="trace", trace_id=trace.trace_id, status="waiting"), status="waiting")


def requeue(
    runtime: Runtime,
    trace: Trace,
    why: str = "yield",
    retry_in_s: float = 0.0,
    *,
    attempts: Sequence[Mapping[str, object]] = (),
) -> Trace:
    """`queued` again: the run yielded or waits (a limit, a provider error) and is re-sent.

    `why` and `retry_in_s` go with the `trace` event, so a timeline can say what it waits on;
    so do the failed call's `attempts` after a provider error (the trace page lists them).
    """
    data: dict[str, Any] = {"on": why, "retry_in_s": round(retry_in_s, 3)}
    if attempts:
        data["attempts"] = [dict(a) for a in attempts]
    return _set_status(runtime.store, trace, "queued", data=data)


def reopen(
    runtime: Runtime,
    child: Trace,
    tool_call_id: str,
    *,
    otel: dict[str, str] | None = None,
    remote_call: RemoteCall | None = None,
) -> Trace:
    """An ended child answers a new call (`continue_from`): `queued`, answer and error cleared.

    `otel`: the new call's tracing context (`Hooks.child_context`), which its runs continue.
    `remote_call`: a remote child's call, ready to send the new message (same write).
    """
    fields: TracePatch = {"status": "queued", "parent_tool_call_id": tool_call_id}
    fields |= {"answer": None, "error": None}
    write = TraceWrite(child.trace_id, child.root_trace_id).update(None, **fields)
    run: RunPatch = {}
    if otel:
        run["otel"] = otel
    if remote_call is not None:
        run["remote_call"] = remote_call
    if run:
        write.update_run(**run)
    runtime.store.apply(write)
    return child.model_copy(update=fields).with_run(**run)


def finish(
    runtime: Runtime,
    trace_id: str,
    status: Status,
    *,
    answer: str | None = None,
    error: str | None = None,
    reason: str,
    output: dict[str, Any] | None = None,
    trace: Trace | None = None,
    write: TraceWrite | None = None,
) -> Trace:
    """A terminal status with its `stop_reason`; the parent's entry and the events follow.

    `output`: the answer's validated object (`fleet.loop.structured`), for the trace and the
    parent's collaborator entry.

    `trace`: the trace as it is now, when the caller holds it (a runner does); else it is
    read. `write`: the caller's own writes to this trace, applied here in the same step
    (before the finish's own, after the fence check).

    Returns:
        The trace as written (no second read).
    """
    store = runtime.store
    before = trace if trace is not None else store.get_trace(trace_id)
    runtime.gate.ended(trace_id, before.root_trace_id)  # first: a retried finish releases again
    finished = now_ms()
    redactor = runtime.redactor  # an error may quote a provider body or an exception
    fields: TracePatch = {
        "status": status,
        "answer": redactor.values_only(answer) if answer else answer,
        "error": redactor(error) if error else error,
        "output": redactor.values_in(output) if output else output,
        "finished_at_ms": finished,
        "updated_at_ms": finished,
    }
    data = {"reason": reason, "name": before.name or before.mode}
    if before.parent_trace_id:  # the event stands for the parent's entry too: no event of its own
        data |= {"parent_trace_id": before.parent_trace_id, "mode": before.mode}
    event = Event(kind="finish", trace_id=trace_id, status=status, data=data)
    trace = before.model_copy(update=fields).with_run(stop_reason=reason)
    if write is None and trace.parent_trace_id:
        # the child's end and its parent's entry in one write: two could be cut between (a
        # Redis that lost its last second, a process killed), leaving the child `stopped`
        # and its entry `running` for ever (make chaos, seed 39 round 7)
        write = TraceWrite(trace_id, trace.root_trace_id)
    if write is not None:
        write.update(None if trace.parent_trace_id else event, **fields)
        write.update_run(stop_reason=reason)
        if trace.parent_trace_id:
            mirror(runtime, trace.parent_trace_id, trace, write, announce=False)
            write.emit(event)  # after the parent's entry: a watcher sees the entry written
        store.apply(write)
    else:  # the root: its finish event is the last word, so it goes with the write
        store.apply(_ended(trace, fields, event))
    runtime.hooks.run_finished(trace)
    after_finish(runtime, trace)  # a failed sub-agent goes to its memory's agent_errors
    return trace


def _ended(trace: Trace, fields: TracePatch, event: Event | None) -> TraceWrite:
    """A finish's own write: its fields, its `stop_reason`, its event (a root's)."""
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, **fields)
    return write.update_run(stop_reason=trace.run.stop_reason)


def fail(runtime: Runtime, trace_id: str, *, error: str, reason: str) -> Trace | None:
    """`failed`, unless the trace ended already; the finished trace, or None if it had."""
    if runtime.store.get_trace(trace_id).is_terminal:
        return None
    return finish(runtime, trace_id, "failed", error=error, reason=reason)


def stop_for_budget(runtime: Runtime, trace: Trace, partial: str | None, why: str) -> Trace:
    """The tree's budget ran out (`why`: tokens, usd, wall_s): end with what there is.

    A branch ends `stopped` with its last text as a partial answer, so its parent collects
    it; a root ends `completed` (its final answer was its set-aside last turn). Either way
    the `stop_reason` is "budget".
    """
    if trace.parent_trace_id:
        error = f"cut by the tree's budget ({why})"
        return finish(
            runtime, trace.trace_id, "stopped", answer=partial, error=error, reason="budget"
        )
    answer = partial or f"(the tree's {why} budget ran out before an answer)"
    return finish(runtime, trace.trace_id, "completed", answer=answer, reason="budget")


def stop_subtree(runtime: Runtime, trace_id: str) -> list[str]:
    """Raise the stop flag on a trace and every descendant.

    Traces no runner holds (`STARTABLE`: queued, waiting) are finished `stopped` here,
    because a revoked chord never runs its body; running ones stop themselves between
    turns. Children are
    finished before their parents, so the root's finish event, which ends `fleet run`'s
    wait, comes after every entry it shows.

    Returns:
        Every trace id in the subtree, parents first.
    """
    store = runtime.store
    ids = subtree(store, trace_id)
    for tid in ids:
        store.request_stop(tid)
    for tid in reversed(ids):
        trace = store.get_trace(tid)
        if trace.status in STARTABLE:
            finish(runtime, tid, "stopped", error="stop requested", reason="stop")
            _stop_person(runtime, trace)
            stop_batch(runtime, trace)
    return ids


def end_stopped(runtime: Runtime, trace_id: str) -> None:
    """A trace told to stop that no runner holds ends `stopped`, whatever its status says.

    `stop_subtree` leaves a `running` trace to its runner; when the owner check found
    none (it died, and its lease went with a Redis that lost its last writes), this ends it.
    """
    stop_subtree(runtime, trace_id)
    if not runtime.store.get_trace(trace_id).is_terminal:
        finish(runtime, trace_id, "stopped", error="stop requested", reason="stop")


# -- conversations: a continued root, a wait on a person ---------------------------------


def reopen_root(runtime: Runtime, trace: Trace, turn: int, data: dict[str, Any]) -> Trace:
    """A finished root takes its user turn `turn` (continue/rewind): `queued`, answer cleared.

    `iteration` restarts (max_iterations counts per user turn), the stop reason and any
    wait on a person go, and the stop flag of an earlier `fleet stop` is lowered. `data`
    goes with the `trace` event (the turn number).
    """
    fields: TracePatch = {"status": "queued", "answer": None, "output": None}
    fields |= {"error": None, "finished_at_ms": None, "iteration": 0}
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data=data)
    runtime.store.track_tree(trace.trace_id)
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, **fields)
    runtime.store.apply(write.update_run(turn=turn, stop_reason=None, waiting_on=None))
    runtime.store.clear_stop(trace.trace_id)
    runtime.gate.ended(trace.trace_id, trace.root_trace_id, reopened=True)
    reopened = trace.model_copy(update=fields)
    return reopened.with_run(turn=turn, stop_reason=None, waiting_on=None)


def wait_on_person(
    runtime: Runtime, trace: Trace, waiting: dict[str, Any], also: RunPatch | None = None
) -> Trace:
    """`waiting` on a person (`ask_human`): no runner, a `{human, waiting}` collaborator.

    The status, the question (`waiting_on`, with the fields of `also`) and the `waiting`
    entry with its event are one write: whoever sees any of them can reply at once. (They
    were two: a person who saw the status and replied between them had the reply's
    `completed` entry overwritten by the ask's `waiting` one, and the tree ended with its
    person waiting for ever; found by bench/chaos.)
    """
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "human"})
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, status="waiting")
    run: RunPatch = {**(also or {}), "waiting_on": waiting}
    write.update_run(**run)
    waited = trace.model_copy(update={"status": "waiting"}).with_run(**run)
    question = str(waiting["question"])
    put_person(runtime, waited, str(waiting["tool_call_id"]), "waiting", question, write)
    runtime.store.apply(write)
    return waited


def person_answered(
    runtime: Runtime,
    trace: Trace,
    status: CollaboratorStatus,
    summary: str,
    approved_call: str | None = None,
) -> Trace:
    """The wait ended with a tool result (a reply, a timeout): `queued` for any worker.

    `approved_call`: the call a person approved, for the next run to run (same step).
    """
    waiting = trace.run.waiting_on or {}
    runtime.store.forget_human_wait(trace.trace_id)
    put_person(runtime, trace, str(waiting.get("tool_call_id")), status, summary)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "human"})
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, status="queued")
    write.update_run(waiting_on=None)
    if approved_call is not None:
        write.update_run(approved_call=approved_call)
    runtime.store.apply(write)
    answered = trace.model_copy(update={"status": "queued"}).with_run(waiting_on=None)
    return answered.with_run(approved_call=approved_call) if approved_call else answered


def human_id(tool_call_id: str) -> str:
    """The collaborator key of the person asked by one `ask_human` call."""
    return f"human:{tool_call_id}"


def put_person(
    runtime: Runtime,
    trace: Trace,
    tool_call_id: str,
    status: CollaboratorStatus,
    summary: str,
    write: TraceWrite | None = None,
) -> None:
    """The asked person's entry (type approval for one) and event: into `write`, else now."""
    waiting = trace.run.waiting_on or {}
    kind: CollaboratorType = "approval" if waiting.get("kind") == "approval" else "human"
    entry = Collaborator(
        name=kind,
        type=kind,
        trace_id=human_id(tool_call_id),
        status=status,
        summary=summary[:PERSON_SUMMARY_CHARS],
        mode=trace.mode,
        tool_call_id=tool_call_id,
    )
    extra: dict[str, Any] = {"type": kind}
    if status == "waiting":  # what a person needs to answer it from the event alone
        extra |= {k: waiting[k] for k in APPROVAL_FIELDS if k in waiting}
        extra["question"] = summary
    put_collaborator(runtime.store, trace.trace_id, trace, entry, status, write, extra=extra)


PERSON_SUMMARY_CHARS = 4000
APPROVAL_FIELDS = ("tool", "arguments", "tool_call_id", "shown", "digest")
"""What a waiting approval's event carries: the call as shown and the digest to answer."""


def _stop_person(runtime: Runtime, trace: Trace) -> None:
    """A stopped trace no longer waits on a person: the entry says so, the deadline goes."""
    waiting = trace.run.waiting_on
    if trace.status != "waiting" or waiting is None:
        return
    runtime.store.forget_human_wait(trace.trace_id)
    put_person(runtime, trace, str(waiting["tool_call_id"]), "stopped", "stop requested")


def _set_status(
    store: TraceRecords,
    trace: Trace,
    status: Status,
    write: TraceWrite | None = None,
    data: dict[str, Any] | None = None,
) -> Trace:
    """Write a non-terminal status with its `trace` event (nothing when it is already so)."""
    if trace.status == status:
        return trace
    event = Event(kind="trace", trace_id=trace.trace_id, status=status, data=data or {})
    if write is not None:
        write.update(event, status=status)
    else:
        store.update_trace_and_emit(trace.trace_id, trace.root_trace_id, event, status=status)
    return trace.model_copy(update={"status": status})
