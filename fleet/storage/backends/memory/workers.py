"""The memory store's worker tables: presence, the outbox and the open-trees index.

`MemoryStore` takes these from here (a mixin on its tables and lock), so the store's
module keeps the traces.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from fleet.models import WorkerPresence, now_ms


class MemoryWorkerTables:
    """Who consumes which queue, work due to the queue, the trees the owner check walks."""

    _lock: threading.Condition
    _presence: dict[str, tuple[WorkerPresence, int]]
    _outbox: dict[str, int]
    _open_trees: dict[str, int]

    def tracked_trees(self) -> list[str]:
        """The open-trees index, oldest first (`owner_index.MemoryOwnerIndex`)."""
        with self._lock:
            return sorted(self._open_trees, key=self._open_trees.__getitem__)

    def untrack_tree(self, root_trace_id: str) -> None:
        """Drop a tree from the open-trees index."""
        with self._lock:
            self._open_trees.pop(root_trace_id, None)

    def outbox_pending(self, entries: Sequence[str]) -> list[bool]:
        """Whether each outbox entry is pending."""
        with self._lock:
            return [e in self._outbox for e in entries]

    def drop_presence(self, presence: WorkerPresence) -> None:
        with self._lock:
            self._presence.pop(presence.node, None)

    def presences(self, nodes: Sequence[str]) -> list[WorkerPresence]:
        with self._lock:
            now = now_ms()
            found = [self._presence.get(n) for n in nodes]
            return [p for p, deadline in (f for f in found if f) if deadline > now]

    def live_consumers(self, queue: str) -> list[str]:
        with self._lock:
            now = now_ms()
            return sorted(
                node
                for node, (presence, deadline) in self._presence.items()
                if deadline > now and queue in presence.queues
            )

    def outbox_put(self, entry: str, due_ms: int) -> None:
        with self._lock:
            self._outbox[entry] = due_ms

    def outbox_done(self, entry: str) -> None:
        with self._lock:
            self._outbox.pop(entry, None)

    def outbox_claim(self, at_ms: int, retry_ms: int, limit: int = 100) -> list[str]:
        with self._lock:
            due = sorted((d, entry) for entry, d in self._outbox.items() if d <= at_ms)[:limit]
            for _, entry in due:
                self._outbox[entry] = at_ms + retry_ms
            return [entry for _, entry in due]
