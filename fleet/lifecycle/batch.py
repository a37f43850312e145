"""A model call parked on a provider batch (`fleet.batchapi`): the trace's wait and its end.

`waiting` with a `{type: batch, batch_id}` collaborator and no runner; `queued` again once
the poller stored the answer (or the call goes live, or was cancelled); a stop takes the
call out of the queue.
"""

from __future__ import annotations

from fleet.lifecycle.entries import put_collaborator
from fleet.models import Collaborator, CollaboratorStatus, Event, Trace
from fleet.runtime import Runtime
from fleet.storage.batch_calls import batch_calls

BATCH_KEY = "waiting_on_batch"
"""Trace metadata while its model call waits on a provider batch, and until the resumed run
consumes the answer: `custom_id`, `state` (parked | answered | live | cancelled)."""
BATCH_ENTRY = "batch"
"""The collaborator key of a trace's provider-batch entry (one per trace, every turn)."""


def wait_on_batch(runtime: Runtime, trace: Trace, custom_id: str) -> Trace:
    """`waiting` on a provider batch: no runner, no slot, a `{type: batch}` collaborator."""
    metadata = {**trace.metadata, BATCH_KEY: {"custom_id": custom_id, "state": "parked"}}
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "batch"})
    runtime.store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="waiting", metadata=metadata
    )
    waited = trace.model_copy(update={"status": "waiting", "metadata": metadata})
    put_batch(runtime, waited, "waiting", "queued for the next provider batch")
    return waited


def batch_answered(runtime: Runtime, trace: Trace, state: str, batch_id: str | None) -> Trace:
    """The call's answer is stored (or it goes live, or was cancelled): `queued` to run on."""
    parked = dict(trace.metadata.get(BATCH_KEY) or {})
    metadata = {**trace.metadata, BATCH_KEY: {**parked, "state": state}}
    summary = {"answered": "answered", "live": "errored in its batch: made live"}
    put_batch(runtime, trace, "completed", summary.get(state, state), batch_id)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "batch"})
    runtime.store.update_trace_and_emit(
        trace.trace_id, trace.root_trace_id, event, status="queued", metadata=metadata
    )
    return trace.model_copy(update={"status": "queued", "metadata": metadata})


def put_batch(
    runtime: Runtime,
    trace: Trace,
    status: CollaboratorStatus,
    summary: str,
    batch_id: str | None = None,
) -> None:
    """The trace's `{type: batch, batch_id}` entry with its event."""
    entry = Collaborator(
        name="provider batch",
        type="batch",
        trace_id=BATCH_ENTRY,
        status=status,
        summary=summary,
        mode=trace.mode,
        batch_id=batch_id,
    )
    extra = {"type": "batch", "batch_id": batch_id}
    put_collaborator(runtime.store, trace.trace_id, trace, entry, status, extra=extra)


def stop_batch(runtime: Runtime, trace: Trace) -> None:
    """A stopped trace's call leaves the queue (or is marked cancelled in its batch)."""
    parked = trace.metadata.get(BATCH_KEY)
    if trace.status != "waiting" or not isinstance(parked, dict):
        return
    batch_calls(runtime.store).cancel(str(parked.get("custom_id")))
    put_batch(runtime, trace, "stopped", "stop requested")
