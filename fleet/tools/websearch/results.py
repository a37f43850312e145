"""A search result as the model sees it: title, url, snippet; short and plain text.

Everything here comes from the provider and, through it, from any page on the web: markup,
entities, terminal escapes and bidi controls are removed and every field is capped.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_RESULTS = 20
"""Most results one call returns (Brave's own `count` ceiling)."""
MAX_TITLE_CHARS = 200
MAX_SNIPPET_CHARS = 500
MAX_URL_CHARS = 2000
_TAG = re.compile(r"<[^>]{0,500}>")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class SearchResult:
    """One normalised result."""

    title: str
    url: str
    snippet: str


def clean(value: Any, limit: int) -> str:
    """Plain text: tags and entities undone, control and format characters gone, capped."""
    if not isinstance(value, str):
        return ""
    text = html.unescape(_TAG.sub("", value[: limit * 4]))
    # Cc: ESC and the rest of C0/C1 (terminal escapes); Cf: bidi overrides, zero widths.
    kept = "".join(" " if unicodedata.category(ch) in ("Cc", "Cf") else ch for ch in text)
    text = _SPACE.sub(" ", kept).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def result_of(title: Any, url: Any, snippet: Any) -> SearchResult | None:
    """A result from the provider's fields, or None when its URL is not a plain web URL."""
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
        return None
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in url):
        return None  # a URL with spaces or escapes is not one a browser would send
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return SearchResult(clean(title, MAX_TITLE_CHARS), url, clean(snippet, MAX_SNIPPET_CHARS))


def render(query: str, results: list[SearchResult], dropped: int) -> str:
    """The tool's output: one numbered block per result."""
    lines = [f"{len(results)} result(s) for {clean(query, 200)!r}"]
    if dropped:
        lines[0] += f" ({dropped} outside the allowed domains dropped)"
    for i, result in enumerate(results, start=1):
        lines += ["", f"{i}. {result.title or '(no title)'}", f"   {result.url}"]
        if result.snippet:
            lines.append(f"   {result.snippet}")
    return "\n".join(lines)
