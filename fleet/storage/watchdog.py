"""Notice when a trace waits on a queue that no live worker consumes, instead of hanging.

`Fleet.events`/`Fleet.wait` ask `QueueWatch.check` about once a second. The usual answer
costs one read per queue (worker heartbeats in Redis, `TraceStore.live_consumers`); only
when some queue has no live consumer does it look at which queues the trace tree still
needs (a non-terminal trace needs its own mode's queue: to run, to be recovered, or to be
resumed), and raises `NoLiveWorkers` once one of those has gone unserved for `timeout_s`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from fleet.errors import ConfigError, NoLiveWorkers
from fleet.models import Mode, WorkerPresence
from fleet.security import trust
from fleet.storage.backends.redis.connect import redact_url
from fleet.storage.store import Leases, TraceStore

CHECK_INTERVAL_S = 2.0


@dataclass
class QueueWatch:
    """Tracks how long a trace tree has needed a queue nobody consumes."""

    store: TraceStore
    trace_id: str
    queue_of: Callable[[Mode], str | None]
    """The queue a trace of this mode runs on (the backend's routing); None: no queue."""
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    _unserved_since: dict[str, float] = field(default_factory=dict)
    _next_check_s: float = 0.0

    def check(self) -> None:
        """Raise `NoLiveWorkers` if a needed queue has had no live consumer for too long."""
        now_s = self.clock()
        if now_s < self._next_check_s:
            return
        self._next_check_s = now_s + min(CHECK_INTERVAL_S, self.timeout_s / 2)
        queues = {self.queue_of(m) for m in get_args(Mode)}
        idle = {q for q in queues if q is not None and not self.store.live_consumers(q)}
        if idle:
            idle &= self._needed()
        self._unserved_since = {q: self._unserved_since.get(q, now_s) for q in idle}
        for queue, since_s in sorted(self._unserved_since.items()):
            if now_s - since_s >= self.timeout_s:
                raise NoLiveWorkers(
                    f"no live worker has consumed queue {queue!r} for {self.timeout_s:.0f} s;"
                    f" trace {self.trace_id!r} is left as it is: start a worker"
                    f" (`fleet up`, or `fleet worker -Q {queue}`), then `fleet watch"
                    f" {self.trace_id}`"
                )

    def _needed(self) -> set[str | None]:
        """The queues of the tree's non-terminal traces (the root and its descendants)."""
        needed: set[str | None] = set()
        frontier = [self.trace_id]
        while frontier:
            trace = self.store.get_trace(frontier.pop())
            if not trace.is_terminal:
                needed.add(self.queue_of(trace.mode))
                frontier += self.store.children(trace.trace_id)
        return needed


def check_served(store: Leases, queue: str | None, workspace: Path) -> None:
    """Refuse a workspace no live worker of `queue` accepts, before anything is written.

    Workers announce their workspace roots (`WorkerPresence.roots`). When none is live, or
    none announced roots, this says nothing: `QueueWatch` speaks about a missing worker.

    Raises:
        ConfigError: naming the workspace, the queue and the roots its workers accept.
    """
    if queue is None:
        return
    check_presences(store.presences(store.live_consumers(queue)), queue, workspace)


def check_presences(presences: Sequence[WorkerPresence], queue: str, workspace: Path) -> None:
    """`check_served` on the presences of `queue`'s live workers, read already."""
    announced = [p for p in presences if p.roots]
    if not announced:
        return
    for presence in announced:
        try:
            trust.check_workspace_root(workspace, tuple(Path(r) for r in presence.roots))
        except ConfigError:
            continue
        return
    roots = os.pathsep.join(sorted({r for p in announced for r in p.roots}))
    raise ConfigError(
        f"workspace {str(workspace)!r} is outside the workspace roots of every live worker on"
        f" {queue!r} ({roots}); start them with {trust.WORKSPACE_ROOTS_ENV} covering it, or"
        " use a workspace under one of those roots"
    )


def require_a_fleet(store: Leases, queues: Iterable[str | None], redis_url: str) -> None:
    """`NoLiveWorkers` unless a live worker consumes one of `queues` (reads only).

    Asked of a Redis nobody chose (the default URL) before anything is written there.
    """
    if any(store.live_consumers(queue) for queue in queues if queue):
        return
    raise NoLiveWorkers(
        f"no fleet runs at {redact_url(redis_url)} (the default Redis: FLEET_REDIS_URL is"
        " unset and no `fleet up` runs for this directory or above it); nothing was"
        " written there: run this below the directory of a `fleet up`, or set"
        " FLEET_REDIS_URL (`fleet env` prints the exports)"
    )
