"""Fan-out limits and message priorities, without workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.inprocess import InProcessFleet
from fleet.settings import Settings
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
