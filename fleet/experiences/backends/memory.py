"""Experiences in this process: the twin of `fleet.experiences.backends.redis`."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

from fleet.errors import ExperienceNotFound
from fleet.experiences.model import Experience, StoredVector


class MemoryExperiences:
    """`ExperienceStore` in this process (tests, inline runs without Redis)."""

    def __init__(self) -> None:
        """Empty."""
        self._items: dict[str, Experience] = {}
        self._used: dict[str, list[str]] = {}
        self._vectors: dict[str, StoredVector] = {}
        self._lock = threading.Lock()

    def put(self, experience: Experience) -> None:  # noqa: D102 (the Protocol's)
        with self._lock:
            self._items[experience.id] = experience.model_copy()

    def get(self, experience_id: str) -> Experience:  # noqa: D102
        with self._lock:
            found = self._items.get(experience_id)
        if found is None:
            raise ExperienceNotFound(f"no experience {experience_id!r}")
        return found.model_copy()

    def all(self, scope: str | None = None) -> list[Experience]:  # noqa: D102
        with self._lock:
            items = list(self._items.values())
        return [e.model_copy() for e in items if scope is None or e.scope == scope]

    def approved(self, scopes: Sequence[str]) -> dict[str, tuple[Experience, ...]]:  # noqa: D102
        found = [e for e in self.all() if e.approved and e.scope in scopes]
        found.sort(key=lambda e: e.created_at_ms)
        return {s: tuple(e for e in found if e.scope == s) for s in scopes}

    def counted(self, experiences: Sequence[Experience]) -> list[Experience]:  # noqa: D102
        with self._lock:
            known = {e.id: self._items[e.id] for e in experiences if e.id in self._items}
        return [
            e.model_copy(update={"uses": k.uses, "successes": k.successes})
            if (k := known.get(e.id))
            else e
            for e in experiences
        ]

    def remove(self, experience_id: str) -> bool:  # noqa: D102
        with self._lock:
            self._vectors.pop(experience_id, None)
            return self._items.pop(experience_id, None) is not None

    def vectors(self, experience_ids: Sequence[str]) -> dict[str, StoredVector]:  # noqa: D102
        with self._lock:
            return {i: self._vectors[i] for i in experience_ids if i in self._vectors}

    def put_vectors(self, vectors: Mapping[str, StoredVector]) -> None:  # noqa: D102
        with self._lock:
            self._vectors.update((i, v) for i, v in vectors.items() if i in self._items)

    def note_version(self, version: tuple[str | None, int] | None) -> None:  # noqa: D102
        """Nothing: this store's experiences are in this process."""

    def held_version(self) -> str | None:  # noqa: D102
        """None: this store's experiences are in this process, never read."""
        return None

    def count_use(self, experience_ids: Iterable[str], trace_id: str) -> None:  # noqa: D102
        with self._lock:
            ids = [i for i in experience_ids if i in self._items]
            if not ids:  # none shown: nothing to remember (its end finds nothing)
                return
            for i in ids:
                self._items[i].uses += 1
            self._used[trace_id] = ids

    def count_outcome(self, trace_id: str, succeeded: bool) -> list[str]:  # noqa: D102
        with self._lock:
            ids = [i for i in self._used.pop(trace_id, []) if i in self._items]
            for i in ids if succeeded else ():
                self._items[i].successes += 1
        return ids
