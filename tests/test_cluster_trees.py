"""Several explore trees at once on a local 3-master Redis Cluster, on real Celery workers.

One tree keeps every key in its root's slot; several trees put a worker's leases, the
fleet-wide indexes and the chord joins of many slots side by side: the heartbeat renews
leases of several trees at once, and every branch runs past the lease TTL, so a lease
that is not renewed lapses and its branch is run again. Celery's broker and results are a
single Redis of the test's own (the cluster holds the store only, as docs/operations.md
says), so no other module's workers share its queues.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from fleet import ids
from fleet.client import Fleet
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleetops.redis_server import start_redis_server
from tests.fleetkit import client, explore_script, fleet_settings
from tests.procs import WorkerProcess
from tests.redis_cluster import redis_cluster
from tests.test_fleet_recovery import assert_collected_once, start_workers

pytestmark = pytest.mark.integration

TREES = 6
BRANCHES = 10
LEASE_TTL_MS = keys.LEASE_TTL_MS
"""The default (5 s), renewed every TTL / 5: four missed beats (a loaded machine's stall) are
survived. Each branch runs longer (BRANCH_TURNS x TURN_MS): only renewed leases last."""
BRANCH_TURNS = 4
TURN_MS = 1_500
RUN_TIMEOUT_S = 120.0


@dataclass
class Setup:
    fleet: Fleet
    masters: list[str]
    workers: list[WorkerProcess]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workspace = tmp_path_factory.mktemp("workspace")
    with contextlib.ExitStack() as stack:
        masters = stack.enter_context(redis_cluster())
        celery_redis = stack.enter_context(start_redis_server())
        env = {
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            "FLEET_ALLOW_SCRIPTED": "1",
            "FLEET_REDIS_CLUSTER": "1",
            "FLEET_RESULT_BACKEND_URL": f"{celery_redis.url.rsplit('/', 1)[0]}/1",
            "FLEET_LEASE_TTL_MS": str(LEASE_TTL_MS),
        }
        broker = celery_redis.url
        options = {"broker_url": broker, "concurrency": 32, "env_extra": env}
        workers = start_workers(stack, masters[0], 2, **options)
        settings = fleet_settings(masters[0], workspace, FLEET_BROKER_URL=broker, **env)
        stack.callback(keys.use_cluster_layout, False)  # this process's layout, for later tests
        fleet = client(settings)
        assert isinstance(fleet.store, RedisStore)
        stack.callback(fleet.store.close)
        yield Setup(fleet, masters, workers)


def master_of_slot(masters: list[str]) -> dict[int, str]:
    """Each slot's master, by the URL the test started it on."""
    owner: dict[int, str] = {}
    for url in masters:
        with redis.Redis.from_url(url, decode_responses=True) as node:
            me = node.execute_command("CLUSTER", "MYID")
            for start, end, *nodes in node.execute_command("CLUSTER", "SLOTS"):
                if nodes[0][2] == me:
                    owner.update(dict.fromkeys(range(start, end + 1), url))
    return owner


def spread_roots(masters: list[str], count: int) -> list[str]:
    """Root ids that land on every master in turn (fresh ids land at random)."""
    owner = master_of_slot(masters)
    roots: list[str] = []
    for target in itertools.islice(itertools.cycle(masters), count):
        root = ids.root_id()
        while owner[key_slot(keys.trace(root).encode())] != target:
            root = ids.root_id()
        roots.append(root)
    return roots


def test_six_explores_at_once_on_a_cluster_all_complete_and_spread_over_the_masters(
    setup: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = explore_script(
        tmp_path / "m.yaml", BRANCHES, latency_ms=TURN_MS, branch_turns=BRANCH_TURNS
    )
    roots = iter(spread_roots(setup.masters, TREES))
    monkeypatch.setattr(ids, "root_id", lambda: next(roots))
    store = setup.fleet.store
    assert isinstance(store, RedisStore)
    expiries_before = int(store.client.hget(keys.COUNTERS, "lease_expiries") or 0)

    handles = [setup.fleet.submit(f"survey {n}", model=model) for n in range(TREES)]
    traces = [h.wait(timeout_s=RUN_TIMEOUT_S) for h in handles]

    for trace in traces:
        assert_collected_once(setup.fleet, trace.trace_id, BRANCHES)
    expiries = int(store.client.hget(keys.COUNTERS, "lease_expiries") or 0) - expiries_before
    assert expiries == 0, f"{expiries} runs re-sent after their lease lapsed"
    for trace in traces:  # each branch ran its turns once: no run repeated a model call
        for child in setup.fleet.store.children(trace.trace_id):
            turns = [m for m in setup.fleet.store.messages(child) if m.role == "assistant"]
            assert len(turns) == BRANCH_TURNS + 1, (child, len(turns))
    owner = master_of_slot(setup.masters)
    homes = {owner[key_slot(keys.trace(t.trace_id).encode())] for t in traces}
    held = {url for url in setup.masters if _tree_keys(url)}
    print(f"tree keys per master: {[_tree_keys(url) for url in setup.masters]}")
    assert len(homes) >= 2 and held == homes, (homes, held)
    logs = "".join(w.log() for w in setup.workers)
    for sign in ("heartbeat failed", "same key slot", "CROSSSLOT", "Traceback"):
        assert sign not in logs, sign


def _tree_keys(url: str) -> int:
    """How many keys of trees (the cluster layout's `{root}` tags) this master holds."""
    with redis.Redis.from_url(url, decode_responses=True) as node:
        return sum(1 for _ in node.scan_iter("fleet:trace:{*", count=1000))
