"""Namespace and key names, and the caps every backend holds a write to.

A name reaches Redis key names and prompts, so it is a short run of plain characters:
`KIND:NAME` (`user:alice`, `project:acme`) or the shared `fleet`; a key is a word like
`profile` or `agent_errors`. Anything else is refused with one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.ids import check_memory_key as check_key
from fleet.ids import check_memory_namespace as check_namespace

__all__ = ["AGENT_ERRORS", "DEFAULT_CAPS", "SHARED", "MemoryCaps", "check_key", "check_namespace"]

SHARED = "fleet"
"""The namespace every tree may be bound to for what the whole fleet shares."""
AGENT_ERRORS = "agent_errors"
"""The key sub-agents' failures are recorded under, in each bound namespace."""


@dataclass(frozen=True)
class MemoryCaps:
    """What one namespace may hold (fleet.yaml's `memory:`); every backend checks these."""

    max_value_bytes: int = 16_000
    """A value's JSON, in UTF-8 bytes."""
    max_keys: int = 1_000
    """Keys per namespace: a write of a new key into a full namespace is refused."""
    history_depth: int = 20
    """Versions kept per key, newest first (the current one included)."""
    ttl_s: dict[str, int] = field(default_factory=dict, hash=False)
    """Seconds a namespace lives after its last write, by namespace or by kind (`user`);
    absent: kept until removed."""

    def ttl_of(self, namespace: str) -> int | None:
        """The namespace's own TTL, else its kind's, else None."""
        found = self.ttl_s.get(namespace, self.ttl_s.get(namespace.split(":", 1)[0]))
        return found if found and found > 0 else None


DEFAULT_CAPS = MemoryCaps()
