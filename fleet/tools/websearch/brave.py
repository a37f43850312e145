"""The Brave Search API: `GET https://api.search.brave.com/res/v1/web/search?q=...&count=N`.

The key goes in the `X-Subscription-Token` header; results are `web.results[]` with
`title`, `url` and `description` (which carries `<strong>` markup). `count` is at most 20.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fleet.config.search import SearchConfig
from fleet.tools.websearch.providers import ProviderRequest, entries
from fleet.tools.websearch.results import MAX_RESULTS, SearchResult, result_of

BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"


class Brave:
    """Brave's web search endpoint (or `base_url`, e.g. a test server or a proxy)."""

    name = "brave"

    def __init__(self, config: SearchConfig) -> None:
        """`config.base_url` replaces `BRAVE_URL` when set."""
        self._endpoint = config.base_url or BRAVE_URL

    def request(self, query: str, count: int, api_key: str) -> ProviderRequest:
        """The key in `X-Subscription-Token`, as Brave documents it."""
        params = urlencode({"q": query, "count": min(count, MAX_RESULTS)})
        headers = {"Accept": "application/json", "X-Subscription-Token": api_key}
        return ProviderRequest(f"{self._endpoint}?{params}", headers)

    def parse(self, data: Any) -> list[SearchResult]:
        """`web.results[].title/url/description`; no `web` at all is no results."""
        if isinstance(data, dict) and "web" not in data and "type" in data:
            return []  # Brave leaves `web` out when nothing matched
        found = (
            result_of(e.get("title"), e.get("url"), e.get("description"))
            for e in entries(data, "web", "results")
        )
        return [result for result in found if result is not None]
