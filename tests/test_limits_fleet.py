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
from fleet.limits.budget import Budget
from fleet.models import Trace
from fleet.testing import Script
from tests.fake_provider import RateLimitedProvider
from tests.fleetkit import client, explore_script, fleet_settings
from tests.procs import start_worker, wait_for_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REQUESTS_BRANCHES, REQUESTS_PER_S = 60, 20.0
TOKENS_BRANCHES, TOKENS_PER_S, COMPLETION_TOKENS = 30, 30_000.0, 2_000
BUDGET_BRANCHES, BUDGET_TOKENS, BRANCH_COMPLETION = 20, 40_000, 4_500


@dataclass
class Setup:
    fleet: Fleet
    paced: RateLimitedProvider
    metered: RateLimitedProvider
    generous: RateLimitedProvider


def fleet_yaml(path: Path, paced: str, metered: str, generous: str) -> Path:
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
            "generous": {"kind": "openai", "base_url": f"{generous}/v1"},
        },
        "models": {
            "paced": {"provider": "paced", "name": "fake-model"},
            "metered": {
                "provider": "metered",
                "name": "fake-model",
                "max_output_tokens": COMPLETION_TOKENS,
            },
            "generous": {
                "provider": "generous",
                "name": "fake-model",
                "max_output_tokens": BRANCH_COMPLETION,
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
        generous = stack.enter_context(
            RateLimitedProvider(
                brain(tmp, BUDGET_BRANCHES), completion_tokens=BRANCH_COMPLETION, latency_s=0.05
            )
        )
        config = fleet_yaml(tmp / "fleet.yaml", paced.url, metered.url, generous.url)
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
        yield Setup(fleet, paced, metered, generous)


def elapsed_s(trace: Trace) -> float:
    assert trace.finished_at_ms is not None
    return (trace.finished_at_ms - trace.created_at_ms) / 1000


@pytest.mark.serial
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


@pytest.mark.serial
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


def test_a_budget_stops_the_tree_with_a_partial_answer(setup: Setup) -> None:
    """20 branches that want ~5 000 tokens each under a budget of 40 000."""
    budget = Budget(tokens=BUDGET_TOKENS)
    trace = setup.fleet.submit("survey", model="generous", budget=budget).wait(timeout_s=120)
    assert trace.status == "completed", trace.error
    assert trace.run.stop_reason == "budget"
    store = setup.fleet.store
    branches = [store.get_trace(c) for c in store.children(trace.trace_id)]
    spent = sum(t.stats.prompt_tokens + t.stats.completion_tokens for t in [trace, *branches])
    print(
        f"budget {BUDGET_TOKENS}: spent {spent}, root's final turn {trace.stats.completion_tokens}"
    )
    # The documented bound: estimates book >= what the server counts (1 token per 4
    # characters, answers within max_output_tokens), so only the root's final turn can
    # go past the share set aside for it.
    final_turn = trace.stats.prompt_tokens + trace.stats.completion_tokens
    assert spent <= BUDGET_TOKENS + final_turn
    done = [b for b in branches if b.status == "completed"]
    cut = [b for b in branches if b.status == "stopped"]
    assert done and cut and len(done) + len(cut) == BUDGET_BRANCHES
    for branch in done:  # the answer is built from the branches that finished
        assert f"done: {branch.task}" in (trace.answer or "")
    entries = {c.trace_id: c for c in store.collaborators(trace.trace_id)}
    assert {entries[b.trace_id].status for b in cut} == {"stopped"}
    assert all("cut by the tree's budget" in entries[b.trace_id].summary for b in cut)
    state = setup.fleet.runtime.gate.budgets.state(trace.trace_id)  # type: ignore[union-attr]
    assert state is not None and state.used_tokens == spent and state.exhausted == "tokens"
