"""`warm_explore` (issue 27 item 4): an explore's first branch makes its first model call
alone; the other branches call once it has answered, so they can read its prompt prefix
from the provider's cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.children import warming
from fleet.inprocess import InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import call, text
from tests.fleetkit import client, explore_script, fleet_settings
from tests.procs import start_worker, wait_for_workers
from tests.test_fleet_recovery import database_url

CALL_S = 0.3


class Recorder:
    """A model whose calls take CALL_S; it logs when each branch's first call ran."""

    def __init__(self, fail_first: bool = False) -> None:
        self.first_calls: dict[str, tuple[float, float]] = {}
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        """An `LLMClient`: calls run at once, in parallel (a ScriptedModel takes turns)."""
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        said = sum(m["role"] == "assistant" for m in messages)
        if not task.startswith("branch"):
            return (
                call("agent", task=[f"branch {i}" for i in range(1, 5)])
                if said == 0
                else text("ok")
            )
        if task == "branch 1" and self.fail_first:
            raise RuntimeError("the first branch crashes before any call answers")
        started = time.monotonic()
        time.sleep(CALL_S)
        if said == 0:
            with self._lock:
                self.first_calls[task] = (started, time.monotonic())
        return text(f"found: {task}")


def make_fleet(tmp_path: Path, recorder: Recorder, warm: bool) -> InProcessFleet:
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump({"warm_explore": warm}))
    (workspace := tmp_path / "workspace").mkdir()
    settings = Settings(workspace=workspace, env={}, config_path=config)
    return InProcessFleet.from_settings(settings, clients={"test": recorder})


def test_with_warm_explore_the_siblings_call_after_the_first_branch_answered(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    local = make_fleet(tmp_path, recorder, warm=True)

    root = local.run("explore", model="test")

    assert root.status == "completed"
    first_ended = recorder.first_calls["branch 1"][1]
    others = [recorder.first_calls[f"branch {i}"][0] for i in range(2, 5)]
    assert all(started >= first_ended for started in others)
    branches = [local.store.get_trace(c.trace_id) for c in local.store.collaborators(root.trace_id)]
    assert [b.run.warm_after_first for b in branches] == [False, True, True, True]


def test_without_it_the_branches_call_together(tmp_path: Path) -> None:
    recorder = Recorder()
    local = make_fleet(tmp_path, recorder, warm=False)

    root = local.run("explore", model="test")

    assert root.status == "completed"
    first_ended = recorder.first_calls["branch 1"][1]
    assert any(recorder.first_calls[f"branch {i}"][0] < first_ended for i in range(2, 5))
    branches = [local.store.get_trace(c.trace_id) for c in local.store.collaborators(root.trace_id)]
    assert not any(b.run.warm_after_first for b in branches)


def test_a_first_branch_that_fails_does_not_hold_its_siblings(tmp_path: Path) -> None:
    recorder = Recorder(fail_first=True)
    local = make_fleet(tmp_path, recorder, warm=True)
    started = time.monotonic()

    root = local.run("explore", model="test")

    assert root.status == "completed"
    statuses = [c.status for c in local.store.collaborators(root.trace_id)]
    assert statuses == ["failed", "completed", "completed", "completed"]
    assert time.monotonic() - started < warming.WARM_MAX_WAIT_S / 4


def test_a_sibling_waits_no_longer_than_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warming, "WARM_MAX_WAIT_S", 0.0)  # every sibling is past the cap
    recorder = Recorder()
    local = make_fleet(tmp_path, recorder, warm=True)

    root = local.run("explore", model="test")

    assert root.status == "completed"
    first_ended = recorder.first_calls["branch 1"][1]
    assert any(recorder.first_calls[f"branch {i}"][0] < first_ended for i in range(2, 5))


WARM_DB = 5
"""Shared with tests/test_fallbacks.py; each module empties it before use."""


@pytest.mark.integration
def test_on_real_workers_the_siblings_first_calls_follow_the_first_branch(
    redis_url: str, tmp_path: Path
) -> None:
    url = database_url(redis_url, WARM_DB)
    (workspace := tmp_path / "workspace").mkdir()
    (operator := tmp_path / "operator").mkdir()
    model = explore_script(operator / "model.yaml", 4, latency_ms=400)
    config = operator / "fleet.yaml"
    config.write_text(yaml.safe_dump({"warm_explore": True}))
    env = {
        "FLEET_CONFIG": str(config),
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET_WORKSPACE_ROOTS": str(workspace),
    }
    with start_worker(url, concurrency=8, env_extra=env) as worker:
        wait_for_workers(url, [worker.name], timeout_s=60)
        fleet = client(fleet_settings(url, workspace, **env))
        try:
            root = fleet.submit("survey", model=model).wait(timeout_s=60)
            branches = [fleet.trace(c.trace_id) for c in fleet.store.collaborators(root.trace_id)]
            firsts = [
                next(m for m in fleet.store.messages(b.trace_id) if m.role == "assistant")
                for b in branches
            ]
        finally:
            assert isinstance(fleet.store, RedisStore)
            fleet.store.close()

    assert root.status == "completed" and [b.status for b in branches] == ["completed"] * 4
    assert [b.run.warm_after_first for b in branches] == [False, True, True, True]
    # a sibling's first call started once the first branch's first answer was written, and
    # takes the model's 400 ms: its answer is written that much later
    first_answered = firsts[0].created_at_ms
    assert all(m.created_at_ms - first_answered >= 350 for m in firsts[1:])
