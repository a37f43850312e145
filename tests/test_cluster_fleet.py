"""The store on a local 3-master Redis Cluster: an explore of 200 on real workers, RabbitMQ broker.

Celery's results go to a single Redis of their own (FLEET_RESULT_BACKEND_URL). Skipped when
no RabbitMQ answers, unless `CI` is set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml

from fleet.client import Fleet
from fleet.limits.budget import Budget
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.compaction import PACKED_FIELD
from fleetops.redis_server import start_redis_server
from tests.fake_provider import RateLimitedProvider
from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers
from tests.redis_cluster import redis_cluster
from tests.test_fleet_rabbitmq import RABBITMQ_URL, purge_fleet_queues, rabbitmq_answers
from tests.test_fleet_recovery import (
    FAST_RECOVERY,
    RUN_TIMEOUT_S,
    assert_collected_once,
    running_branches,
    start_workers,
)
from tests.test_limits_fleet import brain

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq]

BRANCHES = 200
REQUESTS_PER_S = 80
BUDGET_TOKENS = 10_000_000


@dataclass
class Setup:
    fleet: Fleet
    provider: RateLimitedProvider
    masters: list[str]
    env: dict[str, str]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, rabbitmq_to_itself: None) -> Iterator[Setup]:
    if not rabbitmq_answers(RABBITMQ_URL):
        if os.environ.get("CI"):
            pytest.fail(f"no RabbitMQ answers at {RABBITMQ_URL} (and CI is set)")
        pytest.skip(f"no RabbitMQ answers at {RABBITMQ_URL}")
    purge_fleet_queues(RABBITMQ_URL)
    tmp = tmp_path_factory.mktemp("cluster")
    workspace = tmp_path_factory.mktemp("workspace")
    with contextlib.ExitStack() as stack:
        masters = stack.enter_context(redis_cluster())
        results = stack.enter_context(start_redis_server())
        provider = stack.enter_context(
            RateLimitedProvider(brain(tmp, BRANCHES), requests_per_s=REQUESTS_PER_S)
        )
        config = tmp / "fleet.yaml"
        limits = {"requests_per_minute": REQUESTS_PER_S * 60}
        paced = {"kind": "openai", "base_url": f"{provider.url}/v1", "limits": limits}
        models = {"paced": {"provider": "paced", "name": "fake-model"}}
        config.write_text(yaml.safe_dump({"providers": {"paced": paced}, "models": models}))
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_REDIS_CLUSTER": "1",
            "FLEET_RESULT_BACKEND_URL": results.url,
            "FLEET_STUCK_AFTER_S": "0.5",  # the owner check compacts the tree soon after
            "FLEET_OWNER_CHECK_INTERVAL_S": "0.5",
        }
        workers = [
            stack.enter_context(
                start_worker(masters[0], broker_url=RABBITMQ_URL, concurrency=50, env_extra=env)
            )
            for _ in range(2)
        ]
        wait_for_workers(RABBITMQ_URL, [w.name for w in workers], timeout_s=60)
        settings = fleet_settings(masters[0], workspace, FLEET_BROKER_URL=RABBITMQ_URL, **env)
        stack.callback(keys.use_cluster_layout, False)  # this process's layout, for later tests
        yield Setup(client(settings), provider, masters, env)


def test_an_explore_of_200_on_a_cluster_with_limits_and_a_budget(setup: Setup) -> None:
    budget = Budget(tokens=BUDGET_TOKENS, sub_agents=BRANCHES)
    trace = setup.fleet.submit("survey", model="paced", budget=budget).wait(timeout_s=240)

    assert trace.status == "completed", trace.error
    entries = setup.fleet.store.collaborators(trace.trace_id)
    failed = {c.trace_id: c.summary for c in entries if c.status != "completed"}
    assert [c.status for c in entries] == ["completed"] * BRANCHES, failed
    stats = setup.provider.stats
    assert stats.answered == BRANCHES + 2 and stats.refused_share <= 0.01, stats
    # The provider refuses past REQUESTS_PER_S (a bucket of one second's worth): none was
    # refused, and the calls took at least as long as the limit allows, across two workers.
    assert stats.first_at is not None and stats.last_at is not None
    spread_s = stats.last_at - stats.first_at
    assert spread_s >= 0.9 * (stats.answered - REQUESTS_PER_S) / REQUESTS_PER_S, spread_s
    state = setup.fleet.runtime.gate.budgets.state(trace.trace_id)  # type: ignore[union-attr]
    assert state is not None and state.exhausted is None
    assert state.used_sub_agents == BRANCHES
    assert 0 < state.used_tokens <= BUDGET_TOKENS
    counts = []
    for url in setup.masters:
        with redis.Redis.from_url(url) as node:
            counts.append(int(node.dbsize()))
    print(f"keys per master: {counts}")
    assert all(counts), f"keys per master: {counts}"

    store = setup.fleet.store
    assert isinstance(store, RedisStore)
    packed = lambda: list(store.client.hkeys(keys.trace(trace.trace_id))) == [PACKED_FIELD]  # noqa: E731
    wait_until(packed, 60, "the tree compacted on the cluster")
    assert len(store.messages(trace.trace_id)) == 5, "read back from the packed hash"
    assert [c.status for c in store.collaborators(trace.trace_id)] == ["completed"] * BRANCHES


def test_a_killed_worker_on_a_cluster_is_recovered_and_collected_once(
    setup: Setup, tmp_path: Path
) -> None:
    # Two more workers that renew and sweep fast; one is killed while it runs branches.
    model = explore_script(tmp_path / "m.yaml", 20, latency_ms=300, branch_turns=2)
    env = {**setup.env, **FAST_RECOVERY}
    with contextlib.ExitStack() as stack:
        mine = start_workers(
            stack, setup.masters[0], 2, broker_url=RABBITMQ_URL, concurrency=4, env_extra=env
        )
        store = setup.fleet.store
        assert isinstance(store, RedisStore)
        handle = setup.fleet.submit("survey", model=model)

        victims: list[str] = []

        def a_worker_of_mine_runs_branches() -> bool:
            victims[:] = [r.worker for r in running_branches(setup.fleet, store.client, mine)]
            return bool(victims)

        wait_until(a_worker_of_mine_runs_branches, RUN_TIMEOUT_S, "branches on a victim")
        next(w for w in mine if w.name == victims[0]).kill()
        root = handle.wait(timeout_s=RUN_TIMEOUT_S)
    assert_collected_once(setup.fleet, root.trace_id, 20)
