"""The `Board` in one process: tests and `--inline` runs without Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from fleet.memory.index import Postings, parse_posting, postings_of
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
        # The lexical index, as Redis keeps it: word -> key -> (tf, length); key -> its
        # length and words.
        self.postings: dict[str, dict[str, tuple[int, int]]] = {}
        self.indexed: dict[str, tuple[int, list[str]]] = {}
        self.length = 0

    def unindex(self, key: str) -> None:
        """Remove the key's postings."""
        length, words = self.indexed.pop(key, (0, []))
        self.length -= length
        for word in words:
            del self.postings[word][key]
            if not self.postings[word]:
                del self.postings[word]

    def index(self, key: str, value: object) -> None:
        """Replace the key's postings with those of `value`."""
        self.unindex(key)
        length, postings = postings_of(key, value)
        words = []
        for posting in postings:
            word, _, tf, _ = parse_posting(posting)
            self.postings.setdefault(word, {})[key] = (tf, length)
            words.append(word)
        self.indexed[key] = (length, words)
        self.length += length


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

    def read_many(self, namespace: str, keys: Sequence[str]) -> list[Entry]:  # noqa: D102
        with self._lock:
            space = self._live(namespace)
            return [space.history[k][0].model_copy() for k in keys if k in space.history]

    def postings(self, namespace: str, words: Sequence[str]) -> Postings:  # noqa: D102
        with self._lock:
            space = self._live(namespace)
            hits = {
                w: sorted((k, tf, n) for k, (tf, n) in space.postings.get(w, {}).items())
                for w in words
            }
            return Postings(len(space.history), space.length, hits)

    def newest(self, namespace: str, count: int) -> list[Entry]:  # noqa: D102
        with self._lock:
            latest = [kept[0] for kept in self._live(namespace).history.values()]
        latest.sort(key=lambda e: (-e.updated_at_ms, e.key))
        return [e.model_copy() for e in latest[:count]]

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
            space.index(write.key, write.value)
            ttl_s = caps.ttl_of(write.namespace)
            space.expires_at = None if ttl_s is None else self._clock() + ttl_s
            return Landed(entry.version)

    def remove(self, namespace: str, key: str) -> bool:  # noqa: D102
        with self._lock:
            space = self._live(namespace)
            space.unindex(key)
            return space.history.pop(key, None) is not None

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
