"""The roots index's memory twin (`fleet.storage.root_index`): every root in this process."""

from __future__ import annotations

import threading
from collections.abc import Sequence

Cursor = tuple[int, str]
"""(created_at_ms, trace_id): `fleet.storage.root_index.Cursor`."""


class MemoryRoots:
    """The same index in this process (an in-process fleet, tests)."""

    def __init__(self) -> None:
        """Empty."""
        self._scores: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, root_trace_id: str, created_at_ms: int) -> None:  # noqa: D102  (see `Roots`)
        with self._lock:
            self._scores[root_trace_id] = created_at_ms

    def page(self, limit: int, before: Cursor | None = None) -> list[Cursor]:  # noqa: D102  (see `Roots`)
        with self._lock:
            order = sorted(((ms, r) for r, ms in self._scores.items()), reverse=True)
        return [(ms, r) for ms, r in order if before is None or (ms, r) < before][:limit]

    def drop(self, root_ids: Sequence[str]) -> None:  # noqa: D102  (see `Roots`)
        with self._lock:
            for root in root_ids:
                self._scores.pop(root, None)
