"""`fleet a2a`'s tasks and links in memory: the twin of the Redis keys (no expiry)."""

from __future__ import annotations

import threading

from fleet.storage.keys.a2a import A2AKind


class MemoryA2ATasks:
    """`fleet.storage.a2a_tasks.A2ATasks` in one process."""

    def __init__(self) -> None:
        """Empty."""
        self._tasks: dict[str, tuple[int, str]] = {}
        self._links: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def save(self, task_id: str, body: str, at_ms: int, ttl_s: int) -> None:
        with self._lock:
            self._tasks[task_id] = (at_ms, body)

    def get(self, task_id: str) -> str | None:
        with self._lock:
            found = self._tasks.get(task_id)
            return None if found is None else found[1]

    def delete(self, task_id: str) -> None:
        with self._lock:
            self._tasks.pop(task_id, None)

    def recent(self, limit: int) -> list[str]:
        with self._lock:
            newest = sorted(self._tasks.values(), key=lambda t: t[0], reverse=True)
            return [body for _, body in newest[:limit]]

    def link(self, kind: A2AKind, a2a_id: str, root: str, ttl_s: int) -> None:
        with self._lock:
            self._links[(kind, a2a_id)] = root

    def root_of(self, kind: A2AKind, a2a_id: str) -> str | None:
        with self._lock:
            return self._links.get((kind, a2a_id))
