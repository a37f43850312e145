"""A remote child's run: send what the remote task has not seen, park, or finish.

Called by the loop (`fleet.loop.fenced_run`) for a trace of mode `remote`, under its lease.
A run sends at most one message (the task, a person's reply, a `continue_from` message)
and then, on a task queue (`park=True`), puts the child `waiting` on the watch list and
returns: the worker slot is free while the remote agent works. An in-process host
(`park=False`: no sweeper polls for it) asks the task's state itself until it ends, on a
thread that is not a worker slot. A run that finds the call ended finishes the child
with its result; one told to stop cancels the remote task and ends `stopped`.

Faults: a worker that dies after the send is recorded (`sent_sequence`) and before the
park leaves a `running` child whose lease lapses; the run sent again finds the message
sent and only parks. A runner checks its lease (a write behind it) right before the send,
so one frozen past it sends nothing once it thaws, and a record that meets the store away
is tried again while the store comes back. One that dies (or freezes past its lease)
while its send is in flight leaves the message to be sent again by the next run, with the
same message id (the trace and the message's sequence): an agent that keeps message ids
sees a repeat, one that does not starts a second task (the first is never polled; its
agent's own expiry ends it). A poller that dies mid-poll
leaves the entry, due again one lease later.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any, Literal

from fleet import lifecycle
from fleet.config.remote_agents import RemoteAgentConfig
from fleet.conversation.human import wait_for_person
from fleet.errors import FleetError
from fleet.lifecycle.remote import RemoteCall, call_of
from fleet.models import Message, Trace, now_ms
from fleet.remote.decide import AskPerson, Decision, Ended, Progress, Unchanged, decide
from fleet.remote.task import RemoteError, RemoteTask
from fleet.runtime import Runtime
from fleet.storage.remote_watch import REMOTE_WATCH

log = logging.getLogger(__name__)

ASK_PREFIX = "remote-input"
"""The `tool_call_id` of a remote task's question to a person: `remote-input-N`."""

RemoteEnd = Literal["completed", "failed", "stopped"]
"""How a run of a remote child ended it; a run that parks it returns the call it waits on."""


def agent_of(runtime: Runtime, call: RemoteCall) -> tuple[RemoteAgentConfig, str | None]:
    """The operator's entry for the call's agent and its token.

    Raises:
        FleetError: the agent left fleet.yaml, or its token variable is not set.
    """
    agent = runtime.config.remote_agents.get(call.agent)
    if agent is None:
        raise FleetError(f"remote agent {call.agent!r} is not in fleet.yaml's remote_agents")
    token = runtime.settings.env.get(agent.token_env) if agent.token_env else None
    if agent.token_env and not token:
        raise FleetError(f"remote agent {call.agent!r}: variable {agent.token_env} is not set")
    return agent, token


def run_remote(runtime: Runtime, trace: Trace, *, park: bool) -> RemoteEnd | RemoteCall:
    """One run of a remote child: how it ended the child, or the call it waits on.

    The run waits (no slot held) while the remote task works, or while a person answers
    the task's question (see the module doc).
    """
    call = call_of(trace)
    if call is None:
        return _finish(runtime, trace, False, "not a remote call")
    try:
        agent, token = agent_of(runtime, call)
    except FleetError as exc:
        return _finish(runtime, trace, False, str(exc))
    if call.state != "ended" and not runtime.store.stop_requested(trace.trace_id):
        try:
            call = _send_unsent(runtime, trace, call, agent, token)
        except RemoteError as exc:
            return _finish(runtime, trace, False, f"remote agent {call.agent!r}: {exc}")
    if runtime.store.stop_requested(trace.trace_id):  # before the send, or while it went
        cancel_task(agent, token, call)
        lifecycle.finish(runtime, trace.trace_id, "stopped", error="stop requested", reason="stop")
        return "stopped"
    if call.state == "ended":
        return _finish(runtime, trace, call.ok, call.result)
    if park:
        runtime.store.capability(REMOTE_WATCH).watch(trace.trace_id, now_ms())
        lifecycle.wait_on_remote(runtime, trace, call)
        return call
    return _follow(runtime, trace, call, agent, token)


def _send_unsent(
    runtime: Runtime, trace: Trace, call: RemoteCall, agent: RemoteAgentConfig, token: str | None
) -> RemoteCall:
    """Send the messages the remote task has not seen (none: the call as it is)."""
    messages = runtime.store.messages(trace.trace_id)
    if call.state == "new" and not messages:  # the first run: the task is the first message
        first = Message(trace_id=trace.trace_id, role="user", content=_opening(trace))
        messages = [runtime.store.append_message(first)]
    unsent = [m for m in messages if m.sequence > call.sent_sequence and m.role in ("user", "tool")]
    if not unsent:
        return call
    text = "\n\n".join(str(m.content or "") for m in unsent)
    answering = call.task_id if call.state == "input" else None
    message_id = hashlib.sha256(f"{trace.trace_id}#{unsent[-1].sequence}".encode()).hexdigest()
    from fleet.remote import wire  # a2a-sdk and httpx: loaded by a call, not by a worker's start

    # Still ours? A write behind the lease, right before the send: a runner frozen past its
    # lease (its run recovered meanwhile, which sent the message) sends nothing when it
    # thaws (`LeaseLost`); it sent a second task (make chaos seed 44 round 13).
    runtime.store.update_run(trace.trace_id, remote_call=call)
    task = wire.send(
        agent,
        token,
        text,
        task_id=answering,
        context_id=call.context_id,
        message_id=message_id[:32],
    )
    past = [*call.tasks, call.task_id] if call.task_id and call.task_id != task.task_id else []
    deadline_ms = _deadline_ms(runtime, trace, agent)
    call = call.model_copy(
        update={
            "state": "sent",
            "task_id": task.task_id,
            "context_id": task.context_id or call.context_id,
            "sent_sequence": unsent[-1].sequence,
            "deadline_ms": deadline_ms,
            "tasks": tuple(past or call.tasks)[-20:],
            "seen": "",
        }
    )
    _record(runtime, trace.trace_id, call)
    decision = decide(call, task, now_ms())
    return decision.call if isinstance(decision, Ended) else call


RECORD_RETRY_S = 0.2
"""How often the record of a send is tried again while the store is away."""


def _record(runtime: Runtime, trace_id: str, call: RemoteCall) -> None:
    """Record a send, tried again while the store comes back (a restart, a failover).

    Sent and not recorded, the message goes again on the child's next run: a second task
    at an agent that keeps no message ids (make chaos, seed 40 round 24: a Redis restart).
    Tried for one lease TTL (the heartbeat keeps the lease meanwhile); a fenced write
    (`LeaseLost`: another runner took the child) is not tried again.
    """
    deadline_s = time.monotonic() + runtime.settings.lease_ttl_ms / 1000
    while True:
        try:
            runtime.store.update_run(trace_id, remote_call=call)
            return
        except Exception as exc:
            if not runtime.store.unavailable(exc) or time.monotonic() > deadline_s:
                raise
            log.warning("%r: the record of its remote send waits for the store: %s", trace_id, exc)
            time.sleep(RECORD_RETRY_S)


def message_id_of(trace_id: str, sequence: int) -> str:
    """The A2A message id of what a child sends up to `sequence`: the same when sent again."""
    return hashlib.sha256(f"{trace_id}#{sequence}".encode()).hexdigest()[:32]


def _opening(trace: Trace) -> str:
    """The first message: the task, with the context messages the model passed, if any."""
    context: Any = trace.context.get("messages") or []
    lines = [str(m.get("content", "")) for m in context if isinstance(m, dict)]
    return "\n\n".join([*lines, trace.task]) if lines else trace.task


def _deadline_ms(runtime: Runtime, trace: Trace, agent: RemoteAgentConfig) -> int:
    """The agent's timeout_s from now, or the tree's wall_s deadline if that comes first."""
    deadline_ms = now_ms() + int(agent.timeout_s * 1000)
    budgets = runtime.gate.budgets
    wall_ms = budgets.deadline_ms(trace.root_trace_id) if budgets is not None else None
    return min(deadline_ms, wall_ms) if wall_ms is not None else deadline_ms


def _follow(
    runtime: Runtime, trace: Trace, call: RemoteCall, agent: RemoteAgentConfig, token: str | None
) -> RemoteEnd | RemoteCall:
    """In process: ask the task's state every poll interval until it ends or asks."""
    while True:
        time.sleep(runtime.settings.remote_poll_s)
        if runtime.store.stop_requested(trace.trace_id):
            return run_remote(runtime, trace, park=False)  # cancels and ends stopped
        decision = observe(agent, token, call)
        trace, call = apply(runtime, trace, decision)
        if isinstance(decision, Ended):
            return _finish(runtime, trace, call.ok, call.result)
        if isinstance(decision, AskPerson):
            return call


def observe(agent: RemoteAgentConfig, token: str | None, call: RemoteCall) -> Decision:
    """`aobserve` from synchronous code (an in-process run's thread)."""
    return asyncio.run(aobserve(agent, token, call))


async def aobserve(agent: RemoteAgentConfig, token: str | None, call: RemoteCall) -> Decision:
    """Ask the task's state once and decide (a timeout cancels the remote task)."""
    from fleet.remote import wire  # loaded by a call, not by a worker's start

    try:
        seen: RemoteTask | RemoteError = await wire.aget(agent, token, str(call.task_id))
    except RemoteError as exc:
        seen = exc
    decision = decide(call, seen, now_ms())
    if isinstance(decision, Ended) and decision.cancel:
        await acancel_task(agent, token, call)
    return decision


def apply(runtime: Runtime, trace: Trace, decision: Decision) -> tuple[Trace, RemoteCall]:
    """Write what `decision` changes on a child that is not running (no lease held)."""
    call = decision.call
    match decision:
        case Unchanged():
            if call != call_of(trace):
                runtime.store.update_run(trace.trace_id, remote_call=call)
            return trace.with_run(remote_call=call), call
        case Progress(text=text):
            return lifecycle.remote_progress(runtime, trace, call, text), call
        case AskPerson(question=question):
            call_id = f"{ASK_PREFIX}-{call.sent_sequence}"
            waiting = {"kind": "human", "tool_call_id": call_id, "question": question}
            # The call's `input` state and the question in one write: never one alone.
            return wait_for_person(runtime, trace, waiting, also={"remote_call": call}), call
        case Ended():
            return lifecycle.remote_ended(runtime, trace, call), call


def cancel_task(agent: RemoteAgentConfig, token: str | None, call: RemoteCall) -> None:
    """`acancel_task` from synchronous code (a run's thread)."""
    asyncio.run(acancel_task(agent, token, call))


async def acancel_task(agent: RemoteAgentConfig, token: str | None, call: RemoteCall) -> None:
    """Cancel the remote task, if one runs; an agent that does not answer is logged."""
    if call.task_id is None or call.state == "ended":
        return
    from fleet.remote import wire  # loaded by a call, not by a worker's start

    try:
        await wire.acancel(agent, token, call.task_id)
    except RemoteError as exc:
        log.warning("cancel of remote task %s of %r: %s", call.task_id, call.agent, exc)


def cancel_unwatched(runtime: Runtime, trace_ids: list[str]) -> list[str]:
    """Cancel the remote task of each stopped remote child no watcher follows; their ids.

    After a stop (`lifecycle.stop_subtree`), by the stopping process. A worker's watcher
    follows every parked child, also one whose task asks a person, and cancels its task
    itself; an in-process host (`park=False`) follows a task only while its run polls, so
    a child left waiting on a person is watched by no one: its task is cancelled here. An
    agent this process cannot reach (not in its fleet.yaml, no token) is logged, not raised.
    """
    if not runtime.config.remote_agents:
        return []  # no agent to cancel at (and no read for a fleet that has none)
    watch = runtime.store.capability(REMOTE_WATCH)
    cancelled: list[str] = []
    for trace in runtime.store.get_traces(trace_ids):
        call = call_of(trace)
        if call is None or call.task_id is None or call.state == "ended":
            continue
        if trace.status != "stopped" or watch.watched(trace.trace_id):
            continue  # a run still holds it (it cancels), or a watcher does
        try:
            agent, token = agent_of(runtime, call)
        except FleetError as exc:
            log.warning("cannot cancel remote task of %s: %s", trace.trace_id, exc)
            continue
        cancel_task(agent, token, call)
        cancelled.append(trace.trace_id)
    return cancelled


def gone(call: RemoteCall) -> Ended:
    """The end of a call whose agent left fleet.yaml (or lost its token) while it waited."""
    why = f"remote agent {call.agent!r} is no longer configured (fleet.yaml, its token)"
    return Ended(call.model_copy(update={"state": "ended", "ok": False, "result": why}))


def _finish(runtime: Runtime, trace: Trace, ok: bool, text: str) -> RemoteEnd:
    status: RemoteEnd = "completed" if ok else "failed"
    if ok:
        lifecycle.finish(runtime, trace.trace_id, status, answer=text, reason="remote")
    else:
        lifecycle.finish(runtime, trace.trace_id, status, error=text, reason="remote")
    return status
