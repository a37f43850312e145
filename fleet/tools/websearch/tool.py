"""The `web_search` tool."""

from __future__ import annotations

from fleet.config.webfilter import DomainRules, check_pattern
from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.websearch.results import MAX_RESULTS, render

MAX_QUERY_CHARS = 400


def web_search(
    ctx: ToolContext, query: str, max_results: int = 5, domains: list[str] | None = None
) -> ToolResult:
    """Search the web; returns a numbered list of results (title, url, snippet).

    Args:
        ctx: The run's limits, search provider and domain filters.
        query: What to search for, as you would type it into a search engine.
        max_results: How many results to return, 1 to 20.
        domains: Only results on these domains (globs such as `*.python.org`).
    """
    if ctx.search is None:
        raise ToolError("web_search is not configured: the operator sets `search:` in fleet.yaml")
    query = query.strip()
    if not query or len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query must be 1 to {MAX_QUERY_CHARS} characters")
    if not 1 <= max_results <= MAX_RESULTS:
        raise ToolError(f"max_results must be 1 to {MAX_RESULTS}, not {max_results}")
    filters = ctx.web_filter
    if domains:
        try:
            patterns = tuple(check_pattern(d) for d in domains[:20])
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        filters = filters.narrowed(DomainRules(allow=patterns))
        query = f"{query} {_site_terms(patterns)}"
    found = ctx.search_cache.get(query, max_results) if ctx.search_cache else None
    cached = found is not None
    if found is None:
        found = ctx.search.search(
            query,
            max_results,
            trace_id=ctx.trace_id,
            root_trace_id=ctx.root_trace_id,
            timeout_s=min(ctx.web_timeout_s, ctx.tool_timeout_s),
        )
        if ctx.search_cache is not None:
            ctx.search_cache.put(query, max_results, found)
    kept = [result for result in found if filters.refusal(result.url) is None]
    return ToolResult(
        title=f"web_search: {len(kept)} result(s)",
        output=render(query, kept, len(found) - len(kept)),
        long_term_memory=f"searched {query[:100]!r}: {len(kept)} result(s)",
        metadata={"results": len(kept), "dropped": len(found) - len(kept), "cached": cached},
    )


def _site_terms(patterns: tuple[str, ...]) -> str:
    """`site:` operators (SearXNG and Brave read them); the filter still checks each result."""
    sites = [p.removeprefix("*.") for p in patterns if "*" not in p.removeprefix("*.")]
    return " OR ".join(f"site:{site}" for site in sites)
