"""Batch trees through providers' Batch APIs on a real worker, Redis and local provider fakes.

The Done-when rows of issue 29: 50 explore trees through OpenAI's Batch wire on one worker
of 4 threads (no live call, half the live cost, more calls waiting than slots exist); one
tree through Anthropic's; a stop of one tree ends it alone; a worker SIGKILL and a Redis
restart while batches are in flight lose nothing and send no custom id twice.
Short poll and flush settings keep each in seconds.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from bench.fault_rig import Redis as AofRedis
from fleet.batchapi.route import in_batches
from fleet.client import Fleet
from fleet.models import Trace
from fleet.storage import keys
from fleet.testing import Script
from tests.fake_batch import USAGE, AnthropicBatchServer, OpenAIBatchServer
from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from tests.procs import WorkerProcess, start_worker, wait_for_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TREES, BRANCHES = 50, 4
CALLS_PER_TREE = 2 + BRANCHES  # the root explores, then answers; each branch answers once
PRICE_IN, PRICE_OUT = 2.0, 8.0
LIVE_CALL_USD = (USAGE[0] * PRICE_IN + USAGE[1] * PRICE_OUT) / 1e6
FAST = {
    "FLEET_BATCH_POLL_S": "0.3",
    "FLEET_BATCH_FLUSH_S": "0.3",
    "FLEET_SWEEP_INTERVAL_S": "0.2",
    "FLEET_LEASE_TTL_MS": "2000",
    "FLEET_STUCK_AFTER_S": "3",
    "FLEET_OWNER_CHECK_INTERVAL_S": "1",
}


@dataclass
class Setup:
    fleet: Fleet
    openai: OpenAIBatchServer
    anthropic: AnthropicBatchServer
    slow: OpenAIBatchServer
    env: dict[str, str]


def brain(tmp: Path) -> Script:
    path = explore_script(tmp / "brain.yaml", BRANCHES, branch_turns=0).removeprefix("scripted:")
    return Script.parse(yaml.safe_load(Path(path).read_text()), path)


def fleet_yaml(path: Path, openai: str, anthropic: str, slow: str) -> Path:
    prices = {"input_usd_per_mtok": PRICE_IN, "output_usd_per_mtok": PRICE_OUT}
    config = {
        "providers": {
            "oai": {"kind": "openai", "base_url": f"{openai}/v1", "batch_api": True},
            "anth": {"kind": "anthropic", "base_url": anthropic, "batch_api": True},
            "slow": {"kind": "openai", "base_url": f"{slow}/v1", "batch_api": True},
        },
        "models": {
            "gpt": {"provider": "oai", "name": "fake-model", **prices},
            "claude": {"provider": "anth", "name": "fake-model", **prices},
            "slow": {"provider": "slow", "name": "fake-model", **prices},
        },
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def worker(redis_url: str, env: dict[str, str]) -> Iterator[WorkerProcess]:
    with start_worker(redis_url, concurrency=4, env_extra=env) as process:
        wait_for_workers(redis_url, [process.name], timeout_s=60)
        yield process


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("batchapi")
    workspace = tmp_path_factory.mktemp("workspace")
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    script = brain(tmp)
    with contextlib.ExitStack() as stack:
        openai = stack.enter_context(OpenAIBatchServer(script, delay_s=0.5))
        anthropic = stack.enter_context(AnthropicBatchServer(script, delay_s=0.5))
        slow = stack.enter_context(OpenAIBatchServer(script, delay_s=600))
        config = fleet_yaml(tmp / "fleet.yaml", openai.url, anthropic.url, slow.url)
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            **FAST,
        }
        stack.enter_context(worker(redis_url, env))
        fleet = client(fleet_settings(redis_url, workspace, **env))
        yield Setup(fleet, openai, anthropic, slow, env)


def tree_cost(fleet: Fleet, root: Trace) -> float:
    store = fleet.store
    traces = [root, *(store.get_trace(c) for c in store.children(root.trace_id))]
    return sum(t.stats.cost_usd for t in traces)


def test_fifty_explore_trees_through_openai_batches_cost_half_and_hold_few_slots(
    setup: Setup,
) -> None:
    peak = [0]
    done = threading.Event()

    def sample() -> None:  # how many calls wait in provider batches, against 4 slots
        while not done.wait(0.1):
            peak[0] = max(peak[0], in_batches(setup.fleet.runtime)[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    tasks = [{"id": f"t{i}", "task": f"survey {i}", "model": "gpt"} for i in range(TREES)]
    started = time.monotonic()
    try:
        results = list(setup.fleet.batch(tasks, max_in_flight=TREES, batch_api=True, timeout_s=240))
    finally:
        done.set()
        sampler.join()
    elapsed_s = time.monotonic() - started
    assert [r.status for r in results] == ["completed"] * TREES, [r.error for r in results]
    server = setup.openai
    batches = len(server.batches)
    print(f"{TREES} trees in {elapsed_s:.1f} s, {batches} provider batches, peak {peak[0]}")
    assert server.live_calls == 0
    odd = []
    for r in results:  # each tree: the root's 2 turns, 4 branches of 1; no turn replayed
        t = setup.fleet.trace(r.trace_id)
        kids = [setup.fleet.trace(c) for c in setup.fleet.store.children(t.trace_id)]
        if [t.iteration, *[k.iteration for k in kids]] != [2] + [1] * BRANCHES:
            odd.append((r.trace_id, t.iteration, [k.iteration for k in kids]))
    assert odd == []
    counters = setup.fleet.store.client.hgetall(keys.COUNTERS)  # type: ignore[attr-defined]
    assert int(counters["batch_calls_sent"]) >= TREES * CALLS_PER_TREE
    assert int(counters["batch_answers"]) >= TREES * CALLS_PER_TREE
    assert len(server.sent) == TREES * CALLS_PER_TREE == len(set(server.sent))
    assert peak[0] > 4 * 4, "calls waited in batches without a worker slot each"
    batch_costs = [tree_cost(setup.fleet, setup.fleet.trace(r.trace_id)) for r in results]
    assert batch_costs == pytest.approx([CALLS_PER_TREE * LIVE_CALL_USD / 2] * TREES)
    # The same file live: every call on /v1/chat/completions, at the live price.
    live = list(setup.fleet.batch(tasks[:2], max_in_flight=2, batch_api=False, timeout_s=120))
    assert [r.status for r in live] == ["completed"] * 2
    assert server.live_calls == 2 * CALLS_PER_TREE
    live_costs = [tree_cost(setup.fleet, setup.fleet.trace(r.trace_id)) for r in live]
    assert batch_costs[0] == pytest.approx(live_costs[0] / 2)


def test_one_tree_through_anthropic_message_batches(setup: Setup) -> None:
    (result,) = setup.fleet.batch(
        [{"task": "survey anthropic", "model": "claude"}], batch_api=True, timeout_s=120
    )
    assert result.status == "completed", result.error
    assert setup.anthropic.live_calls == 0
    assert len(setup.anthropic.sent) == CALLS_PER_TREE == len(set(setup.anthropic.sent))
    root = setup.fleet.trace(result.trace_id)
    assert "done: Branch 4 of the survey" in (root.answer or "")
    assert tree_cost(setup.fleet, root) == pytest.approx(CALLS_PER_TREE * LIVE_CALL_USD / 2)


def _spoiled(lines: list[dict[str, Any]]) -> Iterator[bytes]:
    """The first answer with `NaN` usage, then the rest, a foreign line and junk (issue 38)."""
    first = json.dumps(lines[0]).replace('"input_tokens": 100', '"input_tokens": NaN')
    foreign = json.dumps(lines[0] | {"custom_id": "fc" + "0" * 40 + "-1"})
    for line in [first, foreign, "[" * 200_000, *(json.dumps(x) for x in lines[1:])]:
        yield line.encode() + b"\n"


def test_a_hostile_output_line_is_its_calls_error_and_retried_on_a_real_worker(
    setup: Setup,
) -> None:
    server = setup.anthropic
    before = len(server.sent)
    server.tamper_next(_spoiled)
    tasks = [{"task": f"survey hostile {i}", "model": "claude"} for i in range(3)]
    results = list(setup.fleet.batch(tasks, batch_api=True, timeout_s=120))
    assert [r.status for r in results] == ["completed"] * 3, [r.error for r in results]
    sent = server.sent[before:]
    assert len(sent) == 3 * CALLS_PER_TREE + 1 == len(set(sent))  # the spoiled one, once more
    assert server.live_calls == 0
    for r in results:  # the NaN never reached a cost
        cost = tree_cost(setup.fleet, setup.fleet.trace(r.trace_id))
        assert cost == pytest.approx(CALLS_PER_TREE * LIVE_CALL_USD / 2)


def test_a_stop_while_calls_wait_in_a_batch_ends_that_tree_only(setup: Setup) -> None:
    store = setup.fleet.store
    handles = [
        setup.fleet.submit(f"survey slow {i}", model="slow", batch_api=True) for i in range(2)
    ]
    stopped, kept = handles[0].trace_id, handles[1].trace_id

    def entry_names_its_batch() -> bool:
        entries = [c for c in store.collaborators(stopped) if c.type == "batch"]
        return bool(entries) and entries[0].batch_id is not None

    wait_until(entry_names_its_batch, 30, "the root's call in a provider batch")
    entry = next(c for c in store.collaborators(stopped) if c.type == "batch")
    assert entry.status == "waiting" and entry.batch_id in setup.slow.batches
    assert len(setup.slow.sent) == 2
    setup.fleet.stop(stopped)
    assert setup.fleet.trace(stopped).status == "stopped"
    time.sleep(1.0)  # a few polls: the batch still holds the other tree's call
    assert setup.fleet.trace(kept).status == "waiting"
    assert setup.slow.cancelled == []
    setup.fleet.stop(kept)
    wait_until(lambda: setup.slow.cancelled != [], 10, "the provider batch to be cancelled")


def dump(fleet: Fleet, roots: list[str], process: WorkerProcess) -> None:
    """What a stuck run left: each trace, its batch state, the queue, the worker's log."""
    from fleet.storage.batch_calls import batch_calls

    store = fleet.store
    for root in roots:
        for trace_id in [root, *store.children(root)]:
            t = store.get_trace(trace_id)
            print(trace_id, t.status, t.run.waiting_on_batch, t.iteration)
    calls = batch_calls(store)
    print("queued", calls.queued(100))
    print("submitting", calls.submitting())
    print("in flight", [(f.batch_id, len(f.custom_ids)) for f in calls.in_flight()])
    print(process.log()[-6000:])


def test_a_worker_sigkill_and_a_redis_restart_mid_batch_lose_and_double_nothing(
    setup: Setup, tmp_path: Path
) -> None:
    aof = AofRedis()
    server = setup.openai
    sent_before, live_before = len(server.sent), server.live_calls
    try:
        url = aof.url
        env = {**setup.env, "FLEET_REDIS_URL": url, "FLEET_BROKER_URL": url}
        fleet = client(fleet_settings(url, Path(setup.env["FLEET_WORKSPACE"]), **env))
        first = start_worker(url, concurrency=4, env_extra=env)
        wait_for_workers(url, [first.name], timeout_s=60)
        handles = [fleet.submit(f"survey k{i}", model="gpt", batch_api=True) for i in range(6)]
        wait_until(lambda: len(server.sent) - sent_before >= 6 * 2, 60, "branches in batches")
        first.kill()  # SIGKILL, mid-batch
        first.stop()
        aof.restart()
        with start_worker(url, concurrency=4, env_extra=env) as second:
            for handle in handles:  # waits on Redis: reconnects after the restart
                try:
                    trace = handle.wait(timeout_s=40)
                except TimeoutError:
                    dump(fleet, [h.trace_id for h in handles], second)
                    raise
                assert trace.status == "completed", trace.error
        fleet.store.close()
    finally:
        aof.close()
    mine = server.sent[sent_before:]
    assert len(mine) == len(set(mine)), "a custom id was sent twice"
    assert server.live_calls == live_before
