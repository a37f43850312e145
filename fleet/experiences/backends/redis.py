"""`ExperienceStore` on the fleet's Redis (keys in `fleet.storage.keys`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from fleet.errors import ExperienceNotFound
from fleet.experiences.model import Experience, StoredVector
from fleet.storage import keys


class RedisExperiences:
    """Experiences in one hash, their counts in another (atomic increments)."""

    def __init__(self, client: redis.Redis) -> None:
        """Use this client (the trace store's)."""
        self._client = client

    def put(self, experience: Experience) -> None:  # noqa: D102 (the Protocol's)
        data = experience.model_dump_json(exclude={"uses", "successes"})
        self._client.hset(keys.EXPERIENCES, experience.id, data)

    def get(self, experience_id: str) -> Experience:  # noqa: D102
        raw = self._client.hget(keys.EXPERIENCES, experience_id)
        if raw is None:
            raise ExperienceNotFound(f"no experience {experience_id!r}")
        return self._counted([(experience_id, raw)])[0]

    def all(self, scope: str | None = None) -> list[Experience]:  # noqa: D102
        found = self._counted(list(self._client.hgetall(keys.EXPERIENCES).items()))
        found.sort(key=lambda e: e.created_at_ms)
        return [e for e in found if scope is None or e.scope == scope]

    def remove(self, experience_id: str) -> bool:  # noqa: D102
        pipe = self._client.pipeline()
        pipe.hdel(keys.EXPERIENCES, experience_id)
        pipe.hdel(keys.EXPERIENCE_COUNTS, f"{experience_id}:uses", f"{experience_id}:successes")
        pipe.hdel(keys.EXPERIENCE_VECTORS, experience_id)
        return bool(pipe.execute()[0])

    def vectors(self, experience_ids: Sequence[str]) -> dict[str, StoredVector]:  # noqa: D102
        if not experience_ids:
            return {}
        raw = self._client.hmget(keys.EXPERIENCE_VECTORS, list(experience_ids))
        found = {i: StoredVector.decode(r) for i, r in zip(experience_ids, raw, strict=True) if r}
        return {i: v for i, v in found.items() if v is not None}

    def put_vectors(self, vectors: Mapping[str, StoredVector]) -> None:  # noqa: D102
        if vectors:
            mapping = {i: v.encode() for i, v in vectors.items()}
            self._client.hset(keys.EXPERIENCE_VECTORS, mapping=mapping)  # type: ignore[arg-type]

    def count_use(self, experience_ids: Iterable[str], trace_id: str) -> None:  # noqa: D102
        ids = list(experience_ids)
        if not ids:
            return
        pipe = self._client.pipeline()
        for i in ids:
            pipe.hincrby(keys.EXPERIENCE_COUNTS, f"{i}:uses", 1)
        used = keys.experiences_used(trace_id)
        pipe.delete(used)
        pipe.rpush(used, *ids)
        pipe.expire(used, keys.TRACE_TTL_S)
        pipe.execute()

    def count_outcome(self, trace_id: str, succeeded: bool) -> list[str]:  # noqa: D102
        # GETDEL-like for a list: the first finish takes it; a second finish finds nothing.
        pipe = self._client.pipeline()
        used = keys.experiences_used(trace_id)
        pipe.lrange(used, 0, -1)
        pipe.delete(used)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute()[0]]
        if succeeded and ids:
            pipe = self._client.pipeline()
            for i in ids:
                pipe.hincrby(keys.EXPERIENCE_COUNTS, f"{i}:successes", 1)
            pipe.execute()
        return ids

    def _counted(self, items: list[tuple[bytes | str, bytes | str]]) -> list[Experience]:
        if not items:
            return []
        ids = [i.decode() if isinstance(i, bytes) else i for i, _ in items]
        fields = [f"{i}:{c}" for i in ids for c in ("uses", "successes")]
        counts = self._client.hmget(keys.EXPERIENCE_COUNTS, fields)
        out = []
        for n, (_, raw) in enumerate(items):
            experience = Experience.model_validate_json(raw)
            experience.uses = int(counts[2 * n] or 0)
            experience.successes = int(counts[2 * n + 1] or 0)
            out.append(experience)
        return out
