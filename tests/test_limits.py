"""The fleet-wide limiter and its memory twin, and the rate-limit header parsing.

Every limiter test runs on the memory twin (`fleet.limits.backends.memory.limiter`), the Lua
on fakeredis, and the Lua on a real Redis (integration tier); `Probe` reads what each keeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import fakeredis
import pytest
import redis

from fleet.limits import pacing
from fleet.limits.backends.memory.limiter import MemoryLimiter
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.gate import estimate_tokens
from fleet.limits.protocols import ProviderLimits
from fleet.limits.providers import (
    MAX_PAUSE_S,
    Admitted,
    Refused,
    Scope,
    scopes_for,
)
from fleet.llm.config import FleetConfig, ModelConfig, ProviderConfig, RateLimits
from fleet.llm.ratelimit import Budget, RateSignal, parse_duration_s, rate_signal
from fleet.storage import keys


def scope(name: str = "provider:p:k", **limits: int) -> Scope:
    return Scope(name, RateLimits(**limits), provider=name.startswith("provider:"))


@dataclass(frozen=True)
class Probe:
    """A limiter and a look at what it keeps, the same on Redis and in memory."""

    limiter: ProviderLimits
    has_ticket: Callable[[str], bool]
    pause_left_ms: Callable[[str], int]
    end_pause: Callable[[str], None]
    """As if the scope's pause had run out."""
    seen_at: Callable[[str, str, float], None]
    """When a holder in the scope's line last asked (ms)."""


def redis_probe(client: redis.Redis) -> Probe:
    return Probe(
        Limiter(client),
        lambda holder: client.hget(keys.limit_ticket(holder), "at") is not None,
        lambda name: int(client.pttl(keys.limit_pause(name))),
        lambda name: None if client.delete(keys.limit_pause(name)) else None,
        lambda name, holder, at: None if client.zadd(keys.limit_seen(name), {holder: at}) else None,
    )


def memory_probe() -> Probe:
    limiter = MemoryLimiter()
    state = limiter._state

    def pause_left_ms(name: str) -> int:
        left = state.left_ms([keys.limit_pause(name)])
        return left if left > 0 else -2

    def seen_at(name: str, holder: str, at: float) -> None:
        limiter._seen[name][holder] = at

    return Probe(
        limiter,
        lambda holder: holder in limiter._tickets,
        pause_left_ms,
        lambda name: None if state.pauses.pop(keys.limit_pause(name), None) else None,
        seen_at,
    )


@pytest.fixture(
    params=["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.integration)]
)
def probe(request: pytest.FixtureRequest) -> Probe:
    if request.param == "memory":
        return memory_probe()
    if request.param == "fakeredis":
        return redis_probe(
            fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
        )
    client: redis.Redis = request.getfixturevalue("redis_client")
    client.ping()  # connected (over TLS: handshake done) before a test's clock starts
    return redis_probe(client)


@pytest.fixture
def limiter(probe: Probe) -> ProviderLimits:
    return probe.limiter


@pytest.mark.serial
def test_requests_are_spaced_evenly_at_the_rate(limiter: ProviderLimits) -> None:
    s = (scope(requests_per_minute=600),)  # one every 100 ms
    turns, waits = [], []
    for i in range(5):
        asked_at = time.monotonic()
        admission = limiter.admit(f"t{i}", s, 10)
        assert isinstance(admission, Admitted)
        waits.append(admission.wait_s)
        # When the turn comes, on this clock: a loaded machine may take a while between
        # two asks, and the wait shrinks by that much; the turns stay 100 ms apart.
        turns.append(asked_at + admission.wait_s)
    assert waits[0] == 0
    steps = [b - a for a, b in zip(turns, turns[1:], strict=False)]
    assert all(0.07 <= step <= 0.13 for step in steps), (waits, steps)


def test_a_turn_beyond_the_short_wait_is_booked_and_kept(
    limiter: ProviderLimits, probe: Probe
) -> None:
    s = (scope(requests_per_minute=100),)  # one every 630 ms, margin included
    step_s = pacing.spacing_ms(100) / 1000
    started = time.monotonic()
    assert limiter.admit("first", s, 1) == Admitted(0.0)
    assert isinstance(limiter.admit("second", s, 1), Admitted)  # < 1 s: the longest sleep
    late = limiter.admit("third", s, 1)
    took_s = time.monotonic() - started
    assert isinstance(late, Refused) and late.reason == "rate"
    # Booked 2 steps after the first, told to come back half a second early (counted from
    # when the third asked: however long the three asks took on a loaded machine).
    assert 2 * step_s - 0.5 - took_s - 0.01 <= late.retry_in_s <= 2 * step_s - 0.5
    assert probe.has_ticket("third")
    # A newcomer books after the third's turn: the handed-back trace kept its place.
    newcomer = limiter.admit("fourth", s, 1)
    assert isinstance(newcomer, Refused) and newcomer.retry_in_s > late.retry_in_s
    # The third's second ask takes its booked turn, it does not book another one.
    again = limiter.admit("third", s, 1)
    assert isinstance(again, Refused) and again.retry_in_s <= late.retry_in_s
    assert probe.has_ticket("third")


def test_concurrency_is_first_come_first_served(limiter: ProviderLimits) -> None:
    s = (scope(max_concurrency=2),)
    assert isinstance(limiter.admit("a", s, 1), Admitted)
    assert isinstance(limiter.admit("b", s, 1), Admitted)
    waiting = limiter.admit("c", s, 1)
    assert isinstance(waiting, Refused) and waiting.reason == "concurrency"
    limiter.settle("a", s, 1, 1, 50)
    # A slot is free, but "c" asked first: "d" must queue behind it.
    assert isinstance(limiter.admit("d", s, 1), Refused)
    assert isinstance(limiter.admit("c", s, 1), Admitted)
    limiter.settle("b", s, 1, 1, 50)
    assert isinstance(limiter.admit("d", s, 1), Admitted)


def test_a_trace_that_stopped_asking_leaves_the_line(limiter: ProviderLimits, probe: Probe) -> None:
    s = (scope(max_concurrency=1),)
    assert isinstance(limiter.admit("holder", s, 1), Admitted)
    assert isinstance(limiter.admit("gone", s, 1), Refused)
    limiter.settle("holder", s, 1, 1, 50)
    stale = time.time() * 1000 - keys.LIMIT_LINE_STALE_MS - 1000
    probe.seen_at(s[0].name, "gone", stale)
    assert isinstance(limiter.admit("next", s, 1), Admitted)


def test_a_pause_holds_everyone_back_and_keeps_older_bookings(
    limiter: ProviderLimits, probe: Probe
) -> None:
    # One every 10.5 s: "c"'s turn stays ahead however slowly a loaded machine runs this.
    s = (scope(requests_per_minute=6),)
    limiter.admit("a", s, 1)
    assert isinstance(limiter.admit("b", s, 1), Refused)  # booked at 10.5 s
    later = limiter.admit("c", s, 1)  # booked at 21 s
    assert isinstance(later, Refused)
    paused_at = time.monotonic()
    limiter.overloaded(s, retry_after_s=0.3)
    paused = limiter.admit("d", s, 1)
    took_s = time.monotonic() - paused_at  # a loaded machine may take a while between the two
    assert isinstance(paused, Refused) and paused.reason == "pause"
    assert 0.3 - took_s - 0.01 <= paused.retry_in_s <= 0.3, (paused, took_s)
    wait_until(lambda: probe.pause_left_ms(s[0].name) <= 0)
    # "c" keeps its turn: the pause was over long before it, so it changes nothing for "c"
    # (voided, "c" was booked again behind everyone: 31.5 s out).
    again = limiter.admit("c", s, 1)
    assert isinstance(again, Refused) and again.retry_in_s <= later.retry_in_s
    # A newcomer books after "c" (a step, 10.5 s, less the time between the two asks).
    newcomer = limiter.admit("e", s, 1)
    assert isinstance(newcomer, Refused) and newcomer.retry_in_s > again.retry_in_s + 9
    assert limiter.stats()[f"overloaded:{s[0].name}"] == 1


def test_a_long_pause_moves_the_next_turn_past_its_end(
    limiter: ProviderLimits, probe: Probe
) -> None:
    s = (scope(requests_per_minute=600),)
    assert limiter.admit("a", s, 1) == Admitted(0.0)
    paused_at = time.monotonic()
    limiter.overloaded(s, retry_after_s=3.0)
    probe.end_pause(s[0].name)
    # Nothing goes before the pause would have ended, even a turn booked before it (told to
    # come back half a second early, less however long this took on a loaded machine).
    after = limiter.admit("b", s, 1)
    took_s = time.monotonic() - paused_at
    assert isinstance(after, Refused) and 2.5 - took_s - 0.01 <= after.retry_in_s <= 2.5, (
        after,
        took_s,
    )


def wait_until(done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `done` until it holds (a pause key's TTL running out)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_model_scopes_never_take_a_pause(limiter: ProviderLimits) -> None:
    alias = scope("model:fast", requests_per_minute=6000)
    limiter.overloaded((alias,), retry_after_s=5.0)
    assert isinstance(limiter.admit("a", (alias,), 1), Admitted)


@pytest.mark.serial
def test_tokens_are_booked_ahead_and_settled_with_real_usage(limiter: ProviderLimits) -> None:
    s = (scope(tokens_per_minute=60_000),)  # 1 token per ms, 1.05 with the margin
    started = time.monotonic()
    assert limiter.admit("a", s, 500) == Admitted(0.0)
    second = limiter.admit("b", s, 500)
    took_s = time.monotonic() - started  # the wait shrinks by however long the asks took
    assert isinstance(second, Admitted) and 0.525 - took_s - 0.01 <= second.wait_s <= 0.525
    limiter.settle("a", s, 500, 100, 20)  # "a" used 100: 420 ms handed back
    limiter.settle("b", s, 500, 100, 20)
    third = limiter.admit("c", s, 500)
    assert isinstance(third, Admitted) and third.wait_s <= 0.25


def test_every_scope_must_admit(limiter: ProviderLimits) -> None:
    both = (scope(requests_per_minute=6000), scope("model:m", max_concurrency=1))
    assert isinstance(limiter.admit("a", both, 1), Admitted)
    assert isinstance(limiter.admit("b", both, 1), Refused)


def test_exhausted_headers_pause_the_provider(limiter: ProviderLimits) -> None:
    s = (scope(),)
    signal = RateSignal(requests=Budget(limit=100, remaining=0, reset_s=20.0))
    observed_at = time.monotonic()
    limiter.observe(s, signal)
    paused = limiter.admit("a", s, 1)
    took_s = time.monotonic() - observed_at
    assert isinstance(paused, Refused) and paused.reason == "pause"
    # one request back: 20 s / 100, less however long the two calls took
    assert 0.2 - took_s - 0.01 <= paused.retry_in_s <= 0.2, (paused, took_s)


def test_scopes_name_provider_key_by_digest_and_alias() -> None:
    config = FleetConfig(
        providers={
            "local": ProviderConfig(
                kind="openai",
                base_url="http://x/v1",
                api_key_env="K",
                limits=RateLimits(requests_per_minute=60),
            )
        },
        models={
            "fast": ModelConfig(provider="local", name="m", limits=RateLimits(max_concurrency=2))
        },
    )
    scopes = scopes_for(config, "fast", {"K": "sk-secret"})
    assert [s.provider for s in scopes] == [True, False]
    assert scopes[0].name.startswith("provider:local:") and "sk-secret" not in scopes[0].name
    assert scopes[1].name == "model:fast"
    other_key = scopes_for(config, "fast", {"K": "sk-other"})[0].name
    assert other_key != scopes[0].name
    assert scopes_for(config, "scripted:x.yaml", {}) == ()


def test_estimate_books_input_and_the_longest_answer() -> None:
    assert estimate_tokens(3000, 500) == 1500


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("120ms", 0.12), ("1h2m3.5s", 3723.5), ("2", 2.0), ("x", None)],
)
def test_reset_durations(text: str, seconds: float | None) -> None:
    assert parse_duration_s(text) == seconds


def test_openai_and_anthropic_headers() -> None:
    openai = rate_signal(
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "30s",
            "x-ratelimit-remaining-tokens": "900",
        },
        now_s=0,
    )
    assert openai.requests == Budget(60, 0, 30.0)
    assert openai.tokens.remaining == 900
    assert openai.pause_s() == 0.5
    anthropic = rate_signal(
        {
            "anthropic-ratelimit-requests-remaining": "3",
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": "1970-01-01T00:00:10Z",
        },
        now_s=4.0,
    )
    assert anthropic.tokens == Budget(None, 0, 6.0)
    assert anthropic.pause_s() == 6.0
    assert rate_signal({"content-type": "application/json"}, now_s=0).empty


def test_an_overload_is_handed_back_at_once_when_the_fleet_limits() -> None:
    import httpx

    from fleet.errors import ProviderOverloaded
    from fleet.llm.retry import RetryPolicy, send_with_retry

    slept: list[float] = []
    policy = RetryPolicy(sleep=slept.append, hand_back_overload=True)
    busy = httpx.Response(529, headers={"retry-after-ms": "1500"}, json={"error": {}})
    with pytest.raises(ProviderOverloaded) as caught:
        send_with_retry(lambda: busy, provider="p", api_key_env="K", policy=policy)
    assert caught.value.status == 529 and caught.value.retry_after_s == 1.5
    assert slept == [], "no thread sleeps on an overload"


def test_fleet_metrics_show_admissions_waits_overloads_and_budget_stops(
    redis_db: redis.Redis,
) -> None:
    from fleet.limits.backends.redis.budgets import Budgets
    from fleet.limits.budget import Budget
    from fleetops.metrics import limit_families, render

    limiter = Limiter(redis_db)  # `fleet metrics` reads the fleet's Redis
    s = (scope(max_concurrency=1),)
    limiter.admit("a", s, 1)
    limiter.admit("b", s, 1)
    limiter.overloaded(s, retry_after_s=0.5)
    budgets = Budgets(redis_db)
    budgets.create("root", Budget(tokens=10))
    budgets.reserve("x", "root", 100, 0.0)
    text = render(limit_families(redis_db))
    name = s[0].name
    assert f'fleet_limit_admissions_total{{scope="{name}"}} 1' in text
    assert f'fleet_limit_waits_total{{scope="{name}"}} 1' in text
    assert f'fleet_provider_overloads_total{{scope="{name}"}} 1' in text
    assert 'fleet_budget_exhaustions_total{reason="tokens"} 1' in text


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "inf"},
        {"retry-after": "nan"},
        {"retry-after": "1e300"},
        {"retry-after-ms": "1e309"},
        {"retry-after": "86400"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1e309"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "9999h"},
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
        },
    ],
)
def test_a_hostile_429_pauses_the_fleet_at_most_a_minute(
    limiter: ProviderLimits, probe: Probe, headers: dict[str, str]
) -> None:
    """A provider (or a proxy in front of it) may say anything: no day-long pause, no crash."""
    from fleet.llm.retry import overload_wait_s

    s = (scope(requests_per_minute=600),)
    asked_s = overload_wait_s(headers, now_s=time.time())
    waited_s = limiter.overloaded(s, asked_s)
    assert 0 < waited_s <= MAX_PAUSE_S
    left_ms = probe.pause_left_ms(s[0].name)
    assert 0 < left_ms <= MAX_PAUSE_S * 1000
    signal = rate_signal(headers, now_s=time.time())
    limiter.observe(s, signal)  # the same headers on a 200
    assert probe.pause_left_ms(s[0].name) <= MAX_PAUSE_S * 1000
