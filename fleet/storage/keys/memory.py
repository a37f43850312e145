"""Long-term memory (`fleet.memory`): its Redis keys, one set per namespace.

Part of `fleet.storage.keys` (import them from there). A namespace's keys share the hash
tag `{memory:NS}` in the cluster layout, so its write script runs on one node. Names are
checked (`fleet.memory.names`) before they reach a key.
"""

from __future__ import annotations

from fleet.ids import check_memory_key as check_key
from fleet.ids import check_memory_namespace as check_namespace
from fleet.storage.keys.layout import LAYOUT, PREFIX

MEMORY_NAMESPACES = f"{PREFIX}:memory-namespaces"
"""Set, no TTL: every namespace written to (`fleet memory list`); one whose keys expired
is dropped from it when it is next listed."""


def _space(namespace: str) -> str:
    check_namespace(namespace)
    return f"{{memory:{namespace}}}" if LAYOUT["cluster"] else f"memory:{namespace}"


def memory_entries(namespace: str) -> str:
    """Hash: key -> current Entry JSON (with its `version`).

    TTL: the namespace's, if any (`MemoryCaps.ttl_of`), renewed by each write; else none.
    """
    return f"{PREFIX}:{_space(namespace)}:entries"


def memory_history(namespace: str, key: str) -> str:
    """List: the key's Entry JSONs, newest first, cut to `history_depth`; TTL as entries."""
    return f"{PREFIX}:{_space(namespace)}:history:{check_key(key)}"


def memory_proposals(namespace: str) -> str:
    """Hash: proposal id -> Proposal JSON: recorder writes waiting for approval.

    `fleet memory approve` lands one; TTL as entries.
    """
    return f"{PREFIX}:{_space(namespace)}:proposals"
