"""Ranking experiences by embeddings, when fleet.yaml names an `experiences.embedding_model`.

An approved experience's vector is computed when it is stored approved (`IndexedExperiences`:
`fleet experience add`, `approve`, the API, an auto-approved reflection) and kept beside it
(`ExperienceStore.put_vectors`); one that has none yet (approved before a model was named,
or while the endpoint was down) is embedded in the same request as the run's task. So a run
makes at most one `/embeddings` request, and none when no approved experience is in its
scopes. When the request fails the run is ranked by BM25 instead: the failure is logged
once, and the endpoint is left alone for `COOL_OFF_S` so that an outage costs each run
nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet.errors import FleetError
from fleet.experiences.model import Experience, StoredVector, embedding_text, text_digest
from fleet.experiences.store import ExperienceStore
from fleet.llm.config import FleetConfig, resolve_target
from fleet.llm.embeddings import EmbeddingsClient, Vector, dot, unit
from fleet.security.redact import Redactor

log = logging.getLogger(__name__)

COOL_OFF_S = 30.0
"""After a failed request, how long runs rank by BM25 without asking the endpoint."""


class Embedder:
    """Vectors from the configured model, or None (logged once) when it fails."""

    def __init__(
        self,
        client: EmbeddingsClient,
        model: str,
        min_similarity: float,
        *,
        cool_off_s: float = COOL_OFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`model`: the alias, stored with each vector."""
        self.client = client
        self.model = model
        self.min_similarity = min_similarity
        self.cool_off_s = cool_off_s
        self._clock = clock
        self._down_until = 0.0
        self._logged = False
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[Vector] | None:
        """One unit vector per text; None when the endpoint failed now or moments ago.

        Unit length: stored so, a run's ranking is one dot product per experience.
        """
        if self._clock() < self._down_until:
            return None
        try:
            vectors = self.client.embed(texts)
        except Exception as exc:  # any failure ranks by BM25: a run never dies of this
            self._failed(exc)
            return None
        with self._lock:
            self._logged = False  # a later outage is logged again
        return [unit(v) for v in vectors]

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self._down_until = self._clock() + self.cool_off_s
            first, self._logged = not self._logged, True
        why = f"{type(exc).__name__}: {exc}" if isinstance(exc, FleetError) else type(exc).__name__
        # FleetError texts from the client are redacted; anything else is named, not quoted.
        (log.warning if first else log.debug)(
            "embeddings %r failed (%s): experiences are ranked by BM25 for %.0f s",
            self.model,
            why,
            self.cool_off_s,
        )


def make_embedder(config: FleetConfig, env: Mapping[str, str]) -> Embedder | None:
    """The embedder fleet.yaml names (checked when it loaded), or None.

    Nothing is sent here: a missing or wrong key shows at the first request, which then
    fails like any other (logged once, BM25 ranks), so no command refuses to start over it.
    """
    name = config.experiences.embedding_model
    if name is None:
        return None
    target = resolve_target(config, name)
    key = env.get(target.api_key_env, "").strip() if target.api_key_env else ""
    client = EmbeddingsClient(
        target.base_url,
        key,
        target.model,
        provider=target.provider,
        api_key_env=target.api_key_env,
        redactor=Redactor.from_env(env),
    )
    return Embedder(client, name, config.experiences.min_similarity)


def index(store: ExperienceStore, embedder: Embedder, experiences: Iterable[Experience]) -> int:
    """Embed and store the vectors these lack (or whose text changed); how many were stored."""
    by_id = {e.id: e for e in experiences}
    have = _fresh(store, embedder, by_id)
    missing = [e for e in by_id.values() if e.id not in have]
    vectors = embedder.embed([embedding_text(e) for e in missing]) if missing else None
    if not vectors:
        return 0
    _keep(store, embedder, missing, vectors)
    return len(missing)


def nearest(
    store: ExperienceStore, embedder: Embedder, candidates: Sequence[Experience], query: str
) -> list[Experience] | None:
    """`candidates` at least `min_similarity` to `query`, most similar first; None on failure.

    One request: the query, and every candidate still without a fresh vector (stored then).
    """
    if not candidates:
        return []
    by_id = {e.id: e for e in candidates}
    have = _fresh(store, embedder, by_id)
    missing = [e for e in by_id.values() if e.id not in have]
    got = embedder.embed([query, *(embedding_text(e) for e in missing)])
    if got is None:
        return None
    wanted, fresh = got[0], got[1:]
    have |= _keep(store, embedder, missing, fresh)
    scored = [(-dot(wanted, have[e.id]), n, e) for n, e in enumerate(by_id.values())]
    kept = sorted((s for s in scored if -s[0] >= embedder.min_similarity), key=lambda s: s[:2])
    return [e for _, _, e in kept]


def _fresh(
    store: ExperienceStore, embedder: Embedder, by_id: Mapping[str, Experience]
) -> dict[str, Vector]:
    """The stored vectors that are this model's and of the experience's current text."""
    stored = store.vectors(list(by_id))
    return {
        i: v.values
        for i, v in stored.items()
        if v.model == embedder.model and v.digest == text_digest(by_id[i])
    }


def _keep(
    store: ExperienceStore,
    embedder: Embedder,
    experiences: Sequence[Experience],
    vectors: Sequence[Vector],
) -> dict[str, Vector]:
    if not experiences:
        return {}
    pairs = list(zip(experiences, vectors, strict=True))
    store.put_vectors({e.id: StoredVector(embedder.model, text_digest(e), v) for e, v in pairs})
    return {e.id: v for e, v in pairs}


@dataclass
class IndexedExperiences:
    """An `ExperienceStore` that embeds an experience when it is stored approved.

    A failed request leaves it without a vector; the first run that ranks it embeds it.
    """

    store: ExperienceStore
    embedder: Embedder

    def put(self, experience: Experience) -> None:  # noqa: D102 (the Protocol's)
        self.store.put(experience)
        if experience.approved:
            index(self.store, self.embedder, [experience])

    def get(self, experience_id: str) -> Experience:  # noqa: D102
        return self.store.get(experience_id)

    def all(self, scope: str | None = None) -> list[Experience]:  # noqa: D102
        return self.store.all(scope)

    def remove(self, experience_id: str) -> bool:  # noqa: D102
        return self.store.remove(experience_id)

    def approved(self, scopes: Sequence[str]) -> dict[str, tuple[Experience, ...]]:  # noqa: D102
        return self.store.approved(scopes)

    def counted(self, experiences: Sequence[Experience]) -> list[Experience]:  # noqa: D102
        return self.store.counted(experiences)

    def note_version(self, version: tuple[str | None, int] | None) -> None:  # noqa: D102
        self.store.note_version(version)

    def held_version(self) -> str | None:  # noqa: D102
        return self.store.held_version()

    def vectors(self, experience_ids: Sequence[str]) -> dict[str, StoredVector]:  # noqa: D102
        return self.store.vectors(experience_ids)

    def put_vectors(self, vectors: Mapping[str, StoredVector]) -> None:  # noqa: D102
        self.store.put_vectors(vectors)

    def count_use(self, experience_ids: Iterable[str], trace_id: str) -> None:  # noqa: D102
        self.store.count_use(experience_ids, trace_id)

    def count_outcome(self, trace_id: str, succeeded: bool) -> list[str]:  # noqa: D102
        return self.store.count_outcome(trace_id, succeeded)
