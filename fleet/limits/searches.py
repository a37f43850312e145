"""Each tree's search budget: how many `web_search` calls its agents may make together.

One counter per root (`keys.searches`), taken before the provider is asked: a tree cannot
make more calls than `search.max_searches_per_tree` whatever its branches do at once.
"""

from __future__ import annotations

from typing import Protocol


class SearchCounter(Protocol):
    """Takes one search from a tree's budget."""

    def take(self, root_trace_id: str, limit: int) -> int | None:
        """The number of this search (1, 2, ...), or None when the tree has used `limit`."""
        ...
