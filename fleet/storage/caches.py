"""One kind of entry in the store's result cache, named by digest: what a tool is handed.

The result cache (`Services.cache_get` / `cache_set`) holds entries of several kinds, each
under its own key in `fleet.storage.keys`. A caller above storage that caches one kind (the
`web_search` answers) is handed a `KeyedCache` for it: it names entries by digest and never
builds a store key, so it needs nothing from this package but the role.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.storage import keys
from fleet.storage.store import Services


@dataclass(frozen=True)
class KeyedCache:
    """The entries of one kind in a store's result cache, by digest."""

    services: Services
    key_of: Callable[[str], str]
    """The store key of a digest (a function of `fleet.storage.keys`)."""

    def get(self, digest: str) -> str | None:
        """The cached value, or None."""
        return self.services.cache_get(self.key_of(digest))

    def set(self, digest: str, value: str, ttl_s: int) -> None:
        """Cache a value for `ttl_s`."""
        self.services.cache_set(self.key_of(digest), value, ttl_s)


def search_answers(services: Services) -> KeyedCache:
    """The store's cache of `web_search` answers (`keys.search_cache`)."""
    return KeyedCache(services, keys.search_cache)
