"""A limit at exactly the provider's rate, and what one 429 costs, on Redis and in memory.

The in-process fleet (explore branches in threads, the Redis store and limiter or the
memory store and its limiter, the real OpenAI client) against tests/fake_provider.py: a
server that allows exactly N requests in any rolling second. bench/limits_bench.py
(`--only exact`) runs the same through real workers at the issue's size.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

import fleet.llm.base
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.limits.pacing import JITTER_MARGIN_S
from fleet.llm.openai import OpenAIClient
from fleet.models import Trace
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.testing import Script
from tests.fake_provider import RateLimitedProvider, RollingWindow
from tests.fleetkit import explore_script

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("loopback_requests"),
]

THREADS = 64
"""Branch threads: enough that the limiter's line runs seconds ahead of the clock."""
RACE_S = 0.15
"""How long after a 429 calls already past their last check may still reach the provider:
the answer's way back and the pause's write, on a loaded machine (0.11 s was seen with two
busy loops beside the suite on 2 cores). A pause that did not hold shows calls every 50 ms
(20/s) between this and 0.29 s."""


def brain(tmp: Path, branches: int, branch_turns: int) -> Script:
    model = explore_script(tmp / f"brain-{branches}.yaml", branches, branch_turns=branch_turns)
    path = model.removeprefix("scripted:")
    return Script.parse(yaml.safe_load(Path(path).read_text()), path)


@contextlib.contextmanager
def local_fleet(
    store: TraceStore, tmp: Path, url: str, per_minute: int
) -> Iterator[InProcessFleet]:
    """An in-process fleet whose provider `exact` is limited to `per_minute` in fleet.yaml."""
    limits = {"requests_per_minute": per_minute}
    provider = {"kind": "openai", "base_url": f"{url}/v1", "limits": limits}
    config = tmp / "fleet.yaml"
    config.write_text(yaml.safe_dump({"providers": {"exact": provider}}))
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    settings = Settings(workspace=workspace, config_path=config)
    local = InProcessFleet.from_settings(
        settings, store=store, dispatcher=InProcessDispatcher(THREADS)
    )
    try:
        yield local
    finally:
        for client in local.runtime.clients.values():
            if isinstance(client, OpenAIClient):
                client.close()


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> TraceStore:
    """The limiter of each store: the Lua on a real Redis, and its memory twin."""
    if request.param == "memory":
        return MemoryStore()
    client: redis.Redis = request.getfixturevalue("redis_client")
    return RedisStore(client)


@pytest.fixture
def loopback_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider is tests/fake_provider.py on 127.0.0.1: let the real client reach it."""
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)


def elapsed_s(trace: Trace) -> float:
    assert trace.finished_at_ms is not None
    return (trace.finished_at_ms - trace.created_at_ms) / 1000


class Lateness:
    """How late a thread of this process wakes from a short sleep, at worst, while it runs.

    The limiter's margin (`JITTER_MARGIN_S`) covers a call sent up to that much after its
    turn (docs/limits.md); a machine whose threads wake later than that breaks the premise
    of the 1 % promise, not the limiter.
    """

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            asleep = time.monotonic()
            time.sleep(0.005)
            self.worst_s = max(self.worst_s, time.monotonic() - asleep - 0.005)

    def __enter__(self) -> Lateness:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


# Arrival jitter from other processes' CPU reads as bursts to the server. `in_process`: the
# fleet, the limiter and the fake provider all run in this process (at most one core).
@pytest.mark.serial
@pytest.mark.in_process
def test_a_limit_at_the_providers_exact_rate_gets_at_most_1_percent_429s(
    store: TraceStore, tmp_path: Path
) -> None:
    """150 branches x 2 calls at 60 requests in any rolling second: 302 calls, ~5 s."""
    rate, branches = 60, 150
    script = brain(tmp_path, branches, branch_turns=1)
    with RateLimitedProvider(script, requests_per_s=rate, window="rolling") as server:
        with local_fleet(store, tmp_path, server.url, rate * 60) as local, Lateness() as late:
            trace = local.run("survey", model="exact:m")
        stats = server.stats
    assert trace.status == "completed", trace.error
    assert stats.answered == 2 * branches + 2
    bound_s = stats.answered / rate
    print(
        f"{stats.refused} 429s of {stats.answered}, {elapsed_s(trace):.1f} s, bound {bound_s} s;"
        f" threads woke up to {late.worst_s * 1000:.0f} ms late"
    )
    # The promise holds where calls leave within the margin of their turn. A thread's wake is
    # only part of a call's lateness (the request is built and written after it): on a
    # machine whose threads wake more than half the margin late (seen: 1.3 % refused with
    # wakes 44 ms late, 3.8 % at load 15-20) the limiter must still hold most calls back
    # (64-67 % are refused without it: docs/limits.md).
    most = 0.01 if late.worst_s <= JITTER_MARGIN_S / 2 else 0.10
    assert stats.refused_share <= most, f"{stats.refused} of {stats.answered} refused"
    assert elapsed_s(trace) <= 1.25 * bound_s + 3.0


@pytest.mark.serial
@pytest.mark.in_process
def test_a_429_with_retry_after_0_3_s_pauses_the_fleet_0_3_s(
    store: TraceStore, tmp_path: Path
) -> None:
    """One 429 (retry-after: 0.300) mid-run: the fleet pauses ~0.3 s, not seconds.

    60 branch threads book 3 s ahead of the clock at 20/s (still 1.5 s at the 429); voiding
    those bookings on the 429 (what the limiter did) idled the provider for that long.
    Calls already on their way while the 429 travels back are not held (`RACE_S`); none may
    leave after that until the pause ends, and the next one leaves as it ends.
    """
    script = brain(tmp_path, 60, branch_turns=0)
    with RateLimitedProvider(script, window="rolling") as server:
        server.refuse_once(after_answered=30, retry_after_s=0.3)
        with local_fleet(store, tmp_path, server.url, 1200) as local, Lateness() as late:
            trace = local.run("survey", model="exact:m")
        log = list(server.stats.arrivals)
    assert trace.status == "completed", trace.error
    refused = [at for at, answered in log if not answered]
    assert len(refused) == 1
    times = [at - refused[0] for at, _ in log]
    # A thread that woke late (another process had the core) sends that much later: the
    # bounds stretch by the worst wake this process saw, never below the quiet ones.
    race_s = RACE_S + late.worst_s
    inside = [round(t, 3) for t in times if race_s < t < 0.29]
    resumed_s = min(t for t in times if t >= 0.29)
    longest_s = max(b - a for a, b in zip(times, times[1:], strict=False))
    print(
        f"{inside=}; resumed after {resumed_s:.3f} s; longest silence {longest_s:.3f} s;"
        f" threads woke up to {late.worst_s * 1000:.0f} ms late"
    )
    assert not inside, "the pause is what the provider asked for"
    assert resumed_s <= 0.3 + 0.15 + late.worst_s, "and not longer (voided bookings: ~1.5 s)"
    if late.worst_s <= JITTER_MARGIN_S / 2:  # else a starved process idles the provider itself
        assert longest_s <= 0.3 + 0.15


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_the_fake_providers_window_is_exact_and_says_when_it_has_room() -> None:
    """The server the tests above trust: N in any rolling second, the N + 1th refused."""
    clock = Clock()
    window = RollingWindow(3, 1.0, clock)
    for at_s in (0.0, 0.2, 0.5):
        clock.now_s = 100.0 + at_s
        assert window.take(1) == 0.0
    clock.now_s = 100.9
    assert window.take(1) == pytest.approx(0.1)  # the first leaves at 101.0
    clock.now_s = 101.0
    assert window.take(1) == 0.0, "a window is (t - 1 s, t]: the first has left"
    assert window.take(1) == pytest.approx(0.2)  # refused asks are not counted
    assert window.take(2) == pytest.approx(0.5)  # two must leave for two more
