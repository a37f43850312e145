"""One heartbeat per process: renews every runner lease it holds, and the worker's presence.

A thread per runner used to renew its own lease: a worker with 100 branches ran 100 threads
and made 100 round trips per beat. `LeaseKeeper` renews all of them, and announces the
worker (`fleet:worker:{node}`, `fleet:consumers:{queue}`) so clients learn that a queue has a
live consumer from Redis instead of a Celery broadcast, in one round trip per beat.

    keeper = LeaseKeeper(store, ttl_ms=5_000)
    with keeper.hold(trace_id, owner) as lease:  # started on first use
        ...
        if lease.lost.is_set(): ...               # renewal found the lease taken over
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fleet.models import WorkerPresence
from fleet.storage.outage import warn_failed
from fleet.storage.store import TraceStore

log = logging.getLogger(__name__)

BEATS_PER_TTL = 5
"""Renewals per lease TTL: a lease survives four missed beats (a Redis blip, a busy GIL)."""


@dataclass
class HeldLease:
    """A lease a runner holds while the keeper renews it."""

    trace_id: str
    owner: str
    lost: threading.Event = field(default_factory=threading.Event)
    """Set when a renewal found the lease no longer ours; the runner then writes nothing."""
    released: bool = False
    """The runner gave the lease up (in its last write): a renewal that fails is no loss."""


class LeaseKeeper:
    """A daemon thread renewing every held lease and the presence, every TTL / 5.

    The thread ends when it has nothing left to renew and starts again with the next
    `hold`, so an idle runtime (a client, a test) keeps no thread.
    """

    def __init__(
        self, store: TraceStore, ttl_ms: int, presence: WorkerPresence | None = None
    ) -> None:
        """Nothing runs until `start` or the first `hold`."""
        self.store = store
        self.ttl_ms = ttl_ms
        self.interval_s = ttl_ms / 1000 / BEATS_PER_TTL
        self._presence = presence
        self._held: dict[tuple[str, str], HeldLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def announce(self, presence: WorkerPresence) -> None:
        """Announce this worker from now on (and at once), then keep beating."""
        with self._lock:
            self._presence = presence
        self.beat()
        self.start()

    def start(self) -> None:
        """Start the thread (once)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="fleet-leases", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop beating; the worker's presence is withdrawn at once."""
        self._stop.set()
        self.withdraw()

    def withdraw(self) -> None:
        """Stop announcing the worker (it is shutting down); leases are still renewed."""
        with self._lock:
            presence, self._presence = self._presence, None
        if presence is not None:
            try:
                self.store.drop_presence(presence)
            except Exception:  # going away anyway: the presence lapses with its TTL
                warn_failed(log, "could not withdraw the presence of %s", presence.node)

    @contextmanager
    def hold(self, trace_id: str, owner: str) -> Iterator[HeldLease]:
        """Keep a just-acquired lease renewed until the block ends."""
        lease = HeldLease(trace_id, owner)
        with self._lock:
            self._held[(trace_id, owner)] = lease
        self.start()
        try:
            yield lease
        finally:
            with self._lock:
                self._held.pop((trace_id, owner), None)

    def beat(self) -> None:
        """One renewal of every held lease plus the presence, in one round trip."""
        with self._lock:
            held = list(self._held.values())
            presence = self._presence
        if not held and presence is None:
            return
        renewed = self.store.beat([(h.trace_id, h.owner) for h in held], self.ttl_ms, presence)
        with self._lock:  # a run that ended meanwhile released its lease: nothing was lost
            lost = [
                h
                for h, ours in zip(held, renewed, strict=True)
                if not ours and not h.released and self._holds(h)
            ]
        for lease in lost:
            log.warning("lease of %s lost: another runner may own it now", lease.trace_id)
            lease.lost.set()

    def _holds(self, lease: HeldLease) -> bool:
        return self._held.get((lease.trace_id, lease.owner)) is lease

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                if not self._held and self._presence is None:
                    self._thread = None  # idle: the next `hold` starts a new thread
                    return
            try:
                self.beat()
            except Exception:  # a Redis blip must not kill the heartbeat; the next beat retries
                warn_failed(log, "heartbeat failed")
