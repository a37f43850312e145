"""SearXNG's JSON API: `GET {base_url}/search?q=...&format=json` -> `results[]`.

Each result has `title`, `url` and `content` (the snippet). The instance must list `json`
under `search.formats` in its settings.yml, else it answers 403. It has no result count
parameter: the first page is cut to the count asked for.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fleet.config.search import SearchConfig
from fleet.tools.websearch.providers import ProviderRequest, entries
from fleet.tools.websearch.results import SearchResult, result_of


class SearXNG:
    """A SearXNG instance (self-hosted, usually without a key)."""

    name = "searxng"

    def __init__(self, config: SearchConfig) -> None:
        """`config.base_url` is the instance; a trailing `/search` is accepted."""
        self._endpoint = config.base_url.rstrip("/").removesuffix("/search") + "/search"

    def request(self, query: str, count: int, api_key: str) -> ProviderRequest:
        """`format=json`; a key, if the operator set one, goes as a bearer token."""
        headers = {"Accept": "application/json"}
        if api_key:  # a SearXNG behind an authenticating proxy
            headers["Authorization"] = f"Bearer {api_key}"
        params = urlencode({"q": query, "format": "json", "pageno": 1})
        return ProviderRequest(f"{self._endpoint}?{params}", headers)

    def parse(self, data: Any) -> list[SearchResult]:
        """`results[].title/url/content`."""
        found = (
            result_of(e.get("title"), e.get("url"), e.get("content"))
            for e in entries(data, "results")
        )
        return [result for result in found if result is not None]
