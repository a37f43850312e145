"""Services kept beside the trace store, built by the store that fits them.

A package above storage (limits, experiences) names a `Capability`: how to build its
service on the fleet's Redis and how to build its in-memory twin. The store builds the
one that fits it (`TraceStore.capability`), so no caller asks which store it has or
reaches for a Redis client. Each store keeps what it built, so every runtime on one
`MemoryStore` shares the same budgets and limits, as every process shares Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis

T = TypeVar("T")


@dataclass(frozen=True)
class Capability(Generic[T]):
    """A service beside the store: its Redis implementation and its memory twin."""

    name: str
    """Unique per service: a store keeps one of each name."""
    on_redis: Callable[[redis.Redis], T]
    """Build it on the store's client (decoded responses)."""
    in_memory: Callable[[], T]
    """Build the twin kept by a `MemoryStore`, shared by every runtime on that store."""


class Kept:
    """What one store built, by capability name (shared by its fenced views)."""

    def __init__(self) -> None:
        """Nothing built yet."""
        self._built: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, kind: Capability[T], build: Callable[[], T]) -> T:
        """The service of `kind`, built on first use."""
        with self._lock:
            if kind.name not in self._built:
                self._built[kind.name] = build()
            found: T = self._built[kind.name]
            return found
