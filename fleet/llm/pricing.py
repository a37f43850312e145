"""USD prices per million tokens for a few well-known models.

List prices change; a model in `fleet.yaml` may set `input_usd_per_mtok` and
`output_usd_per_mtok` to override this table. An unknown model costs 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

TOKENS_PER_MTOK = 1_000_000


@dataclass(frozen=True)
class ModelPricing:
    """List price of one model, in USD per million tokens."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float


PRICES: dict[str, ModelPricing] = {
    "gpt-4o": ModelPricing(2.50, 10.00),
    "gpt-4o-mini": ModelPricing(0.15, 0.60),
    "gpt-4.1": ModelPricing(2.00, 8.00),
    "gpt-4.1-mini": ModelPricing(0.40, 1.60),
    "gpt-4.1-nano": ModelPricing(0.10, 0.40),
    "o4-mini": ModelPricing(1.10, 4.40),
    "claude-opus-4-1": ModelPricing(15.00, 75.00),
    "claude-sonnet-4": ModelPricing(3.00, 15.00),
    "claude-sonnet-4-5": ModelPricing(3.00, 15.00),
    "claude-haiku-4-5": ModelPricing(1.00, 5.00),
    "claude-3-5-haiku": ModelPricing(0.80, 4.00),
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
) -> float:
    """Cost of one call; `override` (from fleet.yaml) beats the table."""
    pricing = override or lookup_pricing(model)
    if pricing is None:
        return 0.0
    return (
        prompt_tokens * pricing.input_usd_per_mtok + completion_tokens * pricing.output_usd_per_mtok
    ) / TOKENS_PER_MTOK
