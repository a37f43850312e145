"""Where memory lives: the `Board` Protocol, its memory twin and the capability.

Every backend holds a write to the same rules, written once here in Python (the Redis
script mirrors them, and `tests/test_memory_board.py` runs both against each other):

1. a write whose `write_id` is in the key's history landed already: nothing changes;
2. a write whose `expected_version` is not the key's version is `Lost`;
3. a new key in a namespace holding `max_keys` keys is refused;
4. else the key moves to version + 1, the entry goes on top of its history (cut to
   `history_depth`), and the namespace lives `ttl_of(namespace)` more seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import redis

from fleet.memory.model import (
    Entry,
    Landed,
    Lost,
    Proposal,
    Write,
    WriteOutcome,
    full_error,
    proposal_of,
)
from fleet.memory.names import DEFAULT_CAPS, MemoryCaps
from fleet.models import now_ms
from fleet.storage.capability import Capability


class Board(Protocol):
    """The fleet's long-term memory; `fleet.memory.redis_board` is the shared one."""

    def read(self, namespace: str, key: str) -> Entry | None:
        """The key's current entry, or None."""
        ...

    def entries(self, namespace: str) -> list[Entry]:
        """Every current entry of the namespace, by key."""
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


class _Namespace:
    def __init__(self) -> None:
        self.history: dict[str, list[Entry]] = {}
        self.proposals: dict[str, Proposal] = {}
        self.expires_at: float | None = None


class MemoryBoard:
    """`Board` in this process (tests, `--inline` runs without Redis)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Empty; `clock` decides when a namespace with a TTL expires."""
        self._spaces: dict[str, _Namespace] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def read(self, namespace: str, key: str) -> Entry | None:  # noqa: D102 (the Protocol's)
        with self._lock:
            found = self._live(namespace).history.get(key)
            return found[0].model_copy() if found else None

    def entries(self, namespace: str) -> list[Entry]:  # noqa: D102
        with self._lock:
            space = self._live(namespace)
            return [space.history[k][0].model_copy() for k in sorted(space.history)]

    def write(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> WriteOutcome:  # noqa: D102
        write.checked(caps)
        with self._lock:
            space = self._spaces.setdefault(write.namespace, self._live(write.namespace))
            kept = space.history.get(write.key, [])
            done = [e for e in kept if write.write_id and e.write_id == write.write_id]
            if done:
                return Landed(done[0].version, duplicate=True)
            current = kept[0].version if kept else 0
            if write.expected_version is not None and write.expected_version != current:
                return Lost(current)
            if not kept and len(space.history) >= caps.max_keys:
                raise full_error(write.namespace, caps)
            entry = write.entry(current + 1, now_ms())
            space.history[write.key] = [entry, *kept][: caps.history_depth]
            ttl_s = caps.ttl_of(write.namespace)
            space.expires_at = None if ttl_s is None else self._clock() + ttl_s
            return Landed(entry.version)

    def remove(self, namespace: str, key: str) -> bool:  # noqa: D102
        with self._lock:
            return self._live(namespace).history.pop(key, None) is not None

    def history(self, namespace: str, key: str) -> list[Entry]:  # noqa: D102
        with self._lock:
            return [e.model_copy() for e in self._live(namespace).history.get(key, [])]

    def namespaces(self) -> list[str]:  # noqa: D102
        with self._lock:
            return sorted(n for n in list(self._spaces) if self._live(n).history)

    def propose(self, write: Write, caps: MemoryCaps = DEFAULT_CAPS) -> Proposal:  # noqa: D102
        write.checked(caps)
        proposal = proposal_of(write)
        with self._lock:
            space = self._spaces.setdefault(write.namespace, self._live(write.namespace))
            return space.proposals.setdefault(proposal.id, proposal).model_copy()

    def proposals(self, namespace: str) -> list[Proposal]:  # noqa: D102
        with self._lock:
            found = list(self._live(namespace).proposals.values())
        return sorted(found, key=lambda p: p.proposed_at_ms)

    def take_proposal(self, namespace: str, proposal_id: str) -> Proposal | None:  # noqa: D102
        with self._lock:
            return self._live(namespace).proposals.pop(proposal_id, None)

    def _live(self, namespace: str) -> _Namespace:
        """The namespace (empty once its TTL passed); the lock is held."""
        space = self._spaces.get(namespace)
        if space is None or (space.expires_at is not None and self._clock() >= space.expires_at):
            self._spaces.pop(namespace, None)
            return _Namespace()
        return space


def _on_redis(client: redis.Redis) -> Board:
    from fleet.memory.redis_board import RedisBoard

    return RedisBoard(client)


MEMORY: Capability[Board] = Capability("memory", _on_redis, MemoryBoard)
"""The long-term memory a store keeps beside it: `store.capability(MEMORY)`."""
