"""How a limited scope spaces its calls: the window model the limiter's Lua implements.

A provider that allows N requests a minute may count them in rolling one-minute windows,
rolling one-second windows (N/60 in ANY second), or a token bucket. The limiter books calls
so that the strictest of these holds even when calls reach the provider late: GCRA without
burst, each turn `spacing_ms` after the one before it, where

    spacing_ms = 60 000 / per_minute * (1 + JITTER_MARGIN_S / WINDOW_S)

Any L consecutive turns then span L * spacing, and a window of `WINDOW_S` that the provider
fills with exactly L = per_minute / 60 * WINDOW_S calls is spanned with `JITTER_MARGIN_S` to
spare. A call sent up to that margin later than its turn (the worker's sleep overran, the
thread waited for the GIL, the request took a while on the wire) therefore never puts L + 1
calls in one window. The same holds for any longer window (one minute: 60 * the margin to
spare), and tokens are paced the same way per token. The price is throughput: the scope runs
at 1 / (1 + margin / window) of its configured rate (0.952 with the defaults). A provider
or alias may set its own margin (`limits: {jitter_margin_ms}`): workers far from the
provider, or on several networks, see more lateness.

Turns are booked, but a call can leave much later than its turn when its worker is starved
of CPU (a fan-out of a hundred branches landing at once): several calls then leave
together. So the sends themselves are counted too, right before each call goes: at most
`most` sends in any `window_ms` (`send_window`: the provider's second plus the margin, and
as many calls as fit in it), and a send that would be one more waits for the oldest to
leave (`send_wait_ms`). The spacing keeps that wait rare and short.

`turns`, `send_wait_ms` and `most_in_window` are this model in plain Python: the Lua in
`fleet.limits.backends.redis.scripts` is tested against the first two, and
`most_in_window` is what a rolling-window provider counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

WINDOW_S = 1.0
"""The shortest window a provider is assumed to count in (one second: the strictest common)."""
JITTER_MARGIN_S = 0.05
"""How much later than its booked turn a call may reach the provider without a 429."""


def spacing_ms(per_minute: float, units: float = 1.0, margin_s: float = JITTER_MARGIN_S) -> float:
    """Milliseconds a call of `units` (1 request, or its tokens) holds the scope's line.

    0 when the scope has no such limit (`per_minute` 0).
    """
    if per_minute <= 0:
        return 0.0
    return units * 60_000 / per_minute * (1 + margin_s / WINDOW_S)


def effective_per_minute(per_minute: float, margin_s: float = JITTER_MARGIN_S) -> float:
    """What a scope configured at `per_minute` really admits: the margin's cost."""
    return per_minute / (1 + margin_s / WINDOW_S)


def turns(asks_ms: Iterable[float], spacing: float) -> list[float]:
    """The turn each ask gets, in the order they ask: no earlier than the ask, `spacing` apart.

    GCRA without burst: the scope's next free time moves `spacing` past each turn given.
    """
    free_at, given = float("-inf"), []
    for ask in asks_ms:
        turn = max(ask, free_at)
        given.append(turn)
        free_at = turn + spacing
    return given


def most_in_window(times_ms: Sequence[float], window_ms: float) -> int:
    """The most of `times_ms` (sorted) that any rolling window of `window_ms` holds.

    A window is (t - window_ms, t]: a call exactly `window_ms` after another has seen it
    leave, as a sliding-log limiter counts.
    """
    most, start = 0, 0
    for end, at in enumerate(times_ms):
        while times_ms[start] <= at - window_ms:
            start += 1
        most = max(most, end - start + 1)
    return most


def send_window(per_minute: float, margin_s: float = JITTER_MARGIN_S) -> tuple[float, int]:
    """(window ms, most sends in it) for a scope at `per_minute` requests: (0, 0) for none.

    The provider's window (a second, or one spacing when fewer than one call a second is
    allowed) plus the margin, and the whole calls the provider allows in its window.
    """
    if per_minute <= 0:
        return 0.0, 0
    window_ms = max(WINDOW_S * 1000, 60_000 / per_minute)
    most = max(1, math.floor(per_minute * window_ms / 60_000 + 1e-9))
    return window_ms + margin_s * 1000, most


def send_wait_ms(sends_ms: Sequence[float], now_ms: float, window_ms: float, most: int) -> float:
    """0 when a call may leave at `now_ms`, else how long until it may.

    `sends_ms`: when the scope's earlier calls left (sorted). A window is (t - window_ms, t].
    """
    recent = [at for at in sends_ms if at > now_ms - window_ms]
    if len(recent) < most:
        return 0.0
    return recent[len(recent) - most] + window_ms - now_ms
