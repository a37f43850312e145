"""Provider batches in one process: the queue's moves, both wires, a trace parked and resumed.

The queue runs on every backend (memory, fakeredis, a real Redis); the providers talk to
local fakes of OpenAI's Batch API and Anthropic's Message Batches (tests/fake_batch.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import fleet.llm.base
from fleet.batchapi.lines import Outcome, read_outcomes
from fleet.batchapi.poller import poll_once
from fleet.batchapi.providers import (
    AnthropicBatch,
    OpenAIBatch,
    _openai_outcome,
    check_batch_api,
    provider_for,
)
from fleet.batchapi.route import custom_id_of
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ConfigError, ModelBehaviorError
from fleet.inprocess import InProcessDispatcher
from fleet.lifecycle import stop_subtree
from fleet.llm.config import FleetConfig, resolve_target
from fleet.loop.runner import Runner
from fleet.models import Trace, now_ms
from fleet.runstate import BatchWait, RunState
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.batch_calls import MemoryBatchCalls
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.batch_calls import (
    BatchCalls,
    Flush,
    PendingCall,
    RedisBatchCalls,
    batch_calls,
)
from fleet.storage.store import TraceStore
from fleet.testing import Script
from tests.conftest import fake_redis
from tests.fake_batch import USAGE, AnthropicBatchServer, BatchServer, OpenAIBatchServer
from tests.fleetkit import wait_until

PRICE_IN, PRICE_OUT = 2.0, 8.0
"""USD per million tokens of the fake model, live."""
LIVE_CALL_USD = (USAGE[0] * PRICE_IN + USAGE[1] * PRICE_OUT) / 1e6

SCRIPT = Script.parse(
    {
        "scripts": [
            {
                "match": ".*",
                "steps": [
                    {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
                    {"content": "done: {task}"},
                ],
            }
        ]
    },
    "<test>",
)


def parked_id(trace: Trace) -> str:
    """The custom id of the call the trace parked (its `run.waiting_on_batch`)."""
    parked = trace.run.waiting_on_batch
    assert parked is not None and parked.custom_id is not None, trace.run
    return parked.custom_id


@pytest.fixture(autouse=False)
def allow_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only


@pytest.fixture(
    params=["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.integration)]
)
def queue(request: pytest.FixtureRequest) -> BatchCalls:
    if request.param == "memory":
        return MemoryBatchCalls()
    if request.param == "fakeredis":
        return RedisBatchCalls(fake_redis())
    return RedisBatchCalls(request.getfixturevalue("redis_client"))


def pending(custom_id: str, at_ms: int = 1) -> PendingCall:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": []}
    return PendingCall(
        custom_id=custom_id,
        trace_id="t1",
        root_trace_id="t1",
        model_name="m",
        body=body,
        queued_at_ms=at_ms,
    )


# -- the queue ----------------------------------------------------------------------


def test_a_call_is_queued_once_and_moves_through_a_flush(queue: BatchCalls) -> None:
    assert queue.enqueue(pending("fc1", 5))
    assert not queue.enqueue(pending("fc1", 6))  # a redelivered run queues nothing new
    assert queue.enqueue(pending("fc2", 7))
    assert queue.queued(10) == [("fc1", 5), ("fc2", 7)]
    flush = Flush(flush_id="f1", model_name="m", custom_ids=["fc1", "fc2"], at_ms=9)
    assert queue.begin_flush(flush) == ["fc1", "fc2"]
    assert queue.begin_flush(flush) == []  # moved already: a second flush takes nothing
    assert queue.queued(10) == []
    assert [f.flush_id for f in queue.submitting()] == ["f1"]
    queue.submitted(flush.model_copy(update={"batch_id": "b1", "wire_ids": ["fc1-1", "fc2-1"]}))
    assert queue.submitting() == []
    assert [f.batch_id for f in queue.in_flight()] == ["b1"]
    statuses = queue.statuses(["fc1", "fc2"])
    assert [(s.state, s.batch_id) for s in statuses if s] == [("submitted", "b1")] * 2
    assert queue.answer("fc1", {"content": "x"})
    assert not queue.answer("fc1", {"content": "y"})  # answered once
    assert queue.answer_of("fc1") == {"content": "x"}


def test_a_requeued_call_gets_a_new_attempt_and_a_cancelled_one_no_answer(
    queue: BatchCalls,
) -> None:
    queue.enqueue(pending("fc1"))
    queue.enqueue(pending("fc2"))
    queue.begin_flush(Flush(flush_id="f", model_name="m", custom_ids=["fc1", "fc2"], at_ms=1))
    queue.requeue(["fc1"], 50)
    (status,) = queue.statuses(["fc1"])
    assert status is not None and status.state == "queued" and status.attempt == 2
    assert queue.queued(10) == [("fc1", 50)]
    assert queue.cancel("fc2") == "cancelled"  # in a flush: its answer will be ignored
    assert not queue.answer("fc2", {"content": "late"})
    assert queue.cancel("fc1") == "dropped"  # queued: it simply leaves
    assert queue.calls(["fc1"]) == [None] and queue.queued(10) == []
    assert queue.cancel("nope") == "gone"


def test_the_poll_claim_is_one_holders() -> None:
    queue = RedisBatchCalls(fake_redis())
    assert queue.claim("fleet:batch:poll", "a", 10_000)
    assert not queue.claim("fleet:batch:poll", "b", 10_000)
    queue.unclaim("fleet:batch:poll", "b")  # not b's to give back
    assert not queue.claim("fleet:batch:poll", "b", 10_000)
    queue.unclaim("fleet:batch:poll", "a")
    assert queue.claim("fleet:batch:poll", "b", 10_000)


def test_custom_ids_are_the_turn_and_fit_both_providers() -> None:
    long_id = "root@explore-001-20261126021500-001@delegate-20261126021501-001" * 2
    first = custom_id_of(long_id, 7)
    assert first == custom_id_of(long_id, 7) != custom_id_of(long_id, 8)
    assert len(first) + len("-99") <= 64 and first.replace("-", "").isalnum()


# -- the two wires --------------------------------------------------------------------


def target(server: BatchServer, kind: str) -> Any:
    base = f"{server.url}/v1" if kind == "openai" else server.url
    config = {
        "providers": {"p": {"kind": kind, "base_url": base, "batch_api": True}},
        "models": {
            "m": {
                "provider": "p",
                "name": "fake-model",
                "input_usd_per_mtok": PRICE_IN,
                "output_usd_per_mtok": PRICE_OUT,
            }
        },
    }
    return resolve_target(load_config_from(config), "m")


def load_config_from(data: dict[str, Any]) -> FleetConfig:
    return FleetConfig.model_validate(data)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_batch_goes_up_and_its_answers_come_back_at_half_price(
    kind: str, allow_requests: None
) -> None:
    server_type = OpenAIBatchServer if kind == "openai" else AnthropicBatchServer
    with server_type(SCRIPT, delay_s=0.2) as server:
        tgt = target(server, kind)
        provider = (
            OpenAIBatch(tgt, "sk-test", {}) if kind == "openai" else AnthropicBatch(tgt, "", {})
        )
        body = {"messages": [{"role": "user", "content": "look"}], "tools": [], "temperature": 0.2}
        batch_id = provider.submit([("fc1-1", provider.request(body))], "flush-1")
        assert provider.phase(batch_id) == "running"
        wait_until(lambda: provider.phase(batch_id) == "ended", 5, "the batch to end")
        results = provider.results(batch_id, {"fc1-1"})
        assert set(results) == {"fc1-1"} and results["fc1-1"].body is not None
        response = provider.parse(results["fc1-1"].body)
        assert [c.name for c in response.tool_calls] == ["list_dir"]
        assert response.usage.cost_usd == pytest.approx(LIVE_CALL_USD / 2)
        assert server.sent == ["fc1-1"] and server.live_calls == 0
        provider.close()


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_lost_flush_is_found_again_by_its_tag(kind: str, allow_requests: None) -> None:
    server_type = OpenAIBatchServer if kind == "openai" else AnthropicBatchServer
    with server_type(SCRIPT) as server:
        tgt = target(server, kind)
        provider = OpenAIBatch(tgt, "", {}) if kind == "openai" else AnthropicBatch(tgt, "", {})
        body = {"messages": [{"role": "user", "content": "look"}], "tools": []}
        batch_id = provider.submit([("fc1-1", provider.request(body))], "flush-9")
        assert provider.find("flush-9", now_ms(), 1) == batch_id
        if kind == "openai":  # a tag, exactly
            assert provider.find("flush-other", now_ms(), 1) is None
        assert provider.find("flush-9", now_ms() - 3_600_000, 1) in (None, batch_id)
        provider.close()


def test_hostile_result_lines_are_skipped_not_trusted() -> None:
    text = "\n".join(
        [
            "not json",
            json.dumps(["a", "list"]),
            json.dumps({"custom_id": 7}),
            json.dumps({"custom_id": "fc1-1", "response": {"status_code": 200, "body": "x"}}),
            json.dumps({"custom_id": "fc2-1", "response": {"status_code": 200, "body": {}}}),
            json.dumps({"custom_id": "fc9-1", "response": {"status_code": 200, "body": {}}}),
        ]
    )
    found: dict[str, Outcome] = {}
    counts = read_outcomes([text.encode()], {"fc1-1", "fc2-1"}, _openai_outcome, found)
    assert found["fc1-1"].error is not None and found["fc2-1"].body == {}
    assert (counts.foreign, counts.unreadable) == (1, 3)


def test_an_answer_without_choices_is_an_error_not_a_crash(allow_requests: None) -> None:
    with OpenAIBatchServer(SCRIPT) as server:
        provider = OpenAIBatch(target(server, "openai"), "", {})
        with pytest.raises(ModelBehaviorError):
            provider.parse({"choices": "nope"})
        provider.close()


def test_a_provider_without_a_batch_api_is_refused_in_one_line() -> None:
    config = load_config_from(
        {
            "providers": {"local": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
            "models": {"m": {"provider": "local", "name": "x"}},
        }
    )
    with pytest.raises(ConfigError) as caught:
        check_batch_api(config, "m")
    assert "no batch API" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError):
        check_batch_api(config, "scripted:whatever.yaml")


def test_the_key_never_shows_in_a_provider_error(allow_requests: None) -> None:
    with OpenAIBatchServer(SCRIPT) as server:
        provider = OpenAIBatch(target(server, "openai"), "sk-secret-0123456789abcdef", {})
        with pytest.raises(Exception) as caught:
            provider.phase("batch_missing")
        provider.close()
        assert "sk-secret" not in str(caught.value)


# -- a trace parked and resumed ----------------------------------------------------


@pytest.fixture
def served(allow_requests: None) -> Iterator[OpenAIBatchServer]:
    with OpenAIBatchServer(SCRIPT, delay_s=0.05) as server:
        yield server


def runtime_for(
    store: TraceStore, server: BatchServer, tmp: Path, kind: str = "openai", **settings: Any
) -> Runtime:
    workspace = tmp / "ws"
    workspace.mkdir(exist_ok=True)
    config = tmp / "fleet.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "providers": {
                    "p": {
                        "kind": kind,
                        "base_url": f"{server.url}/v1" if kind == "openai" else server.url,
                        "batch_api": True,
                    }
                },
                "models": {
                    "m": {
                        "provider": "p",
                        "name": "fake-model",
                        "input_usd_per_mtok": PRICE_IN,
                        "output_usd_per_mtok": PRICE_OUT,
                    }
                },
            }
        )
    )
    values = {"batch_flush_s": 0.01} | settings
    base = Settings(workspace=workspace, config_path=config, env={}, **values)
    return Runtime.build(base, store, InProcessDispatcher())


def submit(runtime: Runtime, task: str = "look around") -> Trace:
    spec = TaskSpec(task, "m", batch_api=True)
    return create_root(runtime, spec)


def drive(runtime: Runtime, trace_id: str, timeout_s: float = 60.0) -> Trace:
    """Run, poll, run what the poll resumed, until the trace ends (or `timeout_s`: a loaded
    machine took longer than 100 polls 0.03 s apart)."""
    providers = provider_for(runtime.config, {})
    assert Runner(runtime).run(trace_id).outcome == "parked"
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for resumed in poll_once(runtime, providers).resume:
                Runner(runtime).run(resumed)
            trace = runtime.store.get_trace(trace_id)
            if trace.is_terminal:
                return trace
            time.sleep(0.03)  # the fake answers a batch 0.05 s after it came
        return runtime.store.get_trace(trace_id)
    finally:
        providers.close()


def test_a_parked_trace_holds_no_lease_and_completes_from_the_batch_answers(
    store: TraceStore, served: OpenAIBatchServer, tmp_path: Path
) -> None:
    runtime = runtime_for(store, served, tmp_path)
    root = submit(runtime)
    assert Runner(runtime).run(root.trace_id).outcome == "parked"
    parked = store.get_trace(root.trace_id)
    assert parked.status == "waiting" and store.lease_holder(root.trace_id) is None
    (entry,) = [c for c in store.collaborators(root.trace_id) if c.type == "batch"]
    assert entry.status == "waiting"
    custom_id = parked_id(parked)
    assert Runner(runtime).run(root.trace_id).outcome == "parked"  # a redelivery: no new call
    assert [c for c, _ in batch_calls(store).queued(10)] == [custom_id]
    trace = drive(runtime, root.trace_id)
    assert trace.status == "completed", trace.error
    assert trace.answer == "done: look around"
    assert served.live_calls == 0 and len(served.sent) == len(set(served.sent)) == 2
    assert trace.stats.cost_usd == pytest.approx(2 * LIVE_CALL_USD / 2)
    assistant = [m for m in store.messages(root.trace_id) if m.role == "assistant"]
    assert all(m.metadata.get("batch_id", "").startswith("batch_") for m in assistant)


def test_an_errored_request_goes_into_the_next_batch(
    store: TraceStore, served: OpenAIBatchServer, tmp_path: Path
) -> None:
    runtime = runtime_for(store, served, tmp_path)
    served.error_next(1)
    trace = drive(runtime, submit(runtime).trace_id)
    assert trace.status == "completed", trace.error
    assert served.live_calls == 0
    assert len(served.sent) == 3 and len(set(served.sent)) == 3  # a new wire id for the retry


def test_an_errored_request_goes_live_when_the_operator_says_so(
    store: TraceStore, served: OpenAIBatchServer, tmp_path: Path
) -> None:
    runtime = runtime_for(store, served, tmp_path, batch_retry="live")
    served.error_next(1)
    trace = drive(runtime, submit(runtime).trace_id)
    for client in runtime.clients.values():
        client.close()  # type: ignore[attr-defined]
    assert trace.status == "completed", trace.error
    assert served.live_calls == 1 and len(served.sent) == 2


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_expired_batch_sends_its_calls_again(
    store: TraceStore, kind: str, allow_requests: None, tmp_path: Path
) -> None:
    server_type = OpenAIBatchServer if kind == "openai" else AnthropicBatchServer
    with server_type(SCRIPT, delay_s=0.05) as server:
        runtime = runtime_for(store, server, tmp_path, kind, batch_retry="live")
        server.expire_next()
        trace = drive(runtime, submit(runtime).trace_id)
        assert trace.status == "completed", trace.error
        # Lost, not errored: into the next batch even when errors are retried live.
        assert len(server.sent) == 3 == len(set(server.sent)) and server.live_calls == 0


def test_a_batch_id_that_could_name_another_path_is_refused(allow_requests: None) -> None:
    from fleet.batchapi.providers import _batch_id

    with OpenAIBatchServer(SCRIPT) as server:
        tgt = target(server, "openai")
    for hostile in ("../../files/x", "", 7, "a" * 500):
        with pytest.raises(ModelBehaviorError):
            _batch_id({"id": hostile}, tgt)


def test_a_stop_takes_the_call_out_and_cancels_a_batch_that_was_all_its(
    store: TraceStore, allow_requests: None, tmp_path: Path
) -> None:
    with OpenAIBatchServer(SCRIPT, delay_s=30) as server:
        runtime = runtime_for(store, server, tmp_path)
        providers = provider_for(runtime.config, {})
        stopped, kept = submit(runtime, "stop me"), submit(runtime, "keep me")
        for trace in (stopped, kept):
            assert Runner(runtime).run(trace.trace_id).outcome == "parked"
        time.sleep(0.02)  # past FLEET_BATCH_FLUSH_S
        poll_once(runtime, providers)  # both in one provider batch now
        assert len(server.batches) == 1
        stop_subtree(runtime, stopped.trace_id)
        assert store.get_trace(stopped.trace_id).status == "stopped"
        assert store.get_trace(kept.trace_id).status == "waiting"
        poll_once(runtime, providers)
        assert server.cancelled == []  # the batch holds another tree's call: it goes on
        stop_subtree(runtime, kept.trace_id)
        poll_once(runtime, providers)
        assert server.cancelled == list(server.batches)  # all of it stopped: cancelled there
        providers.close()


def test_a_tool_call_the_batch_answer_asks_for_is_checked_like_a_live_one(
    store: TraceStore, allow_requests: None, tmp_path: Path
) -> None:
    """The model's answer is hostile wherever it comes from: an explore branch may not write."""
    hostile = Script.parse(
        {
            "scripts": [
                {
                    "match": ".*",
                    "steps": [
                        {
                            "tool_calls": [
                                {
                                    "name": "write_file",
                                    "arguments": {"path": "pwned", "content": "x"},
                                }
                            ]
                        },
                        {"content": "ok"},
                    ],
                }
            ]
        },
        "<hostile>",
    )
    with OpenAIBatchServer(hostile, delay_s=0.05) as server:
        runtime = runtime_for(store, server, tmp_path)
        spec = TaskSpec("t", "m", preset="explore", batch_api=True)
        root = create_root(runtime, spec)
        trace = drive(runtime, root.trace_id)
        assert trace.status == "completed", trace.error
        assert not (tmp_path / "ws" / "pwned").exists()
        results = [m for m in store.messages(root.trace_id) if m.role == "tool"]
        assert results and results[0].metadata.get("is_error") is True


def test_outcome_of_a_lost_request_is_none_and_sent_again() -> None:
    assert Outcome().body is None and Outcome(error="x").error == "x"


def test_a_parked_trace_is_owned_by_its_call_and_resent_without_one(
    store: TraceStore, served: OpenAIBatchServer, tmp_path: Path
) -> None:
    from fleet.owners import Resend, unowned
    from fleet.storage.owner_index import owner_index

    runtime = runtime_for(store, served, tmp_path)
    root = submit(runtime)
    assert Runner(runtime).run(root.trace_id).outcome == "parked"
    index = owner_index(store)
    later = now_ms() + 60_000
    assert unowned(store, index, root.trace_id, later, 1) == []  # its queued call owns it
    custom_id = parked_id(store.get_trace(root.trace_id))
    batch_calls(store).forget(custom_id)  # lost (a Redis that dropped its last writes)
    (remedy,) = unowned(store, index, root.trace_id, later, 1)
    assert isinstance(remedy, Resend) and "provider batch" in remedy.why
    # The resent run queues the same turn again, under the same custom id.
    assert Runner(runtime).run(root.trace_id).outcome == "parked"
    assert [c for c, _ in batch_calls(store).queued(10)] == [custom_id]


def test_an_answer_already_in_the_trace_is_never_taken_twice() -> None:
    """A stale run-state write (an old `answered` state put back) must not replay a turn."""
    from fleet.batchapi.route import CALL_KEY, route_of
    from fleet.models import Message

    run = RunState(batch_api=True, waiting_on_batch=BatchWait(custom_id="fc1", state="answered"))
    trace = Trace(trace_id="t1", root_trace_id="t1", task="x", run=run)
    answered = Message(trace_id="t1", role="assistant", content="hi", metadata={CALL_KEY: "fc1"})
    assert route_of(trace, []) == "answered"
    assert route_of(trace, [answered]) == "fresh"
    assert route_of(trace.model_copy(update={"run": RunState()}), []) == "live"
    assert (
        route_of(Trace(trace_id="t2", root_trace_id="t2", task="x", metadata=run.model_dump()), [])
        == "live"
    )


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def redis_trace_store(request: pytest.FixtureRequest) -> TraceStore:
    """Budgets live in Redis only: the Redis store, on fakeredis and on a real Redis."""
    from fleet.storage.backends.redis.store import RedisStore

    if request.param == "fakeredis":
        return RedisStore(fake_redis())
    return RedisStore(request.getfixturevalue("redis_client"))


def test_a_budget_reserves_and_settles_batch_calls_at_the_batch_price(
    redis_trace_store: TraceStore, served: OpenAIBatchServer, tmp_path: Path
) -> None:
    from fleet.limits.budget import Budget

    store = redis_trace_store
    runtime = runtime_for(store, served, tmp_path)
    spec = TaskSpec("look", "m", batch_api=True, budget=Budget(usd=1.0))
    root = create_root(runtime, spec)
    trace = drive(runtime, root.trace_id)
    assert trace.status == "completed", trace.error
    assert runtime.gate.budgets is not None
    state = runtime.gate.budgets.state(root.trace_id)
    assert state is not None
    assert state.used_usd == pytest.approx(trace.stats.cost_usd) == pytest.approx(LIVE_CALL_USD)
    assert state.used_tokens == 2 * sum(USAGE)
    assert state.reserved_tokens == 0  # nothing held while the calls waited


def test_a_wall_s_budget_cancels_the_waiting_call_and_stops_the_tree(
    redis_trace_store: TraceStore, allow_requests: None, tmp_path: Path
) -> None:
    from fleet.limits.budget import Budget

    store = redis_trace_store
    with OpenAIBatchServer(SCRIPT, delay_s=600) as server:
        runtime = runtime_for(store, server, tmp_path)
        # A wall clock long enough for the first poll to come before it even on a loaded
        # machine (0.3 s did not: the park and the poll took longer in a busy suite).
        wall_s = 3.0
        spec = TaskSpec("look", "m", batch_api=True, budget=Budget(wall_s=wall_s))
        started = time.monotonic()
        root = create_root(runtime, spec)
        assert Runner(runtime).run(root.trace_id).outcome == "parked"
        providers = provider_for(runtime.config, {})
        time.sleep(0.05)
        assert poll_once(runtime, providers).resume == []  # sent; the provider takes its time
        assert len(server.sent) == 1
        time.sleep(max(0.0, wall_s + 0.1 - (time.monotonic() - started)))  # past wall_s
        (resumed,) = poll_once(runtime, providers).resume
        # The root's last word (the budget's final turn) is made live: it cannot wait hours.
        assert Runner(runtime).run(resumed).outcome == "completed"
        providers.close()
        for client in runtime.clients.values():
            client.close()  # type: ignore[attr-defined]
        trace = store.get_trace(root.trace_id)
        assert trace.run.stop_reason == "budget" and server.live_calls == 1
        assert batch_calls(store).in_flight() == [] or all(
            s is None or s.state == "cancelled"
            for f in batch_calls(store).in_flight()
            for s in batch_calls(store).statuses(f.custom_ids)
        )


def test_an_alias_may_default_batch_entries_to_the_batch_route(
    served: OpenAIBatchServer, tmp_path: Path
) -> None:
    from fleet.batchapi.route import wants_batch

    runtime = runtime_for(MemoryStore(), served, tmp_path)
    assert not wants_batch(runtime, None, "m")
    models = {"m": runtime.config.models["m"].model_copy(update={"batch_api": True})}
    runtime = replace(runtime, config=runtime.config.model_copy(update={"models": models}))
    assert wants_batch(runtime, None, "m")
    assert not wants_batch(runtime, False, "m")  # an entry's own word wins
