"""Provider limits on real workers against a local OpenAI-wire server that enforces its own.

Scaled for CI on 2 shared cores; bench/limits_bench.py runs the full sizes (200 branches on
2 workers x 50 threads at 20 requests/s) and reports the same numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml

from fleet.client import Fleet
from fleet.models import Trace
from fleet.testing import Script
from tests.fake_provider import RateLimitedProvider
from tests.fleetkit import client, explore_script, fleet_settings
from tests.procs import start_worker, wait_for_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REQUESTS_BRANCHES, REQUESTS_PER_S = 60, 20.0
TOKENS_BRANCHES, TOKENS_PER_S, COMPLETION_TOKENS = 30, 30_000.0, 2_000


@dataclass
class Setup:
    fleet: Fleet
    paced: RateLimitedProvider
    metered: RateLimitedProvider


def fleet_yaml(path: Path, paced: str, metered: str) -> Path:
    config = {
        "providers": {
            "paced": {
                "kind": "openai",
                "base_url": f"{paced}/v1",
                "limits": {"requests_per_minute": int(REQUESTS_PER_S * 60)},
            },
            "metered": {
                "kind": "openai",
                "base_url": f"{metered}/v1",
                "limits": {"tokens_per_minute": int(TOKENS_PER_S * 60)},
            },
        },
        "models": {
            "paced": {"provider": "paced", "name": "fake-model"},
            "metered": {
                "provider": "metered",
                "name": "fake-model",
                "max_output_tokens": COMPLETION_TOKENS,
            },
        },
    }
    path.write_text(yaml.safe_dump(config))
    return path


def brain(tmp: Path, branches: int) -> Script:
    model = explore_script(tmp / f"brain-{branches}.yaml", branches, branch_turns=0)
    path = model.removeprefix("scripted:")
    return Script.parse(yaml.safe_load(Path(path).read_text()), path)


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("limits")
    workspace = tmp_path_factory.mktemp("workspace")  # the config must live outside it
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    with contextlib.ExitStack() as stack:
        paced = stack.enter_context(
            RateLimitedProvider(brain(tmp, REQUESTS_BRANCHES), requests_per_s=REQUESTS_PER_S)
        )
        metered = stack.enter_context(
            RateLimitedProvider(
                brain(tmp, TOKENS_BRANCHES),
                tokens_per_s=TOKENS_PER_S,
                completion_tokens=COMPLETION_TOKENS,
            )
        )
        config = fleet_yaml(tmp / "fleet.yaml", paced.url, metered.url)
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
        }
        workers = [
            stack.enter_context(start_worker(redis_url, concurrency=50, env_extra=env))
            for _ in range(2)
        ]
        wait_for_workers(redis_url, [w.name for w in workers], timeout_s=60)
        fleet = client(fleet_settings(redis_url, workspace, FLEET_CONFIG=str(config)))
        yield Setup(fleet, paced, metered)


def elapsed_s(trace: Trace) -> float:
    assert trace.finished_at_ms is not None
    return (trace.finished_at_ms - trace.created_at_ms) / 1000


def test_requests_limit_shared_by_every_worker(setup: Setup) -> None:
    trace = setup.fleet.submit("survey", model="paced").wait(timeout_s=180)
    assert trace.status == "completed", trace.error
    statuses = [c.status for c in setup.fleet.store.collaborators(trace.trace_id)]
    assert statuses == ["completed"] * REQUESTS_BRANCHES
    stats = setup.paced.stats
    assert stats.refused_share <= 0.01, f"{stats.refused} of {stats.answered} refused"
    minimum_s = (REQUESTS_BRANCHES + 2) / REQUESTS_PER_S
    print(f"requests: {elapsed_s(trace):.2f} s, bound {minimum_s:.2f} s, {stats}")
    assert elapsed_s(trace) <= 1.25 * minimum_s + 1.0, (elapsed_s(trace), minimum_s)


def test_tokens_limit_with_large_completions(setup: Setup) -> None:
    trace = setup.fleet.submit("survey", model="metered").wait(timeout_s=180)
    assert trace.status == "completed", trace.error
    statuses = [c.status for c in setup.fleet.store.collaborators(trace.trace_id)]
    assert statuses == ["completed"] * TOKENS_BRANCHES
    stats = setup.metered.stats
    assert stats.refused_share <= 0.01, f"{stats.refused} of {stats.answered} refused"
    minimum_s = stats.tokens / TOKENS_PER_S
    print(f"tokens: {elapsed_s(trace):.2f} s, bound {minimum_s:.2f} s, {stats}")
    assert elapsed_s(trace) <= 1.25 * minimum_s + 1.0, (elapsed_s(trace), minimum_s)
