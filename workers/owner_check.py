"""The fleet's owner check on the workers: one worker per interval applies `fleet.owners`.

Every `Settings.owner_check_interval_s` each worker's sweeper asks for the fleet-wide claim
(`OwnerIndex.claim_check`); the one that gets it walks the open trees that have been quiet
for `Settings.stuck_after_s` and applies a remedy to each trace nothing moves. A re-send is
skipped while the trace's queue holds messages: one of them may be its own, and the next
check looks again once the queue drained.
"""

from __future__ import annotations

import logging
import socket
from typing import assert_never

from celery import Celery

from fleet import lifecycle, owners
from fleet.models import now_ms
from fleet.owners import Fail, Rearm, Remedy, Resend, Settle, Stop
from fleet.runtime import Runtime
from fleet.storage import outbox
from fleet.storage.owner_index import owner_index
from fleet.storage.writes import TraceWrite
from workers.app import QUEUE_BY_MODE, app
from workers.dispatch import send

log = logging.getLogger(__name__)

CHECKER = f"{socket.gethostname()}:{id(app)}"
"""Who holds the check's claim (for an operator reading Redis)."""


def check_owners(runtime: Runtime) -> list[Remedy]:
    """Run the check if this worker holds this interval's claim; the remedies applied."""
    store, settings = runtime.store, runtime.settings
    index = owner_index(store, settings.retention_s)
    if not index.claim_check(CHECKER, int(settings.owner_check_interval_s * 1000)):
        return []
    found = owners.check(store, index, now_ms(), int(settings.stuck_after_s * 1000))
    applied = [r for r in found if apply(runtime, r)]
    if applied:
        store.count("stuck_traces", len(applied))
    return applied


def apply(runtime: Runtime, remedy: Remedy, via: Celery = app) -> bool:
    """Heal (or fail) one unowned trace; False when it was left for the next check."""
    trace = remedy.trace
    match remedy:
        case Resend():
            if queued_messages(via, QUEUE_BY_MODE[trace.mode]):
                return False
            _count_heal(runtime, remedy)
            send(trace, recovered=True)
        case Settle():
            _count_heal(runtime, remedy)
            runtime.store.outbox_put(outbox.settle_entry(trace.trace_id, remedy.tool_call_id), 0)
        case Stop():
            lifecycle.end_stopped(runtime, trace.trace_id)
        case Rearm():  # the sweeper times it out once the deadline passed
            runtime.store.index_human_wait(trace.trace_id, remedy.deadline_ms)
        case Fail():
            lifecycle.fail(runtime, trace.trace_id, error=remedy.why, reason="lost")
        case _:
            assert_never(remedy)
    log.warning("%s had no owner (%s): %s", trace.trace_id, remedy.why, remedy.kind)
    return True


def _count_heal(runtime: Runtime, remedy: Remedy) -> None:
    """Remember the attempt on the trace (its `updated_at_ms` also holds the next check off)."""
    # Only `run.owner_heals` is written (one field: a call parked on a provider batch since
    # the check's snapshot is left as it is), counted from a fresh read.
    trace = runtime.store.get_trace(remedy.trace.trace_id)
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(None, updated_at_ms=now_ms())
    runtime.store.apply(write.update_run(owner_heals=trace.run.owner_heals + 1))


def queued_messages(via: Celery, queue: str) -> int:
    """Messages waiting in `queue` (a passive declare: kombu sums Redis' priority lists)."""
    with via.connection_for_read() as connection:
        channel = connection.default_channel
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except connection.channel_errors:  # never declared, or no list: nothing waits
            return 0
