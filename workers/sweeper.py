"""Finds traces whose runner died (lease expired) and re-enqueues them: one per worker."""

from __future__ import annotations

import logging
import threading

from fleet.control import claim_dead_runs
from fleet.human import time_out_waits
from workers.dispatch import send
from workers.runtime import get_runtime

log = logging.getLogger(__name__)


def sweep_once() -> list[str]:
    """Re-enqueue every trace whose lease expired; returns the ids this call claimed."""
    runtime = get_runtime()
    claimed = claim_dead_runs(runtime.store)
    for trace_id in claimed:
        send(runtime.store.get_trace(trace_id), recovered=True)
        log.warning("re-enqueued %s: its runner's lease expired", trace_id)
    if claimed:
        runtime.store.count("lease_expiries", len(claimed))
    for trace_id in time_out_waits(runtime):
        send(runtime.store.get_trace(trace_id))
        log.warning("%s: no reply from a person in time; resumed without one", trace_id)
    return claimed


class Sweeper:
    """A daemon thread calling `sweep_once` every `interval_s`."""

    def __init__(self, interval_s: float) -> None:
        """Sweep every `interval_s` (`Settings.sweep_interval_s`)."""
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-sweeper", daemon=True)

    def start(self) -> None:
        """Begin sweeping."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current sweep."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                sweep_once()
            except Exception:  # Redis or broker blips must not kill the sweeper
                log.warning("sweep failed", exc_info=True)
