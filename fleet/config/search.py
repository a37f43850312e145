"""The `search:` block of fleet.yaml.

search:
  provider: brave                  # or searxng (then base_url is required)
  api_key_env: BRAVE_API_KEY       # the variable holding the key, never the key
  max_searches_per_tree: 100       # per root trace, every sub-agent included
  limits: {requests_per_minute: 60, max_concurrency: 4}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from fleet.config.limits import PositiveCount

DEFAULT_MAX_SEARCHES_PER_TREE = 100


class SearchLimits(BaseModel):
    """`search.limits`: shared by every worker through Redis, as a model provider's are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: PositiveCount | None = None
    max_concurrency: PositiveCount | None = None


class SearchConfig(BaseModel):
    """Which search provider `web_search` asks, and how much."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["searxng", "brave"]
    base_url: str = ""
    """SearXNG: the instance (`https://searx.example`); Brave: leave empty for its API."""
    api_key_env: str = ""
    """The environment variable holding the key (Brave: required)."""
    max_searches_per_tree: PositiveCount = DEFAULT_MAX_SEARCHES_PER_TREE
    limits: SearchLimits | None = None

    @model_validator(mode="after")
    def _complete(self) -> SearchConfig:
        if self.provider == "searxng" and not self.base_url:
            raise ValueError("provider searxng needs base_url (the instance's address)")
        if self.provider == "brave" and not self.api_key_env:
            raise ValueError("provider brave needs api_key_env (e.g. BRAVE_API_KEY)")
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return self
