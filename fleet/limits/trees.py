"""Each tree's schedule (max_concurrent, priority) and its run window.

See `fleet.limits.fanout` for what they mean; the backends keep them
(`backends.redis.trees.Trees`, `backends.memory.trees.MemoryTrees`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Priority = Literal["interactive", "batch"]


@dataclass(frozen=True)
class Schedule:
    """How a tree is run: at most `max_concurrent` children at once, at `priority`."""

    max_concurrent: int | None = None
    priority: Priority = "interactive"


DEFAULT_SCHEDULE = Schedule()
