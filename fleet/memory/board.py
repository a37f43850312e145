"""Where memory lives: the `Board` Protocol and the capability (backends/: Redis, memory).

Every backend holds a write to the same rules, written once here in Python (the Redis
script mirrors them, and `tests/test_memory_board.py` runs both against each other):

1. a write whose `write_id` is in the key's history landed already: nothing changes;
2. a write whose `expected_version` is not the key's version is `Lost`;
3. a new key in a namespace holding `max_keys` keys is refused;
4. else the key moves to version + 1, the entry goes on top of its history (cut to
   `history_depth`), its postings in the lexical index (`fleet.memory.index`) are replaced
   in the same step, and the namespace lives `ttl_of(namespace)` more seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import redis

from fleet.memory.index import Postings
from fleet.memory.model import (
    Entry,
    Proposal,
    Write,
    WriteOutcome,
)
from fleet.memory.names import DEFAULT_CAPS, MemoryCaps
from fleet.storage.capability import Capability


class Board(Protocol):
    """The fleet's long-term memory; `fleet.memory.backends.redis` is the shared one."""

    def read(self, namespace: str, key: str) -> Entry | None:
        """The key's current entry, or None."""
        ...

    def entries(self, namespace: str) -> list[Entry]:
        """Every current entry of the namespace, by key."""
        ...

    def read_many(self, namespace: str, keys: Sequence[str]) -> list[Entry]:
        """The current entries of these keys, in their order (a missing key left out)."""
        ...

    def postings(self, namespace: str, words: Sequence[str]) -> Postings:
        """The namespace's size and the postings of these words (`fleet.memory.index`)."""
        ...

    def newest(self, namespace: str, count: int) -> list[Entry]:
        """The `count` entries written last, newest first."""
        ...

    def write(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> WriteOutcome:
        """Compare-and-set (rules in this module's docstring); `MemoryRefused` over a cap."""
        ...

    def remove(self, namespace: str, key: str) -> bool:
        """Forget the key and its history; False if there was none."""
        ...

    def history(self, namespace: str, key: str) -> list[Entry]:
        """The key's kept versions, newest first."""
        ...

    def namespaces(self) -> list[str]:
        """Every namespace written to (and not expired), sorted."""
        ...

    def propose(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> Proposal:
        """Hold a write for a person's approval (once per `write_id`); caps as `write`."""
        ...

    def proposals(self, namespace: str) -> list[Proposal]:
        """The writes waiting for approval, oldest first."""
        ...

    def take_proposal(self, namespace: str, proposal_id: str) -> Proposal | None:
        """Remove and return a waiting write (to apply or to drop); None if there is none."""
        ...


def _on_redis(client: redis.Redis) -> Board:
    from fleet.memory.backends.redis import RedisBoard

    return RedisBoard(client)


def _in_memory() -> Board:
    from fleet.memory.backends.memory import MemoryBoard

    return MemoryBoard()


MEMORY: Capability[Board] = Capability("memory", _on_redis, _in_memory)
"""The long-term memory a store keeps beside it: `store.capability(MEMORY)`."""
