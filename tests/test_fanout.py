"""Fan-out limits and message priorities, without workers, on each store's limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from fleet.children.subagents import spawn
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessFleet
from fleet.limits.budget import Budget
from fleet.limits.capability import LIMITS
from fleet.limits.trees import DEFAULT_SCHEDULE, Schedule
from fleet.llm.base import LLMResponse, ToolCall
from fleet.loop.runner import Runner, run_to_end
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text
from workers.app import make_config, message_priority


def test_an_explore_wider_than_max_branches_is_a_tool_error(tmp_path: Path) -> None:
    model = ScriptedModel([call("agent", task=["a", "b", "c", "d"]), text("gave up")])
    settings = Settings(workspace=tmp_path, max_branches=3)
    local = InProcessFleet.from_settings(settings, clients={"m": model})
    trace = local.run("survey", model="m")
    assert trace.status == "completed" and local.store.children(trace.trace_id) == []
    refusal = next(m for m in local.store.messages(trace.trace_id) if m.role == "tool")
    assert refusal.metadata["is_error"] is True
    assert "4 branches asked for, at most 3 per explore call" in (refusal.content or "")


def test_interactive_trees_go_first_on_either_broker() -> None:
    # Redis lists: the lowest step is taken first; RabbitMQ: the highest number.
    redis_url, amqp_url = "redis://localhost:6379/0", "amqp://guest@localhost//"
    assert message_priority("interactive", redis_url) < message_priority("batch", redis_url)
    assert message_priority("interactive", amqp_url) > message_priority("batch", amqp_url)
    amqp = make_config(Settings(broker_url=amqp_url))
    assert amqp["task_queue_max_priority"] == 10
    assert "task_queue_max_priority" not in make_config(Settings(broker_url=redis_url))


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--budget-tokens", "0"], "--budget-tokens: must be greater than 0"),
        (["--budget-usd", "free"], "--budget-usd: not a number"),
        (["--max-concurrent", "-2"], "--max-concurrent: must be at least 1"),
        (["--inline", "--budget-tokens", "100"], "need the fleet (drop --inline)"),
    ],
)
def test_bad_budget_options_are_one_line_and_exit_2(argv: list[str], problem: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_REDIS")}
    result = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "run", "a task", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert problem in lines[-1]


def test_the_run_window_starts_at_most_its_limit_in_spawn_order(store: TraceStore) -> None:
    trees = store.capability(LIMITS).trees
    assert trees.window("r", 2, new=("a", "b", "c", "d")) == ["a", "b"]
    assert trees.window("r", 2) == [], "both slots are taken"
    assert trees.window("r", 2, ended="b") == ["c"]
    assert trees.window("r", 2, ended="unknown") == [], "a stranger frees no slot"
    assert trees.window("r", 2, ended="a", new=("e",)) == ["d"]
    assert trees.window("other", 1, new=("x", "y")) == ["x"], "each tree has its own window"


def test_a_tree_keeps_its_schedule_and_the_default_costs_nothing(store: TraceStore) -> None:
    trees = store.capability(LIMITS).trees
    trees.create("r", Schedule(max_concurrent=3, priority="batch"))
    trees.create("plain", DEFAULT_SCHEDULE)
    assert trees.schedule("r") == Schedule(3, "batch")
    assert trees.schedule("plain") == DEFAULT_SCHEDULE
    assert trees.schedule("never-created") == DEFAULT_SCHEDULE


@pytest.mark.parametrize("width", [None, 2])
def test_a_root_says_whether_its_tree_has_a_schedule_and_its_spawn_carries_it(
    store: TraceStore, tmp_path: Path, width: int | None
) -> None:
    """A spawn of a tree without a schedule is dispatched without reading one (issue 40)."""
    clients = {"m": ScriptedModel([])}
    local = InProcessFleet.from_settings(Settings(workspace=tmp_path), store=store, clients=clients)
    root = create_root(local.runtime, TaskSpec("survey", "m", max_concurrent=width))
    assert root.run.scheduled is (width is not None)
    assert store.get_trace(root.trace_id).run.scheduled is (width is not None)
    agent = ToolCall("call_1", "agent", json.dumps({"task": ["a", "b"]}))
    request = spawn(local.runtime, store.get_trace(root.trace_id), agent)
    assert request.scheduled is (width is not None)


def test_a_tree_budget_caps_sub_agents_on_every_store(store: TraceStore, tmp_path: Path) -> None:
    model = ScriptedModel([call("agent", task=["a", "b", "c"]), text("gave up")])
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path), store=store, clients={"m": model}
    )
    spec = TaskSpec("survey", model="m", budget=Budget(tokens=100_000, sub_agents=2))
    root = create_root(local.runtime, spec)
    run_to_end(Runner(local.runtime), root.trace_id)
    assert store.get_trace(root.trace_id).status == "completed"
    assert store.children(root.trace_id) == [], "nothing spawned past the budget"
    refusal = next(m for m in store.messages(root.trace_id) if m.role == "tool")
    assert "this tree may start 2 more sub-agent(s); this call asks for 3" in (
        refusal.content or ""
    )


class Branches:
    """A model without a lock: the root explores six branches, which count who runs at once."""

    def __init__(self) -> None:
        self.running, self.peak, self._lock = 0, 0, threading.Lock()
        self._pairs = threading.Barrier(2, timeout=0.5)

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        if not task.startswith("b"):
            if any(m["role"] == "tool" for m in messages):
                return LLMResponse(content="done")
            branches = json.dumps({"task": [f"b{i}" for i in range(6)]})
            return LLMResponse(content=None, tool_calls=(ToolCall("c1", "agent", branches),))
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            self._pairs.wait()  # two branches meet here: a third would run alongside them
        except threading.BrokenBarrierError:
            pass
        finally:
            with self._lock:
                self.running -= 1
        return LLMResponse(content=f"found {task}")


@pytest.mark.parametrize("max_concurrent", [1, 2])
def test_the_in_process_fleet_runs_at_most_max_concurrent_branches(
    tmp_path: Path, max_concurrent: int
) -> None:
    model = Branches()
    local = InProcessFleet.from_settings(Settings(workspace=tmp_path), clients={"m": model})
    spec = TaskSpec("survey", model="m", max_concurrent=max_concurrent)
    root = create_root(local.runtime, spec)
    run_to_end(Runner(local.runtime), root.trace_id)
    trace = local.store.get_trace(root.trace_id)
    assert trace.status == "completed", trace.error
    assert len(local.store.children(root.trace_id)) == 6
    assert model.peak == max_concurrent


def test_the_memory_window_decides_as_the_lua_does_call_for_call() -> None:
    import random

    from fleet.limits.backends.memory.trees import MemoryTrees
    from fleet.limits.backends.redis.trees import Trees
    from tests.conftest import fake_redis

    rng = random.Random(22)
    lua, memory = Trees(fake_redis()), MemoryTrees()
    started: list[str] = []
    for step in range(300):
        ended = rng.choice(started) if started and rng.random() < 0.6 else ""
        new = tuple(f"c{step}-{i}" for i in range(rng.randint(0, 3)))
        answers = [side.window("r", 3, ended=ended, new=new) for side in (lua, memory)]
        assert answers[0] == answers[1], (step, answers)
        started = [s for s in started if s != ended] + answers[0]
