"""`fleet stop` on real workers closes the model requests in flight: the provider sees each
one cancelled within a bound, on the OpenAI wire and the Anthropic one; an interrupting
message closes the request it cuts too.

A local provider holds every request (`tests.fake_held_provider`): a root's call takes
0.2 s, a branch's or a solo root's `SLOW_S`; it notes when a client shuts a connection.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from fleet.client import Fleet
from fleet.control import subtree
from fleet.llm.base import LLMResponse
from fleet.testing import call, text
from tests.fake_held_provider import HeldProvider, task_of
from tests.fleetkit import client, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

pytestmark = pytest.mark.integration

STOP_DB = 14
SLOW_S = 20.0
BOUND_S = 3.0
"""`fleet stop` -> the provider saw the request go: ~0.1 s unloaded (the watcher's poll and
one shutdown); the margin is for a loaded machine. Without the cut it is SLOW_S."""
BRANCHES = 3


def decide(messages: list[dict[str, Any]]) -> LLMResponse:
    """A root explores BRANCHES branches; a branch or a solo root answers."""
    task = task_of(messages)
    if task.startswith("Explore") and not any(m["role"] == "tool" for m in messages):
        return call("agent", task=[f"branch {i}" for i in range(1, BRANCHES + 1)])
    return text(f"done: {task}")


def latency(messages: list[dict[str, Any]]) -> float:
    """A root's call 0.2 s, and a call after an interrupting message; any other SLOW_S."""
    if task_of(messages).startswith("Explore") or "## Messages" in str(messages[-1]["content"]):
        return 0.2
    return SLOW_S


@dataclass
class Setup:
    fleet: Fleet
    provider: HeldProvider


@pytest.fixture(scope="module")
def setup(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    url = database_url(redis_url, STOP_DB)
    outside = tmp_path_factory.mktemp("operator")
    workspace = tmp_path_factory.mktemp("workspace")
    with contextlib.ExitStack() as stack:
        provider = stack.enter_context(HeldProvider(decide, latency))
        providers = {
            "oai": {"kind": "openai", "base_url": f"{provider.url}/v1"},
            "ant": {"kind": "anthropic", "base_url": provider.url},
        }
        models = {
            "openai-wire": {"provider": "oai", "name": "fake-model"},
            "anthropic-wire": {"provider": "ant", "name": "fake-model"},
        }
        config = outside / "fleet.yaml"
        config.write_text(yaml.safe_dump({"providers": providers, "models": models}))
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
        }
        worker = stack.enter_context(start_worker(url, concurrency=8, env_extra=env))
        wait_for_workers(url, [worker.name], timeout_s=60)
        yield Setup(client(fleet_settings(url, workspace, **env)), provider)


def stopped_all(setup: Setup, root: str, tasks: list[str]) -> float:
    """Stop the tree once each of `tasks` has its request in flight; stop -> last cut, s."""
    provider = setup.provider

    def all_in_flight() -> bool:
        return all(len(provider.in_flight(task)) == 1 for task in tasks)

    wait_until(all_in_flight, 60, "every request in flight")
    stopped_at = time.monotonic()
    setup.fleet.stop(root)
    wait_until(lambda: len(cut(provider, tasks)) == len(tasks), SLOW_S / 2, "the cuts")
    return max((h.ended_at or 0.0) for h in cut(provider, tasks)) - stopped_at


def cut(provider: HeldProvider, tasks: list[str]) -> list[Any]:
    return [h for h in provider.cancelled() if h.task in tasks]


def test_a_stop_cancels_every_branch_request_in_flight(setup: Setup) -> None:
    root = setup.fleet.submit("Explore the options", model="openai-wire").trace_id
    tasks = [f"branch {i}" for i in range(1, BRANCHES + 1)]
    took_s = stopped_all(setup, root, tasks)
    assert took_s < BOUND_S, f"the provider saw the last request go {took_s:.2f} s after stop"
    store = setup.fleet.store
    wait_until(
        lambda: all(t.is_terminal for t in store.get_traces(subtree(store, root))), 30, "the end"
    )
    traces = store.get_traces(subtree(store, root))
    assert {t.status for t in traces} == {"stopped"}, [(t.name, t.status) for t in traces]
    answered = [h.task for h in setup.provider.answered()]
    assert not set(answered) & set(tasks), "no branch request was answered"


def test_a_stop_cancels_the_request_on_the_anthropic_wire(setup: Setup) -> None:
    root = setup.fleet.submit("Solo on the Anthropic wire", model="anthropic-wire").trace_id
    took_s = stopped_all(setup, root, ["Solo on the Anthropic wire"])
    assert took_s < BOUND_S, f"the provider saw the request go {took_s:.2f} s after stop"
    [held] = cut(setup.provider, ["Solo on the Anthropic wire"])
    assert held.wire == "anthropic"
    wait_until(lambda: setup.fleet.trace(root).is_terminal, 30, "the end")
    assert setup.fleet.trace(root).status == "stopped"


def test_an_interrupt_closes_the_request_it_cuts(setup: Setup) -> None:
    fleet, provider = setup.fleet, setup.provider
    task = "Solo, then interrupted"
    handle = fleet.submit(task, model="openai-wire")
    wait_until(lambda: len(provider.in_flight(task)) == 1, 60, "the first request")
    sent_at = time.monotonic()
    fleet.send(handle.trace_id, "use plan C", sender="lead", interrupt=True)
    wait_until(lambda: len(cut(provider, [task])) == 1, SLOW_S / 2, "the cut")
    [held] = cut(provider, [task])
    assert held.ended_at is not None and held.ended_at - sent_at < BOUND_S
    assert handle.wait(timeout_s=60).status == "completed"
    assert [h.cancelled for h in provider.requests if h.task == task] == [True, False]
