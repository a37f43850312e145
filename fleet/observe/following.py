"""Following a tree from a client: its events as they happen, and waiting for its end.

The event stream is read through Redis outages (a restart, a Sentinel failover before the
new master is named: tried again every `OUTAGE_RETRY_S`), and a tree that needs a queue
no live worker consumes is noticed (`QueueWatch`) instead of waited on for ever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fleet.errors import ConfigError, FleetError
from fleet.models import Event, Mode, Trace
from fleet.security.numbers import client_wait_s
from fleet.storage.store import TraceStore
from fleet.storage.watchdog import QueueWatch

OUTAGE_RETRY_S = 1.0
"""How often `Fleet.events` tries again while Redis cannot be reached."""
EVENT_BLOCK_MS = 1000
"""How long one read of the event stream waits for the next event."""
CANCEL_POLL_MS = 200
"""...and with a `cancel` event, which a signal handler sets but which cannot wake a read."""


@dataclass(frozen=True)
class Follower:
    """Reads one fleet's trees as a client does (`Fleet.events`, `Fleet.wait`)."""

    store: TraceStore
    queue_of: Callable[[Mode], str | None]
    """The queue a trace of each mode runs on (the backend's routing)."""
    no_worker_timeout_s: float

    def events(
        self,
        trace_id: str,
        timeout_s: float | None = None,
        *,
        turn: int = 0,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Events of the trace's tree until it finishes.

        With `turn`, the events of that run of a continued root: earlier runs (and their
        `finish`) are skipped up to the event that started it. With `cancel`, the events
        end, without an error, within `CANCEL_POLL_MS` of it being set.

        Raises:
            TimeoutError: `timeout_s` passed first.
            NoLiveWorkers: no live worker consumed a queue the trace needs for
                `Settings.no_worker_timeout_s`; the trace is left as it is.
        """
        timeout_s = client_wait_s(timeout_s, "timeout_s", ConfigError)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        root = self._reachable(lambda: self.store.get_trace(trace_id), deadline).root_trace_id
        watch = QueueWatch(self.store, trace_id, self.queue_of, self.no_worker_timeout_s)
        cursor, skipping = "0", turn > 0
        block_ms = EVENT_BLOCK_MS if cancel is None else CANCEL_POLL_MS
        cancel = cancel or threading.Event()  # never set: follow to the end
        while not cancel.is_set():
            late = deadline is not None and time.monotonic() > deadline
            polled = self._poll(trace_id, root, cursor, watch, block_ms)
            if polled is None:  # Redis away (a restart, the network): wait for it
                if late:
                    raise TimeoutError(f"trace {trace_id!r}: Redis unreachable")
                cancel.wait(OUTAGE_RETRY_S)
                continue
            finished, batch = polled
            if not finished and late:
                raise TimeoutError(f"trace {trace_id!r} still running after {timeout_s} s")
            for entry_id, event in batch:
                cursor = entry_id
                if skipping:
                    skipping = not _starts_turn(event, trace_id, turn)
                    continue
                yield event
                if event.kind == "finish" and event.trace_id == trace_id:
                    return
            if finished and not batch:
                return  # its `finish` fell off the capped stream

    def _reachable(self, read: Callable[[], Trace], deadline: float | None) -> Trace:
        """`read()`, tried again every OUTAGE_RETRY_S while Redis is away until `deadline`.

        Away: a restart, or a Sentinel failover before the new master is named.
        """
        while True:
            try:
                return read()
            except Exception as exc:
                late = deadline is not None and time.monotonic() > deadline
                if late or not self.store.unavailable(exc):
                    raise
            time.sleep(OUTAGE_RETRY_S)

    def _poll(
        self, trace_id: str, root: str, cursor: str, watch: QueueWatch, block_ms: int
    ) -> tuple[bool, list[tuple[str, Event]]] | None:
        """Whether the trace ended, and the events after `cursor` (waiting up to `block_ms`).

        Ended already: its last events (its `finish` included) are still to be read.
        None when Redis cannot be reached.
        """
        try:
            finished = self.store.get_trace(trace_id).is_terminal
            batch = self.store.read_events(root, cursor, block_ms=block_ms)
        except Exception as exc:
            if not self.store.unavailable(exc):
                raise
            return None
        if not finished:
            watch.check()
        return finished, batch

    def wait(self, trace_id: str, timeout_s: float | None = None, *, turn: int = 0) -> Trace:
        """Block until the trace ends, reading its event stream (of run `turn`)."""
        for _ in self.events(trace_id, timeout_s, turn=turn):
            pass
        deadline = time.monotonic() + (timeout_s or self.no_worker_timeout_s)
        trace = self._reachable(lambda: self.store.get_trace(trace_id), deadline)
        if not trace.is_terminal:
            raise FleetError(f"trace {trace_id!r} ended its event stream in {trace.status!r}")
        return trace


def _starts_turn(event: Event, trace_id: str, turn: int) -> bool:
    return event.kind == "trace" and event.trace_id == trace_id and event.data.get("turn") == turn
