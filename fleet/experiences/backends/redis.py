"""`ExperienceStore` on the fleet's Redis (keys in `fleet.storage.keys`).

A run's start ranks the approved experiences of its scopes (`approved`): the process keeps
them parsed, grouped by scope, and reads the whole hash again only when the version counter
(`keys.EXPERIENCES_VERSION`, raised in the same transaction as every put and removal) or the
hash's length differ from when it was filled: one round trip of two commands per run start
however many experiences there are, read in the run's first round trip (`begin_run`, then
`note_version`) where it can; there the length is read only when the counter is not the one
the process holds (`held_version`: "" for none yet). The version is read before the hash, so
a put between the two reads fills the cache under the older version and the next start reads
again. A Redis that restarted without its data reads as a new version (or a new length). A
trace whose first messages showed no experience (`count_use` of none) is remembered in the
process: its end there reads nothing (`count_outcome`); a trace that ends in another process
reads its list as before. On a Redis Cluster the hash and the counter sit in different
slots: a put's two commands go together but not as one transaction, so a start in between
keeps its cache until the counter moves, an instant later.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis

from fleet.errors import ExperienceNotFound
from fleet.experiences.model import Experience, StoredVector
from fleet.storage import keys

NONE_SHOWN_KEPT = 100_000
"""Traces remembered as shown no experience (`count_use` of none), at most."""


@dataclass(frozen=True)
class _Approved:
    """The approved experiences by scope, as of one version and length of the hash."""

    version: tuple[str | None, int]
    by_scope: dict[str, tuple[Experience, ...]]


class RedisExperiences:
    """Experiences in one hash, their counts in another (atomic increments)."""

    def __init__(self, client: redis.Redis) -> None:
        """Use this client (the trace store's)."""
        self._client = client
        self._approved: _Approved | None = None
        self._noted = threading.local()
        """`version`: the version and count this thread's run read with `begin_run`."""
        self._none_shown: dict[str, bool] = {}
        """Traces whose first messages this process chose with no experience in them."""
        self._lock = threading.Lock()

    def put(self, experience: Experience) -> None:  # noqa: D102 (the Protocol's)
        data = experience.model_dump_json(exclude={"uses", "successes"})
        pipe = self._client.pipeline()  # one transaction: no process caches it unversioned
        pipe.hset(keys.EXPERIENCES, experience.id, data)
        pipe.incr(keys.EXPERIENCES_VERSION)
        pipe.execute()

    def note_version(self, version: tuple[str | None, int] | None) -> None:  # noqa: D102
        self._noted.version = version

    def held_version(self) -> str | None:  # noqa: D102
        with self._lock:
            cached = self._approved
        return None if cached is None else cached.version[0] or ""

    def approved(self, scopes: Sequence[str]) -> dict[str, tuple[Experience, ...]]:  # noqa: D102
        version, self._noted.version = getattr(self._noted, "version", None), None
        if version is not None and version[1] < 0:  # the version held: its count is known
            with self._lock:
                cached = self._approved
            held = cached is not None and cached.version[0] == version[0]
            version = cached.version if cached is not None and held else None
        if version is None:  # not read with this thread's run: read here
            pipe = self._client.pipeline(transaction=False)
            pipe.get(keys.EXPERIENCES_VERSION)
            pipe.hlen(keys.EXPERIENCES)
            raw, length = pipe.execute()
            version = (None if raw is None else str(raw), int(length))
        length = version[1]
        with self._lock:
            cached = self._approved
        if cached is None or cached.version != version:
            cached = _Approved(version, self._load() if length else {})
            with self._lock:
                self._approved = cached
        return {s: cached.by_scope.get(s, ()) for s in scopes}

    def _load(self) -> dict[str, tuple[Experience, ...]]:
        raw = self._client.hgetall(keys.EXPERIENCES)
        found = [Experience.model_validate_json(v) for v in raw.values()]
        found.sort(key=lambda e: e.created_at_ms)
        by_scope: dict[str, list[Experience]] = {}
        for e in found:
            if e.approved:
                by_scope.setdefault(e.scope, []).append(e)
        return {s: tuple(es) for s, es in by_scope.items()}

    def counted(self, experiences: Sequence[Experience]) -> list[Experience]:  # noqa: D102
        if not experiences:
            return []
        fields = [f"{e.id}:{c}" for e in experiences for c in ("uses", "successes")]
        counts = self._client.hmget(keys.EXPERIENCE_COUNTS, fields)
        return [
            e.model_copy(update={"uses": int(u or 0), "successes": int(s or 0)})
            for e, u, s in zip(experiences, counts[0::2], counts[1::2], strict=True)
        ]

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
        pipe.incr(keys.EXPERIENCES_VERSION)
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
        with self._lock:
            if ids:
                self._none_shown.pop(trace_id, None)
            else:
                if len(self._none_shown) > NONE_SHOWN_KEPT:  # a long-lived worker sees many
                    self._none_shown.clear()
                self._none_shown[trace_id] = True
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
        with self._lock:
            if self._none_shown.pop(trace_id, False):  # its first messages here showed none
                return []
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
