"""What providers say about their rate limits, read from response headers.

OpenAI-compatible servers send `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
(reset as a duration: `1s`, `6m0s`, `120ms`); Anthropic sends
`anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
(reset as an RFC 3339 time). Both send `retry-after` (and OpenAI `retry-after-ms`) with a
429. `fleet.limits.providers` turns these into fleet-wide pauses and corrections.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from fleet.errors import ModelBehaviorError
from fleet.security.numbers import MAX_WAIT_S, bounded_count

OVERLOAD_STATUS = frozenset({429, 503, 529})
"""Answers that mean "too much, come back later": the whole fleet backs off the provider."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_HEADER_COUNT = 10**15
"""Largest request or token count a rate-limit header is believed for."""


@dataclass(frozen=True)
class Budget:
    """One dimension (requests or tokens) as the provider counts it; None when not sent."""

    limit: int | None = None
    remaining: int | None = None
    reset_s: float | None = None
    """Seconds until the provider's budget is full again."""

    def exhausted_for_s(self) -> float | None:
        """How long nothing more is allowed (until one unit is back), or None if some is left.

        With the limit known the refill is taken as steady: one unit takes reset/(limit -
        remaining); otherwise the whole reset time.
        """
        if self.remaining is None or self.remaining > 0 or self.reset_s is None:
            return None
        if self.limit:
            return self.reset_s / self.limit
        return self.reset_s


@dataclass(frozen=True)
class RateSignal:
    """The rate-limit headers of one response."""

    requests: Budget = Budget()
    tokens: Budget = Budget()

    @property
    def empty(self) -> bool:
        """True when the response carried no rate-limit header at all."""
        return self.requests == Budget() and self.tokens == Budget()

    def pause_s(self) -> float | None:
        """How long every worker should hold back, if the provider has nothing left."""
        waits = [w for w in (self.requests.exhausted_for_s(), self.tokens.exhausted_for_s()) if w]
        return max(waits) if waits else None


def parse_duration_s(text: str) -> float | None:
    """`1s`, `6m0s`, `120ms`, `1h2m3.5s` or plain seconds; None if unreadable (or infinite)."""
    text = text.strip()
    try:
        return finite_s(float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return finite_s(sum(float(n) * _UNIT_S[u] for n, u in parts))


def finite_s(seconds: float) -> float | None:
    """A wait read from a header: 0 to `MAX_WAIT_S`, None for `inf`/`nan`.

    A header may say anything; a week-long `retry-after` is as long as any provider means.
    """
    return min(max(0.0, seconds), MAX_WAIT_S) if math.isfinite(seconds) else None


def _int(value: str | None) -> int | None:
    """A count header; None when unreadable, NaN, infinite, negative or absurd (`1e300`)."""
    if value is None:
        return None
    try:
        number = float(value)
        return bounded_count(number, "header", high=MAX_HEADER_COUNT, error=ModelBehaviorError)
    except (ValueError, ModelBehaviorError):  # an odd header is no signal, not an error
        return None


def _reset_at_s(value: str | None, now_s: float) -> float | None:
    if value is None:
        return None
    try:
        return finite_s(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() - now_s)
    except ValueError:
        return parse_duration_s(value)


def rate_signal(headers: Mapping[str, str], now_s: float) -> RateSignal:
    """The OpenAI or Anthropic rate-limit headers of a response (either style, or none)."""
    low = {k.lower(): v for k, v in headers.items()}
    if any(k.startswith("anthropic-ratelimit-") for k in low):
        tokens = "tokens" if "anthropic-ratelimit-tokens-remaining" in low else "output-tokens"
        return RateSignal(_anthropic(low, "requests", now_s), _anthropic(low, tokens, now_s))
    return RateSignal(_openai(low, "requests"), _openai(low, "tokens"))


def _openai(headers: Mapping[str, str], what: str) -> Budget:
    reset = headers.get(f"x-ratelimit-reset-{what}")
    return Budget(
        limit=_int(headers.get(f"x-ratelimit-limit-{what}")),
        remaining=_int(headers.get(f"x-ratelimit-remaining-{what}")),
        reset_s=parse_duration_s(reset) if reset is not None else None,
    )


def _anthropic(headers: Mapping[str, str], what: str, now_s: float) -> Budget:
    prefix = f"anthropic-ratelimit-{what}"
    return Budget(
        limit=_int(headers.get(f"{prefix}-limit")),
        remaining=_int(headers.get(f"{prefix}-remaining")),
        reset_s=_reset_at_s(headers.get(f"{prefix}-reset"), now_s),
    )
