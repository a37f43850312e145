"""`web_search` answers cached like other tool results, where the preset allows it.

A preset with `cache: {ttl_s: N, tools: [web_search]}` answers the same search (same
provider, query and count) from the store for N seconds, anywhere in the fleet: no
provider request and no search budget spent. What is cached is the provider's normalised
results before the domain filters: each trace's own filters (fleet.yaml's, its parent's,
its preset's, the call's `domains`) are applied to a hit as to a fresh answer. A hit is
re-cleaned as it is read (`results.result_of`): a forged entry is plain text too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

from fleet.tools.websearch.results import MAX_RESULTS, SearchResult, result_of

MAX_CACHED_CHARS = 200_000
"""A cached answer larger than this is not read (20 results are a few KB)."""


class AnswerCache(Protocol):
    """The store's cache of `web_search` answers, by digest (the runtime hands it).

    A role, not the storage package: `fleet.storage.caches.search_answers` names the store
    key, so no tool imports `fleet.storage`.
    """

    def get(self, digest: str) -> str | None:
        """A cached answer."""
        ...

    def set(self, digest: str, value: str, ttl_s: int) -> None:
        """Cache an answer for `ttl_s`."""
        ...


@dataclass(frozen=True)
class SearchCache:
    """One preset's search cache on one provider."""

    store: AnswerCache
    ttl_s: int
    provider: str
    """Who answers: the provider, its address and its key's digest (never the key)."""

    def digest(self, query: str, count: int) -> str:
        """What names this search in the cache: provider, query and count."""
        blob = json.dumps([self.provider, query, count], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def get(self, query: str, count: int) -> list[SearchResult] | None:
        """The cached results, or None (a miss, or an entry that is not what we wrote)."""
        raw = self.store.get(self.digest(query, count))
        if raw is None or len(raw) > MAX_CACHED_CHARS:
            return None
        try:
            rows = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(rows, list):
            return None
        found = [result_of(*row) for row in rows[:MAX_RESULTS] if _row(row)]
        return [r for r in found if r is not None]

    def put(self, query: str, count: int, results: list[SearchResult]) -> None:
        """Cache a fresh answer for `ttl_s`."""
        rows = [[r.title, r.url, r.snippet] for r in results]
        self.store.set(self.digest(query, count), json.dumps(rows), self.ttl_s)


def _row(row: object) -> bool:
    return isinstance(row, list) and len(row) == 3
