"""The window model of `fleet.limits.pacing`: tables of bursts and jitter, then the Lua against it.

A provider that allows N requests in any rolling second counts arrivals; the limiter books
turns. The tables feed asks into `turns`, delay each turn as the network and a busy worker
would, and count what the provider's window would hold.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import redis

from fleet.limits import pacing
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.providers import Admitted, Scope
from fleet.llm.config import RateLimits
from fleet.storage import keys

MARGIN_MS = 50.0
"""The lateness the limiter promises to absorb (docs/limits.md): a number, not the constant,
so that a smaller margin fails these tables."""
Jitter = Callable[[int], float]
"""Call number -> how late (ms) that call reaches the provider after its turn."""


def on_time(i: int) -> float:
    return 0.0


def seeded(most_ms: float, seed: int = 7) -> Jitter:
    """Uniform lateness in [0, most_ms], the same on every run."""
    draws = random.Random(seed)
    late = [draws.uniform(0, most_ms) for _ in range(5000)]
    return lambda i: late[i]


def every_nth_late(n: int, late_ms: float) -> Jitter:
    """One call in every n late by `late_ms`, the rest on time.

    With n = 21 each late call and the 20th after it (on time) come closest: the worst case
    for a window of 20.
    """
    return lambda i: late_ms if i % n == 0 else 0.0


def burst(count: int, at_ms: float = 0.0) -> list[float]:
    return [at_ms] * count


def waves(count: int, size: int, every_ms: float) -> list[float]:
    return [(i // size) * every_ms for i in range(count)]


def arrivals(asks: list[float], spacing: float, jitter: Jitter) -> list[float]:
    return sorted(turn + jitter(i) for i, turn in enumerate(pacing.turns(asks, spacing)))


# (per minute, asks (ms), lateness, window (ms), what that window may hold)
HOLDS = {
    "a burst of 100, on time": (1200, burst(100), on_time, 1000, 20),
    "a burst of 100, each late by up to the margin": (
        1200,
        burst(100),
        seeded(MARGIN_MS),
        1000,
        20,
    ),
    "a burst, every 21st late by the whole margin": (
        1200,
        burst(100),
        every_nth_late(21, MARGIN_MS),
        1000,
        20,
    ),
    "waves of 30 every 700 ms, late up to the margin": (
        1200,
        waves(300, 30, 700),
        seeded(MARGIN_MS, seed=3),
        1000,
        20,
    ),
    "asks slower than the rate: never held back": (1200, waves(50, 1, 80), seeded(20), 1000, 20),
    "60 a minute in one-second windows: 1 per window": (
        60,
        burst(10),
        seeded(MARGIN_MS),
        1000,
        1,
    ),
    "a one-minute window at 1200/min": (1200, burst(2500), seeded(MARGIN_MS), 60_000, 1200),
    "a two-second window at 600/min": (600, burst(100), every_nth_late(21, MARGIN_MS), 2000, 20),
}


@pytest.mark.parametrize(
    ("per_minute", "asks", "jitter", "window_ms", "most"), HOLDS.values(), ids=HOLDS.keys()
)
def test_no_window_holds_more_than_the_limit(
    per_minute: int, asks: list[float], jitter: Jitter, window_ms: float, most: int
) -> None:
    times = arrivals(asks, pacing.spacing_ms(per_minute), jitter)
    assert pacing.most_in_window(times, window_ms) <= most


# What the margin is for: without it, or with more lateness than it covers, one call late
# and the 20th after it on time put 21 in a second.
BREAKS = {
    "no margin, every 21st late by 10 ms": (60_000 / 1200, every_nth_late(21, 10)),
    "no margin, lateness up to 20 ms": (60_000 / 1200, seeded(20)),
    "the margin, every 21st late by more than it": (
        pacing.spacing_ms(1200),
        every_nth_late(21, MARGIN_MS + 5),
    ),
}


@pytest.mark.parametrize(("spacing", "jitter"), BREAKS.values(), ids=BREAKS.keys())
def test_lateness_beyond_the_margin_breaks_a_window(spacing: float, jitter: Jitter) -> None:
    times = arrivals(burst(100), spacing, jitter)
    assert pacing.most_in_window(times, 1000) == 21


@pytest.mark.parametrize(
    ("asks", "spacing", "expected"),
    [
        ([0, 0, 0], 50, [0, 50, 100]),
        ([0, 200, 210], 50, [0, 200, 250]),  # idle time is not banked: no burst after it
        ([100, 0], 50, [100, 150]),  # turns are given in the order asked
    ],
)
def test_turns_table(asks: list[float], spacing: float, expected: list[float]) -> None:
    assert pacing.turns(asks, spacing) == expected


def test_the_margin_costs_five_percent_of_a_one_second_window() -> None:
    assert pacing.spacing_ms(1200) == pytest.approx(52.5)
    assert pacing.effective_per_minute(1200) == pytest.approx(1142.86, abs=0.01)
    assert pacing.spacing_ms(0) == 0.0
    assert pacing.spacing_ms(60_000, units=500) == pytest.approx(525.0)  # tokens


def test_most_in_window_counts_a_window_as_half_open() -> None:
    assert pacing.most_in_window([0, 500, 1000], 1000) == 2  # the first has left at 1000
    assert pacing.most_in_window([0, 500, 999.9], 1000) == 3
    assert pacing.most_in_window([], 1000) == 0


@pytest.mark.integration
def test_the_lua_books_the_turns_of_the_model(redis_client: redis.Redis) -> None:
    """A burst of asks gets the model's turns from the script, on Redis's clock."""
    limiter = Limiter(redis_client, max_wait_s=60.0)  # every turn admitted, none handed back
    # One a second: a burst to the script even if a loaded machine takes a while between two
    # asks (at 1200/min an ask 23 ms past the previous turn booked from its own clock).
    scope = Scope("provider:p:k", RateLimits(requests_per_minute=60), provider=True)
    state = keys.limit_state(scope.name)
    booked = []
    for i in range(40):
        admission = limiter.admit(f"t{i}", (scope,), 1)
        assert isinstance(admission, Admitted)
        # `rnext` is the turn just given plus one spacing: the turn, read from the script.
        booked.append(float(redis_client.hget(state, "rnext") or 0))
    assert booked[0] > 0
    expected = pacing.turns(burst(40, at_ms=booked[0]), pacing.spacing_ms(60))
    assert booked == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    ("margin_ms", "per_request_ms", "per_token_ms"),
    [(None, 52.5, 1.05), (0, 50.0, 1.0), (100, 55.0, 1.1)],
)
def test_a_scope_paces_with_its_own_margin(
    margin_ms: int | None, per_request_ms: float, per_token_ms: float
) -> None:
    limits = RateLimits(
        requests_per_minute=1200, tokens_per_minute=60_000, jitter_margin_ms=margin_ms
    )
    scope = Scope("provider:p:k", limits, provider=True)
    name, per_request, per_token, concurrency = scope.args()
    assert (name, concurrency) == ("provider:p:k", 0)
    assert per_request == pytest.approx(per_request_ms)
    assert per_token == pytest.approx(per_token_ms)


@pytest.mark.parametrize(
    ("per_minute", "margin_s", "expected"),
    [
        (1200, 0.05, (1050.0, 20)),
        (1000, 0.05, (1050.0, 16)),  # 16.7 a second: 16 whole calls fit in it
        (30, 0.05, (2050.0, 1)),  # fewer than one a second: one call per spacing
        (1200, 0.0, (1000.0, 20)),
        (0, 0.05, (0.0, 0)),
    ],
)
def test_send_window_table(per_minute: int, margin_s: float, expected: tuple[float, int]) -> None:
    assert pacing.send_window(per_minute, margin_s) == expected


@pytest.mark.parametrize(
    ("sends", "now", "expected"),
    [
        ([], 0, 0.0),
        ([0, 100], 500, 0.0),  # room for a third
        ([0, 100, 200], 500, 500.0),  # full until the first leaves at 1000
        ([0, 100, 200], 1000, 0.0),  # the first has just left: a window is (t - 1000, t]
        ([0, 100, 200, 300], 1000, 100.0),  # the second leaves at 1100
    ],
)
def test_send_wait_table(sends: list[float], now: float, expected: float) -> None:
    assert pacing.send_wait_ms(sends, now, 1000, 3) == expected


def sent(turns: list[float], late: Jitter, *, counted: bool) -> list[float]:
    """When each call leaves: its turn plus its lateness, then held by the send log if counted."""
    window_ms, most = pacing.send_window(1200)
    log: list[float] = []
    for i in sorted(range(len(turns)), key=lambda i: turns[i] + late(i)):
        at = turns[i] + late(i)
        if counted:
            at += pacing.send_wait_ms(log, at, window_ms, most)
        log.append(at)
        log.sort()
    return log


def starved(i: int) -> float:
    """A worker starved of CPU for a moment: calls 2 to 7 all leave at 400 ms, together."""
    return 400.0 - pacing.spacing_ms(1200) * i if 2 <= i <= 7 else 0.0


@pytest.mark.parametrize("counted", [True, False], ids=["sends counted", "turns only"])
def test_late_calls_leaving_together_are_held_by_the_send_log(counted: bool) -> None:
    turns = pacing.turns(burst(100), pacing.spacing_ms(1200))
    on_the_wire = seeded(MARGIN_MS / 2)
    leaving = sent(turns, starved, counted=counted)
    arrivals = sorted(at + on_the_wire(i) for i, at in enumerate(leaving))
    most = pacing.most_in_window(arrivals, 1000)
    assert (most <= 20) if counted else (most > 20), most


@pytest.mark.integration
def test_the_lua_counts_sends_as_the_model_does(redis_client: redis.Redis) -> None:
    limiter = Limiter(redis_client)
    limits = RateLimits(requests_per_minute=1200, jitter_margin_ms=0)  # 20 in any 1000 ms
    scope = (Scope("provider:p:k", limits, provider=True),)
    for i in range(20):
        assert limiter.send(f"t{i}", scope) is None
    clock = [int(part) for part in redis_client.execute_command("TIME")]
    now_ms = clock[0] * 1000 + clock[1] // 1000
    held = limiter.send("t20", scope)
    assert held is not None and held.reason == "window"
    sends_key = keys.limit_sends(scope[0].name)
    members = [f"t{i}" for i in range(20)]  # each logged as "holder:ns"
    logged = redis_client.zrange(sends_key, 0, -1)
    assert sorted(str(m).split(":")[0] for m in logged) == sorted(members)
    sends = sorted(float(redis_client.zscore(sends_key, str(m)) or 0) for m in logged)
    assert len(sends) == 20, "a send held back is not logged"
    expected_ms = pacing.send_wait_ms(sends, now_ms, 1000, 20)
    assert abs(held.retry_in_s * 1000 - expected_ms) <= 5
