"""Each worker's watcher of parked remote sub-agents (`fleet.remote.poll`): one thread, one loop.

Not the sweeper's thread: a remote agent that hangs costs its request's timeout, and the
sweeper (lapsed leases, the outbox, the owner check) must not wait on it. Not a pool slot
either: the child's task ended `waiting` when its message was sent. One asyncio loop on
one daemon thread follows every task this worker took at once (at most
`poll.MAX_FOLLOWED`): a stream for an agent that streams, a `GetTask` for one that does
not. Every `interval_s` it takes the due entries of the watch list (each goes to one
worker) it is not following already. A child whose remote task ended is sent to a worker
(recovered: it settles its parent when its run ends).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

from fleet.models import now_ms
from fleet.remote.poll import MAX_FOLLOWED, claim_due, follow_one
from fleet.storage import outage, outbox
from fleet.storage.outage import warn_failed, warn_of
from workers.dispatch import send_answered, tree_schedule
from workers.runtime import get_runtime

log = logging.getLogger(__name__)

SEND_RETRY_MS = 1_000
"""When a sweeper sends a child whose run the broker refused (its next sweep)."""


async def _follow_and_send(trace_id: str) -> None:
    """Follow one child's task; send the child's run once its task ended.

    The watch entry is gone by then: a send the broker refuses (a RabbitMQ restart) is
    owed to the outbox, which a sweeper sends once the broker is back (the owner check
    would only after the tree's quiet period: make chaos seed 43 round 4).
    """
    runtime = get_runtime()
    if await follow_one(runtime, trace_id):
        trace = runtime.store.get_trace(trace_id)
        try:
            send_answered(trace, priority=tree_schedule(runtime, trace.root_trace_id).priority)
        except Exception as exc:
            if not outage.is_outage(exc):
                raise
            runtime.store.outbox_put(outbox.run_entry(trace_id), now_ms() + SEND_RETRY_MS)
            warn_failed(log, "remote child %r not sent; the outbox owes its run", trace_id)


class RemotePoller:
    """A daemon thread whose event loop follows the due remote tasks until stopped."""

    def __init__(self, interval_s: float) -> None:
        """Prepare; `start` begins."""
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-remote-watch", daemon=True)
        self.following: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        """Begin watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop taking entries; the loop ends within one interval (open streams are dropped)."""
        self._stop.set()

    def _run(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._take()
            except Exception:  # Redis or broker blips must not kill the watcher
                warn_failed(log, "remote watch failed")  # an outage in one line
            await asyncio.sleep(self.interval_s)
        for task in self.following.values():
            task.cancel()

    def _take(self) -> None:
        room = MAX_FOLLOWED - len(self.following)
        if room <= 0:
            return
        for trace_id in claim_due(get_runtime(), room):
            if trace_id not in self.following:
                task = asyncio.create_task(_follow_and_send(trace_id))
                self.following[trace_id] = task
                task.add_done_callback(functools.partial(self._done, trace_id))

    def _done(self, trace_id: str, task: asyncio.Task[None]) -> None:
        self.following.pop(trace_id, None)
        if not task.cancelled() and task.exception() is not None:
            warn_of(log, task.exception(), "follow of remote child %r failed", trace_id)
