"""Numbers from outside, checked finite and bounded where they enter.

A provider's token counts, an embedding endpoint's vector, an MCP server's answer, a
response header or a client's `timeout_s` may say anything JSON can: `NaN`, `Infinity`,
`1e300`, a 5,000-digit integer. Taken as they come they raise far from where they entered
(`int(inf)` is an `OverflowError`, `int(nan)` a `ValueError`) or become a 10^300 integer
in a trace's stats and cost. Every such number goes through one of these two functions at
the edge that read it; a bad one raises the caller's own error kind (the call's error),
in one line naming what and where.
"""

from __future__ import annotations

import math

from fleet.errors import FleetError

MAX_TOKENS_PER_CALL = 100_000_000
"""Most tokens one model call may report in any usage field (the largest context windows
hold ~2 million): more is a provider's garbage, not a bill."""
MAX_WAIT_S = 7 * 24 * 3600.0
"""Longest wait any outside party may ask for (retry-after, rate-limit resets)."""
_SHOWN_CHARS = 40


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def finite_number(
    value: object,
    what: str,
    *,
    low: float,
    high: float,
    error: type[FleetError],
) -> float:
    """`value` as a float in `[low, high]`; else `error` naming `what` (no bool, no text).

    Args:
        value: The number as it came (a JSON value, a parsed header, a tool argument).
        what: Where it came from, for the message (`"openai usage.prompt_tokens"`).
        low: The smallest value accepted.
        high: The largest value accepted.
        error: The caller's error kind (`ModelBehaviorError`, `ToolError`, `ConfigError`).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{what}: {_shown(value)} is not a number")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        raise error(f"{what}: {_shown(value)} is not a finite number") from None
    if not math.isfinite(number):
        raise error(f"{what}: {_shown(value)} is not a finite number")
    if not low <= number <= high:
        raise error(f"{what}: {_shown(value)} is outside {low:g}..{high:g}")
    return number


def bounded_count(value: object, what: str, *, high: int, error: type[FleetError]) -> int:
    """`value` as a whole count in `[0, high]` (a float is cut to its integer part)."""
    return int(finite_number(value, what, low=0, high=high, error=error))


def client_wait_s(value: float | None, what: str, error: type[FleetError]) -> float | None:
    """A wait a client asked for (`timeout_s`): None (no limit) or 0 to `MAX_WAIT_S`.

    NaN or infinite would wait for ever (`now > nan` is never true), holding a thread;
    negative or past a week is a mistake: each is `error`, before anything is submitted.
    """
    if value is None:
        return None
    return finite_number(value, what, low=0.0, high=MAX_WAIT_S, error=error)
