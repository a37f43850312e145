"""Each worker's poller of parked remote sub-agents (`fleet.remote.poll`), on its own thread.

Not the sweeper's thread: a remote agent that hangs costs its poll `wire.CALL_TIMEOUT_S`,
and the sweeper (lapsed leases, the outbox, the owner check) must not wait on it. Not a
pool slot either: the child's task ended `waiting` when its message was sent. Every worker
polls; the watch list gives each due entry to one of them. A child whose remote task
ended is sent to a worker (recovered: it settles its parent when its run ends).
"""

from __future__ import annotations

import logging
import threading

from fleet.remote.poll import poll_due
from fleet.storage.outage import warn_failed
from workers.dispatch import send_answered, tree_schedule
from workers.runtime import get_runtime

log = logging.getLogger(__name__)


def poll_remote() -> int:
    """Poll the due remote tasks once; how many children were sent to run on."""
    runtime = get_runtime()
    ended = poll_due(runtime)
    for trace_id in ended:
        trace = runtime.store.get_trace(trace_id)
        send_answered(trace, priority=tree_schedule(runtime, trace.root_trace_id).priority)
    return len(ended)


class RemotePoller:
    """A daemon thread running `poll_remote` every `interval_s` until stopped."""

    def __init__(self, interval_s: float) -> None:
        """Prepare; `start` begins."""
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-remote-poll", daemon=True)

    def start(self) -> None:
        """Begin polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current poll."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                poll_remote()
            except Exception:  # Redis or broker blips must not kill the poller
                warn_failed(log, "remote poll failed")  # an outage in one line
