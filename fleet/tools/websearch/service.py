"""A fleet's web search: the provider, its key, each tree's budget and the provider limits.

Built once per process from fleet.yaml (`build_search`); `search` is what the tool calls.
The key is read from the environment variable fleet.yaml names and only ever goes into
the request's headers: errors name the provider and the HTTP status, never a URL (the
query), a header or the body (a provider may echo the key there).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from fleet.config.search import SearchConfig
from fleet.errors import ConfigError, ToolError
from fleet.limits.protocols import ProviderLimits
from fleet.limits.providers import Admitted, Scope, booked
from fleet.limits.searches import SearchCounter
from fleet.llm.config import RateLimits
from fleet.security.redact import SHAPES_ONLY, Redactor
from fleet.tools.websearch import brave, http, searxng
from fleet.tools.websearch.providers import SearchProvider
from fleet.tools.websearch.results import SearchResult

PROVIDERS: Mapping[str, Callable[[SearchConfig], SearchProvider]] = {
    "searxng": searxng.SearXNG,
    "brave": brave.Brave,
}
"""Provider name in fleet.yaml -> its wire format."""
_OVERLOADED = (429, 503, 529)


class SearchService:
    """One provider for every `web_search` of this process."""

    def __init__(
        self,
        config: SearchConfig,
        env: Mapping[str, str],
        counter: SearchCounter,
        *,
        limiter: ProviderLimits | None = None,
        web_allow: tuple[str, ...] = (),
        redactor: Redactor = SHAPES_ONLY,
    ) -> None:
        """Read the key from `env` (the variable `config.api_key_env` names) and keep it.

        `redactor` masks the process's secrets in every query before it leaves: a model
        that read one cannot search for it (the provider would log it).
        """
        self.config = config
        self.provider = PROVIDERS[config.provider](config)
        self._key = (env.get(config.api_key_env, "") if config.api_key_env else "").strip()
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in self._key):
            raise ConfigError(f"{config.api_key_env} contains control characters")
        self._counter = counter
        self._limiter = limiter
        self._web_allow = web_allow
        self._redactor = redactor
        self.scopes = (_scope(config, self._key),)

    def __repr__(self) -> str:
        return f"SearchService(provider={self.provider.name!r})"

    def search(
        self, query: str, count: int, *, trace_id: str, root_trace_id: str, timeout_s: float
    ) -> list[SearchResult]:
        """At most `count` results of `query`.

        Raises:
            ToolError: no key, the tree's search budget is spent, the provider is rate
                limited, refused by the SSRF guard, failed, or answered something that is
                not a bounded JSON answer of its documented shape.
        """
        name = self.provider.name
        if self.config.api_key_env and not self._key:
            raise ToolError(
                f"web_search: search provider {name!r} needs its key: set {self.config.api_key_env}"
            )
        limit = self.config.max_searches_per_tree
        if self._counter.take(root_trace_id or trace_id, limit) is None:
            raise ToolError(
                f"this tree's search budget is spent ({limit} searches;"
                " search.max_searches_per_tree in fleet.yaml)"
            )
        holder = f"{trace_id[:480]}.search"
        took = self._admit(holder)
        started = time.monotonic()
        try:
            safe_query = self._redactor.values_only(query)
            request = self.provider.request(safe_query, count, self._key)
            answer = http.get(request.url, request.headers, self._web_allow, timeout_s)
        finally:
            if took and self._limiter is not None:
                spent_ms = int((time.monotonic() - started) * 1000)
                self._limiter.settle(holder, self.scopes, 0, 0, spent_ms)
        return self.provider.parse(self._decoded(answer))[:count]

    def _admit(self, holder: str) -> bool:
        """Book the call if fleet.yaml limits the provider; True when a booking was made."""
        if self._limiter is None:
            return False
        if not booked(self.scopes):
            refused = self._limiter.paused(self.scopes)
            if refused is not None:
                raise ToolError(
                    f"search provider is paused: try again in {refused.retry_in_s:.1f}s"
                )
            return False
        admission = self._limiter.admit(holder, self.scopes, 0)
        if not isinstance(admission, Admitted):
            # No worker slot sleeps longer than a second on a limit: the model retries.
            raise ToolError(
                f"search provider is at its limits ({admission.reason}):"
                f" try again in {admission.retry_in_s:.1f}s"
            )
        time.sleep(admission.wait_s)
        return True

    def _decoded(self, answer: http.Answer) -> Any:
        name = self.provider.name
        if answer.status in _OVERLOADED and self._limiter is not None:
            pause_s = self._limiter.overloaded(self.scopes, answer.retry_after_s)
            raise ToolError(
                f"search provider {name!r} is overloaded (HTTP {answer.status}):"
                f" try again in {pause_s:.1f}s"
            )
        if answer.status >= 400:
            raise ToolError(f"search provider {name!r} answered HTTP {answer.status}")
        if answer.cut:
            raise ToolError(
                f"search provider {name!r} answered more than"
                f" {http.MAX_RESPONSE_BYTES} bytes: refused"
            )
        try:
            return json.loads(answer.body)
        except (ValueError, RecursionError):
            raise ToolError(
                f"search provider {name!r} answered something that is not JSON"
            ) from None


def _scope(config: SearchConfig, key: str) -> Scope:
    """The limiter scope of this provider and key (a digest: scope names are shown)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12] if key else "nokey"
    lim = config.limits
    limits = RateLimits(
        requests_per_minute=lim.requests_per_minute if lim else None,
        max_concurrency=lim.max_concurrency if lim else None,
    )
    return Scope(f"search:{config.provider}:{digest}", limits, provider=True)
