"""The fleet's provider-batch poller on the workers (`fleet.batchapi.poller`).

Every `FLEET_BATCH_POLL_S` each worker's sweeper asks for the fleet-wide claim; the one that
gets it sends `fleet.batch_poll`, which any worker runs (a second poll while one runs
returns at once). The task resumes each trace whose call was answered on any worker.
"""

from __future__ import annotations

import logging
import socket
import threading

from fleet.batchapi.poller import claim_poll, poll_fleet
from fleet.batchapi.providers import ProviderFactory, provider_for
from fleet.runtime import Runtime
from fleet.storage.outage import is_outage, warn_failed
from workers.app import app
from workers.dispatch import send_answered, tree_schedule
from workers.runtime import get_runtime

log = logging.getLogger(__name__)

POLLER = f"{socket.gethostname()}:{id(app)}"
"""Who holds the poll's claim (for an operator reading Redis)."""

_providers: dict[int, tuple[Runtime, ProviderFactory]] = {}
_lock = threading.Lock()


def providers(runtime: Runtime) -> ProviderFactory:
    """The Batch API clients of this process (one per model, kept between polls)."""
    with _lock:
        known = _providers.get(id(runtime))
        if known is None or known[0] is not runtime:
            known = _providers[id(runtime)] = (
                runtime,
                provider_for(runtime.config, runtime.settings.env),
            )
        return known[1]


@app.task(name="fleet.batch_poll", ignore_result=True)
def batch_poll() -> int:
    """Flush, poll, and send every answered trace to a worker; how many were sent.

    Its result is not stored: nobody reads it, and Celery's result write met a store away
    outside the body, a traceback (make chaos, seed 40 round 6).
    """
    try:
        return poll_and_send(get_runtime())
    except Exception as exc:
        if not is_outage(exc):
            raise
        warn_failed(log, "batch poll failed; the next poll goes on")  # one line
        return 0


def poll_and_send(runtime: Runtime) -> int:
    """`batch_poll`'s work: a store or broker away raises (the task logs it in one line)."""
    poll = poll_fleet(runtime, providers(runtime), POLLER)
    if poll is None:
        return 0
    for trace_id in poll.resume:
        trace = runtime.store.get_trace(trace_id)
        send_answered(trace, priority=tree_schedule(runtime, trace.root_trace_id).priority)
    return len(poll.resume)


def sweep_batches() -> list[str]:
    """Send this interval's poll if this worker holds the claim (the sweeper's shape: [])."""
    if claim_poll(get_runtime(), POLLER):
        batch_poll.apply_async(queue="fleet.main")
    return []
