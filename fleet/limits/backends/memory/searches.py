"""Each tree's search count in one process (`fleet.limits.searches`)."""

from __future__ import annotations

import threading


class MemorySearchCounter:
    """The counter of one process (the in-memory store's twin)."""

    def __init__(self) -> None:
        """Start with no tree counted."""
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, root_trace_id: str, limit: int) -> int | None:
        """See `SearchCounter.take`."""
        with self._lock:
            used = self._used.get(root_trace_id, 0)
            if used >= limit:
                return None
            self._used[root_trace_id] = used + 1
            return used + 1
