"""The `Board` in one process: tests and `--inline` runs without Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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
