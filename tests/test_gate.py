"""The gate in front of every model call, against a real Redis: what each path costs.

A provider without `limits:` books nothing, but a 429 any worker sees pauses it for the
whole fleet: its calls check only that pause (one command), folded into the budget's
reservation when the tree has a budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from fleet.errors import ProviderOverloaded
from fleet.limits.backends.redis.budgets import Budgets
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.budget import Budget
from fleet.limits.gate import Gate, Go, Spent, Wait
from fleet.llm.base import LLMResponse, Usage
from fleet.llm.config import FleetConfig, ModelConfig, ProviderConfig, RateLimits
from fleet.models import Trace
from fleet.storage import keys
from fleet.storage.backends.redis.connect import connect

pytestmark = pytest.mark.integration

CONFIG = FleetConfig(
    providers={
        "plain": ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1"),
        "paced": ProviderConfig(
            kind="openai",
            base_url="http://127.0.0.1:9/v1",
            limits=RateLimits(max_concurrency=1),
        ),
    },
    models={
        "plain-fast": ModelConfig(
            provider="plain", name="m", limits=RateLimits(requests_per_minute=6000)
        ),
    },
)
ROOT = "20260101T000000-root01"


def gate_on(client: redis.Redis) -> Gate:
    """A worker's gate: its own Redis client, the shared limiter and budgets."""
    return Gate(CONFIG, {}, Limiter(client), Budgets(client))


def branch(i: int, root: str = ROOT) -> Trace:
    return Trace(trace_id=f"{root}@explore-{i:03d}", root_trace_id=root, task="look")


def answer() -> LLMResponse:
    return LLMResponse("done", usage=Usage(prompt_tokens=100, completion_tokens=20))


@pytest.fixture
def workers(redis_client: redis.Redis, redis_url: str) -> Iterator[tuple[Gate, Gate]]:
    """Two workers' gates, each on its own connection to the same Redis."""
    other = connect(redis_url)
    yield gate_on(redis_client), gate_on(other)
    other.close()


def commands(client: redis.Redis, step: Callable[[], Any]) -> dict[str, int]:
    """The Redis commands `step` ran (from INFO commandstats), by name."""

    def calls() -> dict[str, int]:
        stats = client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    before = calls()
    step()
    after = calls()
    ran = {k: n - before.get(k, 0) for k, n in after.items() if k != "info"}
    return {k: n for k, n in ran.items() if n}


def test_a_provider_without_limits_checks_only_its_pause(
    workers: tuple[Gate, Gate], redis_client: redis.Redis
) -> None:
    gate, _ = workers
    gate.before(branch(0), "plain:m", 300)  # the first call of a tree asks if it has a budget
    verdicts: list[Any] = []
    ran = commands(redis_client, lambda: verdicts.append(gate.before(branch(1), "plain:m", 300)))
    assert ran == {"pttl": 1}
    go = verdicts[0]
    assert isinstance(go, Go) and not go.booked and go.wait_s == 0
    assert commands(redis_client, lambda: gate.after(go, answer(), 200)) == {}
    assert commands(redis_client, lambda: gate.after(go, None, None)) == {}, "nothing to refund"


def test_an_unlimited_provider_sees_a_pause_set_by_another_workers_429(
    workers: tuple[Gate, Gate], redis_client: redis.Redis
) -> None:
    first, second = workers
    go = first.before(branch(1), "plain:m", 300)
    assert isinstance(go, Go)
    busy = ProviderOverloaded("HTTP 429", status=429, retry_after_s=2.0)
    assert first.overloaded(go, busy) == Wait(2.0, "overloaded (429)")
    held = second.before(branch(2), "plain:m", 300)  # another worker, another trace
    assert isinstance(held, Wait) and held.reason == "pause"
    assert 1.0 < held.retry_in_s <= 2.0
    scope = go.scopes[0].name
    assert first.limiter is not None
    assert first.limiter.stats()[f"waited:{scope}"] == 1
    redis_client.delete(keys.limit_pause(scope))  # as if the pause had run out
    assert isinstance(second.before(branch(2), "plain:m", 300), Go)


def test_with_a_budget_the_pause_check_rides_on_the_reservation(
    workers: tuple[Gate, Gate], redis_client: redis.Redis
) -> None:
    gate, other = workers
    assert gate.budgets is not None
    gate.budgets.create(ROOT, Budget(tokens=1_000_000))
    warm = gate.before(branch(0), "plain:m", 300)  # learns the tree has a budget, loads scripts
    assert isinstance(warm, Go)
    gate.after(warm, answer(), 200)
    verdicts: list[Any] = []
    ran = commands(redis_client, lambda: verdicts.append(gate.before(branch(1), "plain:m", 300)))
    assert ran.get("evalsha") == 1 and "pttl" in ran, ran  # the reservation script, once
    go = verdicts[0]
    assert isinstance(go, Go) and go.budget.budgeted and not go.booked
    assert commands(redis_client, lambda: gate.after(go, answer(), 200)).get("evalsha") == 1
    state = gate.budgets.state(ROOT)
    assert state is not None and state.used_tokens == 240
    # Paused by another worker's 429: the call is held back and reserves nothing.
    paused = other.before(branch(7), "plain:m", 300)
    assert isinstance(paused, Go)
    other.overloaded(paused, ProviderOverloaded("HTTP 429", status=429, retry_after_s=5.0))
    held = gate.before(branch(2), "plain:m", 300)
    assert isinstance(held, Wait) and held.reason == "pause" and held.retry_in_s > 4.0
    assert redis_client.hkeys(keys.budget_held(ROOT)) == []


def test_a_run_reads_the_pauses_its_next_call_checks_alone(workers: tuple[Gate, Gate]) -> None:
    gate, _ = workers
    other_root = "20260101T000000-root02"
    assert gate.known_pauses(ROOT) == (), "no model called here yet: nothing to guess"
    assert isinstance(gate.before(branch(0), "plain:m", 300), Go)
    pause = keys.limit_pause(gate.scopes("plain:m")[0].name)
    assert gate.known_pauses(other_root) == (pause,), "a tree new here: every unbooked model's"
    assert gate.pauses_for("plain:m", ROOT) == (pause,)
    assert gate.known_pauses(ROOT) == (pause,)
    # A booked call checks the pause in its admission: nothing for the runner to read.
    assert gate.pauses_for("plain-fast", other_root) == ()
    assert gate.known_pauses(other_root) == (), "what this tree's last call here checked"


def test_a_limit_on_the_provider_or_the_alias_books_and_settles(
    workers: tuple[Gate, Gate], redis_client: redis.Redis
) -> None:
    gate, other = workers
    go = gate.before(branch(1), "paced:m", 300)
    assert isinstance(go, Go) and go.booked
    full = other.before(branch(2), "paced:m", 300)
    assert isinstance(full, Wait) and full.reason == "concurrency"
    gate.after(go, answer(), 200)  # gives the one slot back
    assert isinstance(other.before(branch(2), "paced:m", 300), Go)
    # An alias with limits on a provider without: booked in both scopes, pause included.
    alias = gate.before(branch(3), "plain-fast", 300)
    assert isinstance(alias, Go) and alias.booked and len(alias.scopes) == 2
    gate.overloaded(alias, ProviderOverloaded("HTTP 529", status=529, retry_after_s=3.0))
    held = other.before(branch(4), "plain-fast", 300)
    assert isinstance(held, Wait) and held.reason == "pause"


def test_the_roots_final_turn_survives_a_limit_that_hands_it_back(
    workers: tuple[Gate, Gate],
) -> None:
    gate, other = workers
    assert gate.budgets is not None
    root = "20260101T000000-final1"
    gate.budgets.create(root, Budget(tokens=1000))  # 100 of it set aside for the last turn
    spent = gate.before(branch(1, root), "paced:m", 300)  # books 4096+: the tree is spent
    assert isinstance(spent, Spent)
    busy = other.before(branch(9, "20260101T000000-other1"), "paced:m", 300)
    assert isinstance(busy, Go) and busy.booked  # holds the provider's one slot
    last = Trace(trace_id=root, root_trace_id=root, task="survey")
    held = gate.before(last, "paced:m", 300)
    assert isinstance(held, Wait) and held.reason == "concurrency"
    other.after(busy, answer(), 100)
    again = gate.before(last, "paced:m", 300)  # the set-aside was given back
    assert isinstance(again, Go) and again.budget.final
    gate.after(again, answer(), 100)
    state = gate.budgets.state(root)
    assert state is not None and state.used_tokens == 120 and state.reserved_tokens == 0
    assert isinstance(gate.before(last, "paced:m", 300), Spent), "one final turn only"


@pytest.mark.serial
def test_a_turn_slept_through_a_pause_is_sent_back(
    workers: tuple[Gate, Gate], redis_client: redis.Redis
) -> None:
    """A call admitted for a later turn, then another worker's 429: it does not go."""
    first, second = workers
    waiting = [first.before(branch(i), "plain-fast", 300) for i in range(3)]
    late = waiting[2]
    assert isinstance(late, Go) and late.booked and late.wait_s > 0
    overloaded = waiting[0]
    assert isinstance(overloaded, Go)
    second.overloaded(overloaded, ProviderOverloaded("HTTP 429", status=429, retry_after_s=0.3))
    again = first.sending(late)
    assert isinstance(again, Wait) and again.reason == "pause" and 0.2 < again.retry_in_s <= 0.3


def test_every_booked_call_is_counted_as_it_leaves(
    workers: tuple[Gate, Gate], redis_client: redis.Redis
) -> None:
    gate, _ = workers
    warm = gate.before(branch(0), "plain-fast", 300)
    assert isinstance(warm, Go) and gate.sending(warm) is None  # loads the script
    go = gate.before(branch(1), "plain-fast", 300)
    assert isinstance(go, Go) and go.booked
    ran = commands(redis_client, lambda: gate.sending(go))
    assert ran.get("evalsha") == 1 and "zadd" in ran, ran  # one round trip, the send logged
    scope = go.scopes[1].name  # the alias's limit: 6000/min, 100 sends in a second
    assert redis_client.zcard(keys.limit_sends(scope)) == 2
    unbooked = gate.before(branch(2), "plain:m", 300)
    assert isinstance(unbooked, Go) and not unbooked.booked
    assert commands(redis_client, lambda: gate.sending(unbooked)) == {}, "nothing to count"


def test_a_call_never_sleeps_more_than_a_second_on_its_limits(redis_client: redis.Redis) -> None:
    """Booked ~1 s out and then held by the send log: handed back, not slept on again."""
    config = FleetConfig(
        providers={
            "slow": ProviderConfig(
                kind="openai",
                base_url="http://127.0.0.1:9/v1",
                limits=RateLimits(requests_per_minute=60, jitter_margin_ms=0),
            )
        }
    )
    gate = Gate(config, {}, Limiter(redis_client))
    first = gate.before(branch(1), "slow:m", 300)
    assert isinstance(first, Go) and first.wait_s == 0 and gate.sending(first) is None
    second = gate.before(branch(2), "slow:m", 300)
    assert isinstance(second, Go) and 0.9 < second.wait_s <= 1.0
    # Sent at once (as if its sleep were over already): the window still holds the first.
    held = gate.sending(second)
    assert isinstance(held, Wait) and held.reason == "window" and held.retry_in_s > 0.9


def test_a_call_limited_only_by_concurrency_costs_no_send_check(
    redis_client: redis.Redis,
) -> None:
    gate = gate_on(redis_client)
    go = gate.before(branch(1), "paced:m", 300)
    assert isinstance(go, Go) and go.booked and go.wait_s == 0
    assert commands(redis_client, lambda: gate.sending(go)) == {}
