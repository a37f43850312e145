"""USD prices per million tokens for a few well-known models, cached prompt tokens included.

List prices change; a model in `fleet.yaml` may set `input_usd_per_mtok`,
`output_usd_per_mtok`, `cached_input_usd_per_mtok` and `cache_write_usd_per_mtok` to
override this table. An unknown model costs 0.0. A price left unset for cached tokens is
the provider's usual share of the input price (`CACHE_SHARES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fleet.errors import ModelBehaviorError
from fleet.security.numbers import MAX_TOKENS_PER_CALL, bounded_count

TOKENS_PER_MTOK = 1_000_000

CACHE_SHARES: dict[str, tuple[float, float]] = {
    "anthropic": (0.10, 1.25),
    "openai": (0.50, 1.00),
}
"""Provider kind -> (cache read, cache write) price as a share of the input price.

Anthropic bills a cache read at a tenth of the input price and a 5-minute cache write at
1.25 times it; OpenAI bills cached input at half (or less) and charges nothing for writes.
"""


@dataclass(frozen=True)
class ModelPricing:
    """List price of one model, in USD per million tokens."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None = None
    """Prompt tokens read from the provider's prompt cache; None: the provider's share."""
    cache_write_usd_per_mtok: float | None = None
    """Prompt tokens written to the cache (Anthropic); None: the provider's share."""

    def for_kind(self, kind: str) -> ModelPricing:
        """These prices with the unset cache prices filled from the provider's shares."""
        read_share, write_share = CACHE_SHARES.get(kind, (1.0, 1.0))
        read, write = self.cached_input_usd_per_mtok, self.cache_write_usd_per_mtok
        return replace(
            self,
            cached_input_usd_per_mtok=self.input_usd_per_mtok * read_share
            if read is None
            else read,
            cache_write_usd_per_mtok=self.input_usd_per_mtok * write_share
            if write is None
            else write,
        )


@dataclass(frozen=True)
class CachedTokens:
    """The prompt tokens of one call that the provider's cache served or stored.

    Both are part of the call's `prompt_tokens`, never on top of them.
    """

    read: int = 0
    written: int = 0


def token_count(raw: object, key: str) -> int:
    """A token count of a provider's `usage` mapping.

    Missing, negative or not a number (text that reads as none, a bool, a list): 0, as a
    provider that leaves a field out. NaN, infinite or past `MAX_TOKENS_PER_CALL` (1e300):
    `ModelBehaviorError`, that call's error; never a crash or a 10^300 integer in the stats.
    """
    value = raw.get(key) if isinstance(raw, dict) else None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if -math.inf < value < 0:  # a negative count means none; -inf is as bad as inf
        return 0
    what = f"provider usage {key!r}"
    return bounded_count(value, what, high=MAX_TOKENS_PER_CALL, error=ModelBehaviorError)


PRICES: dict[str, ModelPricing] = {
    "gpt-4o": ModelPricing(2.50, 10.00, 1.25),
    "gpt-4o-mini": ModelPricing(0.15, 0.60, 0.075),
    "gpt-4.1": ModelPricing(2.00, 8.00, 0.50),
    "gpt-4.1-mini": ModelPricing(0.40, 1.60, 0.10),
    "gpt-4.1-nano": ModelPricing(0.10, 0.40, 0.025),
    "o4-mini": ModelPricing(1.10, 4.40, 0.275),
    "claude-opus-4-1": ModelPricing(15.00, 75.00, 1.50, 18.75),
    "claude-sonnet-4": ModelPricing(3.00, 15.00, 0.30, 3.75),
    "claude-sonnet-4-5": ModelPricing(3.00, 15.00, 0.30, 3.75),
    "claude-haiku-4-5": ModelPricing(1.00, 5.00, 0.10, 1.25),
    "claude-3-5-haiku": ModelPricing(0.80, 4.00, 0.08, 1.00),
}


def lookup_pricing(model: str) -> ModelPricing | None:
    """The table entry for `model`, or None.

    Accepts router prefixes (`openai/gpt-4o`) and dated snapshots
    (`claude-sonnet-4-5-20250929`): the longest table key that is the whole name or a
    `-`-separated prefix of it wins, so `gpt-4o-mini-2024-07-18` is not priced as `gpt-4o`.
    """
    name = model.rsplit("/", 1)[-1]
    matches = [key for key in PRICES if name == key or name.startswith(key + "-")]
    if not matches:
        return None
    return PRICES[max(matches, key=len)]


def cost_usd(
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    override: ModelPricing | None = None,
    *,
    cached: CachedTokens = CachedTokens(),
    kind: str = "openai",
) -> float:
    """Cost of one call; `override` (from fleet.yaml) beats the table.

    Args:
        model: The provider's model name (looked up in `PRICES` without an override).
        prompt_tokens: Every prompt token of the call, cached ones included.
        completion_tokens: The answer's tokens.
        override: The alias's prices from fleet.yaml.
        cached: Which of the prompt tokens the cache served or stored, priced apart.
        kind: The provider's wire (`anthropic`, `openai`): its default cache shares.
    """
    pricing = override or lookup_pricing(model)
    if pricing is None:
        return 0.0
    priced = pricing.for_kind(kind)
    assert priced.cached_input_usd_per_mtok is not None
    assert priced.cache_write_usd_per_mtok is not None
    read = min(max(cached.read, 0), prompt_tokens)  # a provider's odd numbers never go negative
    written = min(max(cached.written, 0), prompt_tokens - read)
    fresh = prompt_tokens - read - written
    return (
        fresh * priced.input_usd_per_mtok
        + read * priced.cached_input_usd_per_mtok
        + written * priced.cache_write_usd_per_mtok
        + completion_tokens * priced.output_usd_per_mtok
    ) / TOKENS_PER_MTOK
