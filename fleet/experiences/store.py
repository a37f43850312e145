"""Where experiences live: the Protocol, and its in-memory twin."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import redis

from fleet.errors import ExperienceNotFound
from fleet.experiences.model import Experience, StoredVector
from fleet.storage.capability import Capability


class ExperienceStore(Protocol):
    """Experiences with their counts; `fleet.experiences.backends.redis` is the fleet's own."""

    def put(self, experience: Experience) -> None:
        """Store (or replace) one experience."""
        ...

    def get(self, experience_id: str) -> Experience:
        """The experience, or `ExperienceNotFound`."""
        ...

    def all(self, scope: str | None = None) -> list[Experience]:
        """Every experience (of one scope), oldest first."""
        ...

    def remove(self, experience_id: str) -> bool:
        """Forget one (and its vector); False if there was none."""
        ...

    def vectors(self, experience_ids: Sequence[str]) -> dict[str, StoredVector]:
        """The stored embeddings of these experiences (those that have one)."""
        ...

    def put_vectors(self, vectors: Mapping[str, StoredVector]) -> None:
        """Store (or replace) embeddings by experience id."""
        ...

    def count_use(self, experience_ids: Iterable[str], trace_id: str) -> None:
        """These were injected into `trace_id`: one more use each, remembered for its end."""
        ...

    def count_outcome(self, trace_id: str, succeeded: bool) -> list[str]:
        """The trace ended: a success for each experience it used (once); their ids."""
        ...


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

    def count_use(self, experience_ids: Iterable[str], trace_id: str) -> None:  # noqa: D102
        with self._lock:
            ids = [i for i in experience_ids if i in self._items]
            for i in ids:
                self._items[i].uses += 1
            self._used[trace_id] = ids

    def count_outcome(self, trace_id: str, succeeded: bool) -> list[str]:  # noqa: D102
        with self._lock:
            ids = [i for i in self._used.pop(trace_id, []) if i in self._items]
            for i in ids if succeeded else ():
                self._items[i].successes += 1
        return ids


def _on_redis(client: redis.Redis) -> ExperienceStore:
    from fleet.experiences.backends.redis import RedisExperiences

    return RedisExperiences(client)


EXPERIENCES: Capability[ExperienceStore] = Capability("experiences", _on_redis, MemoryExperiences)
"""The experiences a store keeps beside it: `store.capability(EXPERIENCES)`."""
