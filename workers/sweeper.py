"""Each worker's sweeper: re-enqueues runs whose runner died, dispatches what the outbox owes.

Every `Settings.sweep_interval_s` (1 s) it makes two reads — the running traces whose lease
deadline passed, the outbox entries that are due — and acts only on what they return, so an
idle fleet of W workers costs Redis 2·W cheap commands per second. Every
`Settings.owner_check_interval_s` (5 s) it also asks for the fleet's owner check
(`workers.owner_check`), which one worker runs, and every `Settings.batch_poll_s` for the
provider-batch poll (`workers.batch_poll`), which one worker sends.
"""

from __future__ import annotations

import logging
import threading
import time

from fleet.children import after
from fleet.control import claim_dead_runs
from fleet.conversation.human import time_out_waits
from fleet.models import now_ms
from fleet.storage import outbox
from fleet.storage.outage import warn_failed
from workers import settle
from workers.batch_poll import sweep_batches
from workers.dispatch import send, send_answered
from workers.owner_check import check_owners
from workers.runtime import get_runtime

log = logging.getLogger(__name__)

NOT_RIPE_RETRY_MS = 1_000
"""A spawn whose spawner still holds its lease is looked at again this much later."""
STRANDED_AFTER_LEASES = 2
"""A child still `queued` this many lease TTLs after its last change, while a recovered
sibling waits on it, is presumed stranded in a lost worker's prefetch."""
OUTBOX_RETRY_MS = 10_000
"""An entry a sweeper claimed but could not finish (broker away, sweeper died) comes back
this much later."""


def sweep_once() -> list[str]:
    """Re-enqueue every trace whose lease expired; returns the ids this call claimed."""
    runtime = get_runtime()
    claimed = claim_dead_runs(runtime.store)
    for trace_id in claimed:
        try:
            send(runtime.store.get_trace(trace_id), recovered=True)
        except Exception:  # the broker is away: the outbox keeps it for a later sweep
            warn_failed(log, "re-enqueue of %s failed; kept in the outbox", trace_id)
            runtime.store.outbox_put(outbox.run_entry(trace_id), now_ms() + OUTBOX_RETRY_MS)
            continue
        log.warning("re-enqueued %s: its runner's lease expired", trace_id)
    if claimed:
        runtime.store.count("lease_expiries", len(claimed))
    for trace_id in time_out_waits(runtime):  # answered and queued: it must be sent
        try:
            send_answered(runtime.store.get_trace(trace_id))
        except Exception:  # the broker is away: the outbox keeps it for a later sweep
            runtime.store.outbox_put(outbox.run_entry(trace_id), now_ms() + OUTBOX_RETRY_MS)
            continue
        log.warning("%s: no reply from a person in time; resumed without one", trace_id)
    return claimed


def sweep_outbox() -> list[str]:
    """Send a recovered run for what each due outbox entry still owes; the ids sent."""
    store = get_runtime().store
    sent: list[str] = []
    for entry in store.outbox_claim(now_ms(), OUTBOX_RETRY_MS):
        if entry.startswith(outbox.SETTLE + " "):
            settle_due(entry)
            continue
        runs = outbox.runs_for(store, entry)
        if runs is None:  # its spawner still holds the lease: look again soon
            store.outbox_put(entry, now_ms() + NOT_RIPE_RETRY_MS)
            continue
        for trace_id in runs:
            send(store.get_trace(trace_id), recovered=True)
            log.warning("dispatched %s for outbox entry %r", trace_id, entry)
        sent += runs
        store.outbox_done(entry)
    return sent


def settle_due(entry: str) -> None:
    """Settle a recovered child's tool call once every child ended; else look again later."""
    runtime = get_runtime()
    _, parent_id, call_id = outbox.parse(entry)
    action = after.settle_from_store(runtime, after.Call(parent_id, call_id), "sweep")
    if isinstance(action, after.Defer):  # children still run: this entry comes due later
        resend_stranded(action.pending)
        settle.apply(action)
        return
    settle.apply(action)
    runtime.store.outbox_done(entry)


def resend_stranded(pending: tuple[str, ...]) -> None:
    """Send again the siblings of a recovered branch that stayed `queued`, unleased.

    A worker that died had received them (prefetch) but not started them: their messages
    come back only after the visibility timeout. A copy that arrives late finds the trace
    running or ended and returns. Each is sent at most once per STRANDED_AFTER_LEASES TTLs.
    """
    store = get_runtime().store
    stale_ms = now_ms() - STRANDED_AFTER_LEASES * get_runtime().settings.lease_ttl_ms
    for child in store.get_traces(list(pending)):
        if child.status != "queued" or child.updated_at_ms > stale_ms:
            continue
        if store.lease_holder(child.trace_id) is None:
            store.update_trace(child.trace_id, updated_at_ms=now_ms())
            send(child, recovered=True)
            log.warning(
                "re-sent %s: queued, unleased, its sibling's worker was lost", child.trace_id
            )


def sweep_owners() -> list[str]:
    """The fleet's owner check, if this worker holds its claim; the trace ids remedied."""
    return [r.trace.trace_id for r in check_owners(get_runtime())]


class Sweeper:
    """A daemon thread sweeping every `interval_s`."""

    def __init__(
        self, interval_s: float, owner_check_interval_s: float = 5.0, batch_poll_s: float = 30.0
    ) -> None:
        """Sweep every `interval_s`; ask for the owner check and the batch poll on their own."""
        self.interval_s = interval_s
        self.owner_check_interval_s = owner_check_interval_s
        self.batch_poll_s = batch_poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-sweeper", daemon=True)

    def start(self) -> None:
        """Begin sweeping."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current sweep."""
        self._stop.set()

    def _loop(self) -> None:
        next_owner_check_s = next_batch_poll_s = 0.0
        while not self._stop.wait(self.interval_s):
            sweeps = [sweep_once, sweep_outbox]
            if time.monotonic() >= next_owner_check_s:
                sweeps.append(sweep_owners)
                next_owner_check_s = time.monotonic() + self.owner_check_interval_s
            if time.monotonic() >= next_batch_poll_s:
                sweeps.append(sweep_batches)
                next_batch_poll_s = time.monotonic() + self.batch_poll_s
            for sweep in sweeps:
                try:
                    sweep()
                except Exception:  # Redis or broker blips must not kill the sweeper
                    warn_failed(log, "%s failed", sweep.__name__)
