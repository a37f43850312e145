"""The fleet's provider-batch poller on the workers (`fleet.batchapi.poller`).

Every `FLEET_BATCH_POLL_S` each worker's sweeper asks for the fleet-wide claim; the one that
gets it sends `fleet.batch_poll`, which any worker runs (a second poll while one runs
returns at once). The task resumes each trace whose call was answered on any worker.

Each worker also runs a `BatchWaker`: a daemon thread blocked on the stop's wake
(`BatchCalls.woken`); the one worker a stop wakes cancels at the provider every batch whose
calls were all stopped (`cancel_stopped`), within a round trip of the stop rather than at
the next poll. The provider keys live here, not with `fleet stop`.
"""

from __future__ import annotations

import logging
import socket
import threading

from fleet.batchapi.poller import cancel_stopped, claim_poll, poll_fleet
from fleet.batchapi.providers import ProviderFactory, provider_for
from fleet.runtime import Runtime
from fleet.storage.batch_calls import batch_calls
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


WAKE_WAIT_S = 5.0
"""How long one wait for a stop's wake blocks (a wake ends it at once): an idle worker
asks Redis once per this, and a stopped waker ends within it."""


class BatchWaker:
    """A daemon thread: a stop's wake cancels its provider batches at once (module doc)."""

    def __init__(self, wait_s: float = WAKE_WAIT_S) -> None:
        """Prepare; `start` begins."""
        self.wait_s = wait_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-batch-wake", daemon=True)

    def start(self) -> None:
        """Begin waiting for wakes."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current wait."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                runtime = get_runtime()
                if batch_calls(runtime.store).woken(self.wait_s):
                    cancel_stopped(runtime, providers(runtime))
            except Exception:  # Redis away: wait, then listen again (the poll is the backstop)
                warn_failed(log, "batch wake failed")
                self._stop.wait(self.wait_s)
