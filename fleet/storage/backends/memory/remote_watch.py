"""The remote children's watch list in memory: the twin of the Redis sorted set."""

from __future__ import annotations

import threading


class MemoryRemoteWatch:
    """`fleet.storage.remote_watch.RemoteWatch` in one process."""

    def __init__(self) -> None:
        """Empty."""
        self._due: dict[str, int] = {}
        self._lock = threading.Lock()

    def watch(self, trace_id: str, due_ms: int) -> None:
        with self._lock:
            self._due[trace_id] = due_ms

    def due(self, at_ms: int, limit: int, lease_ms: int) -> list[str]:
        with self._lock:
            ready = sorted((at, tid) for tid, at in self._due.items() if at <= at_ms)[:limit]
            for _, tid in ready:
                self._due[tid] = at_ms + lease_ms
            return [tid for _, tid in ready]

    def forget(self, trace_id: str) -> None:
        with self._lock:
            self._due.pop(trace_id, None)

    def watched(self, trace_id: str) -> bool:
        with self._lock:
            return trace_id in self._due
