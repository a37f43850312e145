"""Finds traces whose runner died (lease expired) and re-enqueues them: one per worker."""

from __future__ import annotations

import logging
import os
import threading

from fleet.control import claim_dead_runs
from workers.dispatch import send
from workers.runtime import get_runtime

log = logging.getLogger(__name__)

DEFAULT_SWEEP_INTERVAL_S = 10.0


def sweep_once() -> list[str]:
    """Re-enqueue every trace whose lease expired; returns the ids this call claimed."""
    runtime = get_runtime()
    claimed = claim_dead_runs(runtime.store)
    for trace_id in claimed:
        send(runtime.store.get_trace(trace_id), recovered=True)
        log.warning("re-enqueued %s: its runner's lease expired", trace_id)
    if claimed:
        runtime.store.count("lease_expiries", len(claimed))
    return claimed


class Sweeper:
    """A daemon thread calling `sweep_once` every `interval_s`."""

    def __init__(self, interval_s: float | None = None) -> None:
        """Interval from FLEET_SWEEP_INTERVAL_S unless given."""
        env = os.environ.get("FLEET_SWEEP_INTERVAL_S")
        self.interval_s = interval_s or float(env or DEFAULT_SWEEP_INTERVAL_S)
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
