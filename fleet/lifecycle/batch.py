"""A model call parked on a provider batch (`fleet.batchapi`): the trace's wait and its end.

`waiting` with a `{type: batch, batch_id}` collaborator and no runner; `queued` again once
the poller stored the answer (or the call goes live, or was cancelled); a stop takes the
call out of the queue.
"""

from __future__ import annotations

from fleet.lifecycle.entries import put_collaborator
from fleet.models import Collaborator, CollaboratorStatus, Event, Trace
from fleet.runstate import BatchCallState, BatchWait
from fleet.runtime import Runtime
from fleet.storage.batch_calls import batch_calls
from fleet.storage.writes import TraceWrite

BATCH_ENTRY = "batch"
"""The collaborator key of a trace's provider-batch entry (one per trace, every turn)."""


def wait_on_batch(runtime: Runtime, trace: Trace, custom_id: str) -> Trace:
    """`waiting` on a provider batch: no runner, no slot, a `{type: batch}` collaborator.

    The call is the trace's `run.waiting_on_batch` until the resumed run consumed its answer.
    """
    parked = BatchWait(custom_id=custom_id, state="parked")
    event = Event(kind="trace", trace_id=trace.trace_id, status="waiting", data={"on": "batch"})
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, status="waiting")
    runtime.store.apply(write.update_run(waiting_on_batch=parked))
    waited = trace.model_copy(update={"status": "waiting"}).with_run(waiting_on_batch=parked)
    put_batch(runtime, waited, "waiting", "queued for the next provider batch")
    return waited


def batch_answered(
    runtime: Runtime, trace: Trace, state: BatchCallState, batch_id: str | None
) -> Trace:
    """The call's answer is stored (or it goes live, or was cancelled): `queued` to run on."""
    parked = (trace.run.waiting_on_batch or BatchWait()).model_copy(update={"state": state})
    summary = {"answered": "answered", "live": "errored in its batch: made live"}
    put_batch(runtime, trace, "completed", summary.get(state, state), batch_id)
    event = Event(kind="trace", trace_id=trace.trace_id, status="queued", data={"on": "batch"})
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(event, status="queued")
    runtime.store.apply(write.update_run(waiting_on_batch=parked))
    return trace.model_copy(update={"status": "queued"}).with_run(waiting_on_batch=parked)


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
    """A stopped trace's call leaves the queue (or is marked cancelled in its batch).

    A call cancelled in a batch wakes a worker's batch waker (`workers.batch_poll`): a batch
    whose every call is now cancelled is cancelled at the provider within a round trip.
    """
    parked = trace.run.waiting_on_batch
    if trace.status != "waiting" or parked is None:
        return
    calls = batch_calls(runtime.store)
    if calls.cancel(str(parked.custom_id)) == "cancelled":  # in a batch the provider holds
        calls.wake()  # a worker cancels it there now, not at the next poll
    put_batch(runtime, trace, "stopped", "stop requested")
