"""Operator hooks in one process: loading, blocking, context lines, broken and slow hooks."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.observe.hooks import Hooks
from fleet.observe.operator import HookChain, Member, build_hooks, load_hook
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text
from tests import hookkit
from tests.security.attacker import shell_writable

REPO = Path(__file__).resolve().parent.parent


def local_fleet(
    store: TraceStore, workspace: Path, model: ScriptedModel, *names: str, **settings: Any
) -> InProcessFleet:
    """A fleet whose hooks are `tests.hookkit` objects, each guarded with a 0.3 s timeout."""
    config = Settings(workspace=workspace, env={}, allow_shell=True, **settings)
    runtime = Runtime.build(config, store, InProcessDispatcher(), clients={"test": model})
    members = [Member(n, load_hook(f"tests.hookkit:{n}", ()), 0.3) for n in names]
    return InProcessFleet(replace(runtime, hooks=HookChain(members)))


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def hook_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hooks.jsonl"
    path.touch()
    monkeypatch.setenv(hookkit.LOG_ENV, str(path))
    return path


def planner(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Adds a goal, marks it done, removes a file with bash, then answers with the result."""
    done = sum(m["role"] == "tool" for m in messages)
    steps = [
        lambda: call("goal", action="add", description="tidy up"),
        lambda: call("goal", action="done", goal_id="1", summary="tidied"),
        lambda: call("bash", command="rm precious.txt"),
    ]
    return steps[done]() if done < len(steps) else text(f"last: {messages[-1]['content']}")


def test_a_hook_sees_turns_tools_and_goals_and_blocks_bash(
    store: TraceStore, tmp_path: Path, hook_log: Path
) -> None:
    (shell_writable(tmp_path) / "precious.txt").write_text("keep me")  # bash could remove it
    model = ScriptedModel(function=planner)
    local = local_fleet(store, tmp_path, model, "RECORDER", "BASH_BLOCKER")
    done = local.run("tidy", model="test")
    assert done.status == "completed", done.error
    assert (tmp_path / "precious.txt").read_text() == "keep me", "bash never ran"
    assert "blocked by the operator's policy: no shell on this fleet today" in (done.answer or "")
    seen = events(hook_log)
    kinds = [e["event"] for e in seen]
    assert kinds.count("turn_started") == 4 and kinds.count("turn_ended") == 3
    assert [e["tool"] for e in seen if e["event"] == "tool_finished"] == ["goal", "goal", "bash"]
    assert [e["goal"] for e in seen if e["event"] == "goal_completed"] == ["tidy up"]


def test_a_hook_blocking_the_model_call_ends_the_trace(store: TraceStore, tmp_path: Path) -> None:
    model = ScriptedModel(function=planner)
    local = local_fleet(store, tmp_path, model, "MODEL_BLOCKER")
    done = local.run("tidy", model="test")
    assert done.status == "stopped" and done.run.stop_reason == "hook"
    assert done.error == "model calls are paused by the operator"
    assert model.requests == [], "the model was never called"


def counter(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Lists a different folder each turn (no doom loop) until the third turn answers."""
    turns = sum(m["role"] == "assistant" for m in messages)
    return call("list_files", path=f"d{turns}") if turns < 3 else text("done")


def test_a_context_hook_line_reaches_the_model_in_the_periodic_injection(
    store: TraceStore, tmp_path: Path
) -> None:
    model = ScriptedModel(function=counter)
    local = local_fleet(store, tmp_path, model, "CONTEXT", inject_every_turns=2)
    done = local.run("count", model="test")
    assert done.status == "completed", done.error
    injected = [m for m in store.messages(done.trace_id) if m.metadata.get("injected")]
    assert [m.content for m in injected] == [hookkit.CONTEXT_LINE]
    last = model.requests[-1]
    assert any(hookkit.CONTEXT_LINE in str(m.get("content")) for m in last)


def test_a_hook_that_raises_or_hangs_is_skipped(
    store: TraceStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (shell_writable(tmp_path) / "precious.txt").write_text("keep me")
    model = ScriptedModel(function=planner)
    local = local_fleet(store, tmp_path, model, "RAISER", "HANGER", inject_every_turns=2)
    started = time.monotonic()
    done = local.run("tidy", model="test")
    assert done.status == "completed", done.error
    assert not (tmp_path / "precious.txt").exists(), done.answer
    assert time.monotonic() - started < 10, "each hung call waited its 0.3 s, not a minute"
    assert "hook 'RAISER' turn_started raised RuntimeError: skipped" in caplog.text
    assert "hook 'HANGER' tool_started overran 0.3 s: skipped" in caplog.text


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("tests.hookkit", "is not module:attr"),
        ("no_such_module_xyz:HOOK", "no module 'no_such_module_xyz'"),
        ("tests.hookkit:MISSING", "does not load: AttributeError"),
        ("tests.hookkit:NOT_A_HOOK", "is a object, not a fleet.Hooks instance"),
    ],
)
def test_a_bad_hook_name_is_one_clear_error(name: str, part: str, tmp_path: Path) -> None:
    settings = Settings(workspace=tmp_path, env={}, hooks=(name,))
    with pytest.raises(ConfigError, match="FLEET_HOOKS") as caught:
        build_hooks(settings, MemoryStore())
    assert part in str(caught.value) and "\n" not in str(caught.value)


def test_no_operator_hooks_leave_the_hooks_as_they_were() -> None:
    hooks = build_hooks(Settings(env={}), MemoryStore())
    assert not isinstance(hooks, HookChain) and isinstance(hooks, Hooks)


def test_fleet_exports_hook_blocked_as_a_fleet_error() -> None:
    import fleet
    from fleet.errors import FleetError, HookBlocked

    assert fleet.HookBlocked is HookBlocked and issubclass(HookBlocked, FleetError)
    assert fleet.Hooks is Hooks
    assert os.environ.get(hookkit.LOG_ENV) is None


def explorer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """The root explores two branches; each branch (and then the root) answers at once."""
    task = next(str(m["content"]) for m in messages if m["role"] == "user")
    if task.startswith("survey") and not any(m["role"] == "tool" for m in messages):
        return call("agent", task=["look left", "look right"])
    return text(f"seen: {task[:20]}")


def test_a_hook_sees_each_child_spawned_and_settled_once(
    store: TraceStore, tmp_path: Path, hook_log: Path
) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=explorer), "RECORDER")
    done = local.run("survey", model="test")
    assert done.status == "completed", done.error
    seen = events(hook_log)
    spawned = [e["child"] for e in seen if e["event"] == "child_spawned"]
    settled = [e["child"] for e in seen if e["event"] == "child_settled"]
    assert len(spawned) == 2 and sorted(settled) == sorted(spawned)
    assert {e["trace_id"] for e in seen if e["event"].startswith("child_")} == {done.trace_id}


def test_a_member_keeping_the_no_op_of_an_event_is_not_called_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No guard thread is started for a hook that does nothing on that event."""

    class OnlyTurns(Hooks):
        def __init__(self) -> None:
            self.turns: list[int] = []

        def turn_started(self, trace: Any, iteration: int) -> None:
            self.turns.append(iteration)

    started: list[str] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    hook = OnlyTurns()
    chain = HookChain([Member("plain", Hooks(), 1.0), Member("turns", hook, 1.0)])
    trace: Any = object()
    chain.model_requested(trace, "m", [])
    assert chain.context_lines(trace) == [] and chain.child_context(trace, "t") == {}
    assert started == []
    chain.turn_started(trace, 3)
    assert hook.turns == [3] and started == ["hook:turns:turn_started"]


class _Responded(Hooks):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def model_responded(self, trace: Any, response: LLMResponse) -> None:
        self.seen.append(trace.trace_id)


def test_a_hook_listens_only_to_the_events_it_overrides() -> None:
    responded = _Responded()
    assert responded.listens("model_responded")
    assert not responded.listens("turn_started") and not Hooks().listens("model_requested")
    chain = HookChain([Member("quiet", Hooks()), Member("loud", responded, 0.3)])
    assert chain.listens("model_responded") and not chain.listens("model_failed")
    assert not HookChain([Member("quiet", Hooks())]).listens("model_responded")
    patched = Hooks()
    patched.turn_started = lambda trace, iteration: None  # type: ignore[method-assign]
    assert patched.listens("turn_started"), "a method set on the instance is live too"


def test_a_turn_skips_the_events_nobody_listens_to_and_calls_the_others(tmp_path: Path) -> None:
    # Only model_responded is overridden: it is still called once per model call.
    store = MemoryStore()
    model = ScriptedModel([call("list_dir", path="."), text("done")])
    config = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(config, store, InProcessDispatcher(), clients={"test": model})
    responded = _Responded()
    local = InProcessFleet(replace(runtime, hooks=HookChain([Member("r", responded, 0.3)])))
    result = local.run("work", model="test")
    assert result.status == "completed"
    assert responded.seen == [result.trace_id, result.trace_id]
