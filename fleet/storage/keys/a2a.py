"""`fleet a2a` (fleetops.a2a, fleet.storage.a2a_tasks): its Redis keys.

Importable from `fleet.storage.keys` like every other key. An A2A id (a task's, a
context's) is chosen by the client or a2a-sdk, so it is never put in a key as it is: its
SHA-256 is (any length, any character, the same key). Every key lives the fleet's
retention (`Settings.retention_s`) from its last write. One tag in the cluster layout
(`{a2a}`), so a save (the task and the recent list) is one slot.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from fleet.storage.keys.layout import LAYOUT, PREFIX

A2A_RECENT_MAX = 10_000
"""Most task ids `a2a_recent` keeps (ListTasks reads the newest of them)."""

A2AKind = Literal["task", "context"]


def _base() -> str:
    return f"{PREFIX}:{'{a2a}' if LAYOUT['cluster'] else 'a2a'}"


def _hashed(a2a_id: str) -> str:
    return hashlib.sha256(a2a_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def a2a_task(task_id: str) -> str:
    """String with the retention TTL: one A2A task as a2a-sdk keeps it (its JSON)."""
    return f"{_base()}:task:{_hashed(task_id)}"


def a2a_link(kind: A2AKind, a2a_id: str) -> str:
    """String with the retention TTL: the root trace id an A2A task or context is."""
    return f"{_base()}:{kind}-root:{_hashed(a2a_id)}"


def a2a_recent() -> str:
    """Sorted set: A2A task id -> when it was last saved (ms), with the retention TTL.

    Trimmed to the retention and to `A2A_RECENT_MAX` members by every save.
    """
    return f"{_base()}:recent"
