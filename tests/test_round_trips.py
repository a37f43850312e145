"""What a branch costs the store in round trips, and the usage `fleet metrics` counts.

In one process against a real Redis, the runner as a worker runs it: a provider without
`limits:` has its pause read by the run's own store round trips (no `PTTL` of its own), yet
still holds back for a pause another worker set; the fleet-wide usage is counted once per
run, and a run killed midway leaves its calls to the next run of the trace to count.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection, Connection

from fleet.conversation.roots import TaskSpec, create_root
from fleet.limits.backends.redis.budgets import Budgets
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.gate import Gate
from fleet.llm.base import LLMResponse
from fleet.llm.config import FleetConfig, ProviderConfig
from fleet.loop.runner import Runner
from fleet.runtime import Runtime, SpawnRequest
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis.connect import connect
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, call, text
from fleetops.metrics import usage_families
from tests.fleetkit import RecordingDispatcher

pytestmark = pytest.mark.integration

MODEL = "plain:m"
CONFIG = FleetConfig(
    providers={"plain": ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1")}
)


class Killed(BaseException):
    """The worker dies here: nothing after it runs (not even the runner's handlers)."""


def turns(messages: list[dict[str, Any]]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def explorer(branches: int, on_call: Callable[[str, int], None] = lambda task, n: None) -> Any:
    """Main agent explores; each branch lists the directory, then answers."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        on_call(task, turns(messages))
        if task.startswith("branch"):
            return call("list_dir", path=".") if turns(messages) == 0 else text(f"found: {task}")
        if turns(messages) == 0:
            return call("agent", task=[f"branch {i}" for i in range(branches)])
        return text("summary")

    return ScriptedModel(function=respond)


def worker_runtime(
    store: RedisStore, tmp_path: Path, model: Any, lease_ttl_ms: int = keys.LEASE_TTL_MS
) -> tuple[Runtime, RecordingDispatcher]:
    """A worker's runtime whose model goes through provider `plain` (no `limits:`)."""
    recorder = RecordingDispatcher()
    settings = Settings(workspace=tmp_path, env={}, lease_ttl_ms=lease_ttl_ms)
    runtime = Runtime.build(settings, store, recorder)
    gate = Gate(CONFIG, {}, Limiter(store.client), Budgets(store.client))
    return replace(runtime, config=CONFIG, gate=gate, clients={MODEL: model}), recorder


@pytest.fixture
def meter() -> Iterator[Counter[int]]:
    """Round trips the fleet asked for (a pipeline is one), by the thread that made them.

    Not counted: redis-py's upkeep of its connections, the handshake of a new one (HELLO,
    PING, CLIENT SETINFO ...: 5 commands) and the PING of one idle past the health-check
    interval. How many connections the pool opens depends on what the other threads (the
    lease keeper, the call watcher) hold at that instant: under load a run met a new one
    and counted 10 instead of 5, 8 instead of 3.
    """
    trips: Counter[int] = Counter()
    upkeep = threading.local()
    send: Callable[..., None] = Connection.send_packed_command
    handshake, health = AbstractConnection.connect_check_health, AbstractConnection.check_health

    def counting(self: Connection, command: Any, check_health: bool = True) -> None:
        if not getattr(upkeep, "busy", False):
            trips[threading.get_ident()] += 1
        send(self, command, check_health)

    def uncounted(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            upkeep.busy, was = True, getattr(upkeep, "busy", False)
            try:
                return method(self, *args, **kwargs)
            finally:
                upkeep.busy = was

        return call

    Connection.send_packed_command = counting  # type: ignore[method-assign,assignment]
    AbstractConnection.connect_check_health = uncounted(handshake)  # type: ignore[method-assign]
    AbstractConnection.check_health = uncounted(health)  # type: ignore[method-assign]
    yield trips
    Connection.send_packed_command = send  # type: ignore[method-assign]
    AbstractConnection.connect_check_health = handshake  # type: ignore[method-assign]
    AbstractConnection.check_health = health  # type: ignore[method-assign]


def commands(client: redis.Redis) -> Counter[str]:
    stats = client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def spawned(runtime: Runtime, recorder: RecordingDispatcher, branches: int) -> SpawnRequest:
    root = create_root(runtime, TaskSpec("survey", MODEL, mode="main"))
    assert Runner(runtime).run(root.trace_id).outcome == "waiting"
    (request,) = recorder.requests
    assert len(request.child_ids) == branches
    return request


def test_a_branch_on_a_provider_without_limits_makes_three_round_trips(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int]
) -> None:
    store = RedisStore(redis_client)
    # No lease renewed meanwhile: the server's counts below are the runs' own (a loaded
    # machine had a run outlast a heartbeat's interval: one EVALSHA more, the renewal's).
    runtime, recorder = worker_runtime(store, tmp_path, explorer(6), lease_ttl_ms=600_000)
    request = spawned(runtime, recorder, 6)
    runner, me = Runner(runtime), threading.get_ident()
    before, trips = commands(redis_client), []
    for child in request.child_ids:
        meter[me] = 0
        assert runner.run(child).outcome == "completed"
        trips.append(meter[me])
    ran = commands(redis_client) - before
    # begin_run, the first turn with its tool's result, the last turn with the finish: each
    # reads the provider's pause for the call after it; the root's run had learnt the model.
    assert trips == [3] * 6
    assert ran["pttl"] == 6 * 2, "two calls per branch, each pause read inside a script"
    assert ran["evalsha"] == 6 * 3 and ran["hincrby"] == 6 * 2, "usage counted once per run"


def test_a_worker_that_never_called_the_model_checks_its_pause_once(
    redis_client: redis.Redis, tmp_path: Path, meter: Counter[int]
) -> None:
    store = RedisStore(redis_client)
    runtime, recorder = worker_runtime(store, tmp_path, explorer(1))
    (child,) = spawned(runtime, recorder, 1).child_ids
    fresh, _ = worker_runtime(store, tmp_path, explorer(1))  # another process: knows no model
    me = threading.get_ident()
    meter[me] = 0
    assert Runner(fresh).run(child).outcome == "completed"
    # begin_run could not know the model: its first call checks the pause on its own (PTTL);
    # whether the tree has a budget came with begin_run; the write before the next call
    # reads the pause.
    assert meter[me] == 3 + 1


def test_an_unlimited_provider_holds_back_for_a_pause_another_worker_set(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(redis_client)
    other = connect(redis_url)
    elsewhere = Limiter(other)
    alone: list[str] = []
    paused = Limiter.paused

    def checked_alone(self: Limiter, scopes: Any) -> Any:
        alone.append(scopes[0].name)
        return paused(self, scopes)

    monkeypatch.setattr(Limiter, "paused", checked_alone)

    def overloaded_elsewhere(task: str, made: int) -> None:
        """While branch 0 makes its first call, another worker's call gets a 429."""
        if task == "branch 0" and made == 0:
            elsewhere.overloaded(runtime.gate.scopes(MODEL), retry_after_s=30.0)

    runtime, recorder = worker_runtime(store, tmp_path, explorer(2, overloaded_elsewhere))
    request = spawned(runtime, recorder, 2)
    first, second = request.child_ids
    alone.clear()  # the root's first call: this process did not know the model yet
    # The pause came during the call: the write of its tool result read it for the next.
    held = Runner(runtime).run(first)
    assert held.outcome == "throttled" and 25.0 < held.retry_in_s <= 30.0
    assert store.get_trace(first).stats.messages == 1
    # A run that starts later reads it with its lease.
    again = Runner(runtime).run(second)
    assert again.outcome == "throttled" and 25.0 < again.retry_in_s <= 30.0
    assert store.get_trace(second).stats.messages == 0, "no call was made"
    assert alone == [], "both pauses were read by the runs' own round trips"
    scope = runtime.gate.scopes(MODEL)[0].name
    assert elsewhere.stats()[f"waited:{scope}"] == 2
    other.delete(keys.limit_pause(scope))  # the pause ran out
    assert Runner(runtime).run(first).outcome == "completed"
    assert Runner(runtime).run(second).outcome == "completed"
    assert alone == []
    other.close()


def usage(client: redis.Redis) -> dict[str, float]:
    tokens, _ = usage_families(client)
    return {dict(labels)["kind"]: value for labels, value in tokens.samples.items()}


def test_a_run_killed_midway_counts_every_call_once_when_resumed(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = RedisStore(redis_client)
    dies = [True]

    def killed_in_the_last_call(task: str, made: int) -> None:
        if task == "branch 0" and made == 1 and dies:
            dies.clear()
            raise Killed

    runtime, recorder = worker_runtime(store, tmp_path, explorer(1, killed_in_the_last_call))
    request = spawned(runtime, recorder, 1)
    (child,) = request.child_ids
    counted_root = usage(redis_client)  # the root's first run ended waiting: counted
    with pytest.raises(Killed):
        Runner(runtime).run(child)
    assert usage(redis_client) == counted_root, "the dead run's call waits in its trace"
    redis_client.delete(keys.lease(child))  # its lease lapses; the sweeper re-sends it
    assert Runner(runtime).run(child).outcome == "completed"
    assert Runner(runtime).run(child).outcome == "completed", "a late duplicate counts nothing"
    traces = [store.get_trace(request.root_trace_id), store.get_trace(child)]
    assert store.get_trace(child).stats.messages == 2
    assert usage(redis_client) == {
        "prompt": sum(t.stats.prompt_tokens for t in traces),
        "completion": sum(t.stats.completion_tokens for t in traces),
    }
    assert not redis_client.hexists(keys.trace(child), "uncounted")


def test_a_root_run_reads_the_experiences_version_with_its_lease(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, meter: Counter[int]
) -> None:
    """`default` shows experiences: begin_run reads their version, and the cache follows it."""
    from fleet.experiences.backends.redis import RedisExperiences
    from fleet.experiences.model import new_experience

    seen: list[tuple[int, str]] = []
    me = threading.get_ident()

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        seen.append((meter[me], str(messages[0]["content"])))
        return text("done")

    store = RedisStore(redis_client)
    runtime, _ = worker_runtime(store, tmp_path, ScriptedModel(function=respond))
    for task in ("warm up", "fix the parser"):
        root = create_root(runtime, TaskSpec(task, MODEL))
        meter[me] = 0
        assert Runner(runtime).run(root.trace_id).outcome == "completed"
    assert seen[-1][0] == 1, "begin_run alone before the model call"
    other = connect(redis_url)  # another process approves a rule
    RedisExperiences(other).put(
        new_experience("agent:default", "when the parser breaks", "read the grammar", approved=True)
    )
    root = create_root(runtime, TaskSpec("fix the parser", MODEL))
    meter[me] = 0
    assert Runner(runtime).run(root.trace_id).outcome == "completed"
    assert "read the grammar" in seen[-1][1], "the new version was read with the lease"
    assert seen[-1][0] == 1 + 3, "begin_run; the hash read anew, the rule's counts, its use"
    other.close()
