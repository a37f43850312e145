"""Where experiences live: the Protocol, and its in-memory twin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import redis

from fleet.experiences.backends.memory import MemoryExperiences
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

    def approved(self, scopes: Sequence[str]) -> dict[str, tuple[Experience, ...]]:
        """The approved experiences of these scopes, oldest first, their counts not read.

        What a run's start ranks (`fleet.experiences.retrieval`): the Redis store keeps
        them parsed in the process while no experience was put or removed since, and
        returns the same tuple for a scope until then.
        """
        ...

    def counted(self, experiences: Sequence[Experience]) -> list[Experience]:
        """These experiences with their uses and successes as stored now."""
        ...

    def note_version(self, version: tuple[str | None, int] | None) -> None:
        """The version counter and count as this thread's run just read them (`begin_run`).

        The thread's next `approved` uses them instead of reading them again; None forgets
        a note (the run read nothing).
        """
        ...

    def held_version(self) -> str | None:
        """The version counter the process holds the approved experiences at.

        "" when held with no counter (no experience was ever put), None when none are held.
        `begin_run` reads their count again only when the stored counter differs.
        """
        ...

    def vectors(self, experience_ids: Sequence[str]) -> dict[str, StoredVector]:
        """The stored embeddings of these experiences (those that have one)."""
        ...

    def put_vectors(self, vectors: Mapping[str, StoredVector]) -> None:
        """Store (or replace) embeddings by experience id."""
        ...

    def count_use(self, experience_ids: Iterable[str], trace_id: str) -> None:
        """These were injected into `trace_id`: one more use each, remembered for its end.

        None at all (its first messages showed none): its end counts nothing, so a store
        may skip its `count_outcome` read when the trace ends in this process.
        """
        ...

    def count_outcome(self, trace_id: str, succeeded: bool) -> list[str]:
        """The trace ended: a success for each experience it used (once); their ids."""
        ...


def _on_redis(client: redis.Redis) -> ExperienceStore:
    from fleet.experiences.backends.redis import RedisExperiences

    return RedisExperiences(client)


EXPERIENCES: Capability[ExperienceStore] = Capability("experiences", _on_redis, MemoryExperiences)
"""The experiences a store keeps beside it: `store.capability(EXPERIENCES)`."""
