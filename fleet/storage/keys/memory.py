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


def memory_index(namespace: str) -> str:
    """Sorted set, every score 0: the lexical index's postings, `WORD KEY TF LENGTH`.

    See `fleet.memory.index`; read a word at a time by ZRANGEBYLEX. TTL as entries.
    """
    return f"{PREFIX}:{_space(namespace)}:index"


def memory_terms(namespace: str) -> str:
    """Hash: key -> its length, then its postings, one a line: what its next write removes.

    `#length` -> the sum of the lengths (no key starts with `#`). TTL as entries.
    """
    return f"{PREFIX}:{_space(namespace)}:terms"


def memory_recent(namespace: str) -> str:
    """Sorted set: key -> when it was last written (ms): a search's newest entries to embed.

    TTL as entries.
    """
    return f"{PREFIX}:{_space(namespace)}:recent"
