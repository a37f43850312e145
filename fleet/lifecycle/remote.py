"""A remote sub-agent (`fleet.remote`) parked on its A2A task: the child's wait and its end.

`waiting` with a `{type: remote, trace_id: agent://NAME/<task id>}` collaborator of its own
and no runner while the remote agent works; `queued` again once a poller saw the task end
(the run that follows finishes the child with the stored result, so the finish is fenced
by that run's lease like every other). The remote call's state is the trace's
`REMOTE_KEY` metadata (`RemoteCall`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from fleet.lifecycle.entries import REMOTE_KEY, put_collaborator
from fleet.models import Collaborator, CollaboratorStatus, Event, Trace
from fleet.runtime import Runtime

REMOTE_ENTRY_PREFIX = "agent://"

CallState = Literal["new", "sent", "input", "ended"]


class RemoteCall(BaseModel):
    """Where a remote child's A2A task is (stored in its trace's metadata)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    agent: str
    """The `remote_agents` name the call goes to."""
    state: CallState = "new"
    """new: nothing sent yet; sent: the task works (a poller watches it); input: it asked
    for input (a person answers, `fleet reply`); ended: `result` holds its end."""
    task_id: str | None = None
    context_id: str | None = None
    """The remote conversation: a later message (`continue_from`) goes to it."""
    sent_sequence: int = 0
    tasks: tuple[str, ...] = ()
    """Earlier tasks of this child's remote conversation (each `continue_from` makes one)."""
    """The child's last message that went to the remote task."""
    deadline_ms: int | None = None
    """When the remote task is cancelled and the child fails (timeout_s or the tree's wall_s)."""
    seen: str = ""
    """The last status text seen (a poll that sees it again adds no event)."""
    errors: int = 0
    """Polls in a row that could not reach the agent."""
    ok: bool = False
    result: str = ""
    """The artifact's text (ok) or a one-line error."""

    def remote_id(self) -> str | None:
        """`agent://NAME/<task id>`, once the agent gave a task id."""
        return f"{REMOTE_ENTRY_PREFIX}{self.agent}/{self.task_id}" if self.task_id else None


def call_of(trace: Trace) -> RemoteCall | None:
    """The trace's remote call, if it is a remote child."""
    raw = trace.metadata.get(REMOTE_KEY)
    return RemoteCall.model_validate(raw) if isinstance(raw, dict) else None


def with_call(trace: Trace, call: RemoteCall) -> dict[str, object]:
    """The trace's metadata holding `call`."""
    return {**trace.metadata, REMOTE_KEY: call.model_dump()}


def wait_on_remote(runtime: Runtime, trace: Trace, call: RemoteCall) -> Trace:
    """`waiting` on the remote task: no runner, no slot, a `{type: remote}` collaborator."""
    metadata = with_call(trace, call)
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "remote"})
    runtime.store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="waiting", metadata=metadata
    )
    waited = trace.model_copy(update={"status": "waiting", "metadata": metadata})
    put_remote(runtime, waited, call, "waiting", f"sent to remote agent {call.agent!r}")
    return waited


def remote_progress(runtime: Runtime, trace: Trace, call: RemoteCall, text: str) -> Trace:
    """The remote task said something while it works: the child's entry and event."""
    metadata = with_call(trace, call)
    runtime.store.update_trace(trace.trace_id, metadata=metadata)
    updated = trace.model_copy(update={"metadata": metadata})
    put_remote(runtime, updated, call, "running", text)
    return updated


def remote_ended(runtime: Runtime, trace: Trace, call: RemoteCall) -> Trace:
    """The task ended (`call.result`): `queued`, so a run finishes the child with it."""
    metadata = with_call(trace, call)
    status: CollaboratorStatus = "completed" if call.ok else "failed"
    put_remote(runtime, trace, call, status, call.result)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "remote"})
    runtime.store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="queued", metadata=metadata
    )
    return trace.model_copy(update={"status": "queued", "metadata": metadata})


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
    extra = {"type": "remote", "remote_id": call.remote_id()}
    put_collaborator(runtime.store, trace.trace_id, trace, entry, status, extra=extra)
