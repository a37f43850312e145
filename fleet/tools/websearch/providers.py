"""The seam between `web_search` and a search API: build the request, read the answer.

A provider never opens a connection: `fleet.tools.websearch.http` does that for every
provider alike, through the SSRF guard. Adding one is a module with a class like
`searxng.SearXNG` and a line in `fleet.tools.websearch.service.PROVIDERS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.errors import ToolError
from fleet.tools.websearch.results import SearchResult


@dataclass(frozen=True)
class ProviderRequest:
    """One GET: the full URL (query string included) and its headers."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """May hold the key: never shown, logged or put into an error."""


class SearchProvider(Protocol):
    """A search API's wire format."""

    name: str

    def request(self, query: str, count: int, api_key: str) -> ProviderRequest:
        """The GET that asks for `count` results of `query`."""
        ...

    def parse(self, data: Any) -> list[SearchResult]:
        """The results of a decoded JSON answer; `ToolError` when it has the wrong shape."""
        ...


def entries(data: Any, *path: str) -> list[dict[str, Any]]:
    """The list of objects at `path` in `data`; entries that are not objects are skipped.

    Raises:
        ToolError: something on the path is missing or not of the documented type.
    """
    node = data
    for name in path:
        if not isinstance(node, dict) or name not in node:
            raise ToolError(f"the search provider's answer has no {'.'.join(path)!r} list")
        node = node[name]
    if not isinstance(node, list):
        raise ToolError(f"the search provider's answer has no {'.'.join(path)!r} list")
    return [entry for entry in node if isinstance(entry, dict)]
