"""A remote sub-agent (`fleet.remote`) parked on its A2A task: the child's wait and its end.

`waiting` with a `{type: remote, trace_id: agent://NAME/<task id>}` collaborator of its own
and no runner while the remote agent works; `queued` again once a poller saw the task end
(the run that follows finishes the child with the stored result, so the finish is fenced
by that run's lease like every other). The remote call's state is the trace's run state
(`run.remote_call`, a `fleet.runstate.RemoteCall`), written with the status it goes with.
"""

from __future__ import annotations

from fleet.lifecycle.entries import put_collaborator
from fleet.models import Collaborator, CollaboratorStatus, Event, Trace
from fleet.runstate import REMOTE_ENTRY_PREFIX, RemoteCall
from fleet.runtime import Runtime
from fleet.storage.writes import TraceWrite

__all__ = [
    "REMOTE_ENTRY_PREFIX",
    "RemoteCall",
    "call_of",
    "put_remote",
    "remote_ended",
    "remote_progress",
    "wait_on_remote",
]


def call_of(trace: Trace) -> RemoteCall | None:
    """The trace's remote call, if it is a remote child."""
    return trace.run.remote_call if trace.mode == "remote" else None


def wait_on_remote(runtime: Runtime, trace: Trace, call: RemoteCall) -> Trace:
    """`waiting` on the remote task: no runner, no slot, a `{type: remote}` collaborator."""
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "remote"})
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, status="waiting")
    runtime.store.apply(write.update_run(remote_call=call))
    waited = trace.model_copy(update={"status": "waiting"}).with_run(remote_call=call)
    put_remote(runtime, waited, call, "waiting", f"sent to remote agent {call.agent!r}")
    return waited


def remote_progress(runtime: Runtime, trace: Trace, call: RemoteCall, text: str) -> Trace:
    """The remote task said something while it works: the child's entry and event."""
    runtime.store.update_run(trace.trace_id, remote_call=call)
    updated = trace.with_run(remote_call=call)
    put_remote(runtime, updated, call, "running", text)
    return updated


def remote_ended(runtime: Runtime, trace: Trace, call: RemoteCall) -> Trace:
    """The task ended (`call.result`): `queued`, so a run finishes the child with it."""
    status: CollaboratorStatus = "completed" if call.ok else "failed"
    put_remote(runtime, trace, call, status, call.result)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "remote"})
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, status="queued")
    runtime.store.apply(write.update_run(remote_call=call))
    return trace.model_copy(update={"status": "queued"}).with_run(remote_call=call)


def put_remote(
    runtime: Runtime, trace: Trace, call: RemoteCall, status: CollaboratorStatus, summary: str
) -> None:
    """The child's own `{type: remote}` entry: the remote agent, by its `agent://` id."""
    remote_id = call.remote_id() or f"{REMOTE_ENTRY_PREFIX}{call.agent}/"
    entry = Collaborator(
        name=call.agent,
        type="remote",
        trace_id=remote_id,
        status=status,
        summary=summary[: runtime.settings.summary_chars],
        mode="remote",
        remote_id=call.remote_id(),
    )
    note = summary[: runtime.settings.summary_chars]  # what the remote said: `fleet watch` shows it
    extra = {"type": "remote", "remote_id": call.remote_id(), "note": note}
    put_collaborator(runtime.store, trace.trace_id, trace, entry, status, extra=extra)
