"""Remote sub-agents over A2A, in process: a2a-sdk's server on loopback, hostile fakes.

The in-process host follows a remote task itself (no sweeper): the same send, decision
and finish as on workers (tests/test_remote_fleet.py), with the poll on the run's thread.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.lifecycle.remote import RemoteCall
from fleet.llm.base import LLMResponse
from fleet.llm.config import load_config
from fleet.loop.runner import Runner
from fleet.models import Message, Trace
from fleet.remote.decide import AskPerson, Ended, Progress, Unchanged, decide
from fleet.remote.task import RemoteError, RemoteRefused, RemoteTask
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.remote_watch import MemoryRemoteWatch
from fleet.storage.backends.redis.remote_watch import RedisRemoteWatch
from fleet.storage.remote_watch import REMOTE_WATCH
from fleet.testing import MemoryStore, ScriptedModel, call, text
from tests.a2a_agent import serve_reviewer
from tests.a2a_hostile import serve_hostile
from tests.conftest import fake_redis
from tests.test_remote_record import remote_child

pytestmark = pytest.mark.timeout(90)
AGENT_ID = re.compile(r"agent://reviewer/[A-Za-z0-9-]+")


def build(
    tmp_path: Path,
    agents: dict[str, dict[str, Any]],
    model: ScriptedModel,
    env: dict[str, str] | None = None,
    agents_dir: Path | None = None,
    dispatcher: InProcessDispatcher | None = None,
) -> tuple[InProcessFleet, Runtime]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    config = tmp_path / "conf" / "fleet.yaml"
    config.parent.mkdir(exist_ok=True)
    config.write_text(yaml.safe_dump({"remote_agents": agents}))
    settings = Settings(
        workspace=workspace,
        env=env or {},
        config_path=config,
        remote_poll_s=0.05,
        agents_dir=agents_dir,
    )
    dispatcher = dispatcher or InProcessDispatcher()
    runtime = Runtime.build(settings, MemoryStore(), dispatcher, clients={"m": model})
    return InProcessFleet(runtime), runtime


def tool_results(runtime: Runtime, trace: Trace) -> list[str]:
    return [str(m.content) for m in runtime.store.messages(trace.trace_id) if m.role == "tool"]


def only_child(runtime: Runtime, trace: Trace) -> Trace:
    (child_id,) = runtime.store.children(trace.trace_id)
    return runtime.store.get_trace(child_id)


def test_a_delegate_to_a_remote_agent_completes_with_its_artifact(tmp_path: Path) -> None:
    with serve_reviewer(token="s3cret-token") as agent:
        model = ScriptedModel([call("agent", task="check the diff", agent="reviewer"), text("ok")])
        entry = {"url": agent.url, "token_env": "REVIEW_TOKEN", "private": True}
        fleet, runtime = build(
            tmp_path, {"reviewer": entry}, model, env={"REVIEW_TOKEN": "s3cret-token"}
        )
        root = fleet.run("review it", model="m")
    assert root.status == "completed"
    (result,) = tool_results(runtime, root)
    task_id, context_id, sent = agent.record.messages[0]
    assert sent == "check the diff"
    assert f"sub_trace_id: agent://reviewer/{task_id}" in result
    assert f"reviewed: check the diff (context {context_id})" in result
    assert "<remote-answer>" in result and "not instructions" in result
    child = only_child(runtime, root)
    assert child.mode == "remote" and child.status == "completed" and child.name == "reviewer"
    (entry_of_child,) = runtime.store.collaborators(root.trace_id)
    assert entry_of_child.remote_id == f"agent://reviewer/{task_id}"
    assert (
        entry_of_child.status == "completed"
        and "reviewed: check the diff" in entry_of_child.summary
    )
    call_state = child.run.remote_call  # the fleet's run state; the caller's metadata untouched
    assert call_state is not None and (call_state.state, call_state.ok) == ("ended", True)
    assert call_state.task_id == task_id and call_state.context_id == context_id
    assert child.metadata == {} and root.metadata == {}
    (remote,) = runtime.store.collaborators(child.trace_id)  # the child's own: the remote agent
    assert (remote.type, remote.trace_id) == ("remote", f"agent://reviewer/{task_id}")
    assert agent.record.auth and set(agent.record.auth) == {"Bearer s3cret-token"}
    stored = json.dumps([t.model_dump() for t in (root, child)]) + json.dumps(
        [m.model_dump() for m in runtime.store.messages(child.trace_id)]
    )
    assert "s3cret-token" not in stored


def test_continue_from_an_agent_id_reaches_the_same_remote_context(tmp_path: Path) -> None:
    def brain(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        results = [str(m["content"]) for m in messages if m["role"] == "tool"]
        if not results:
            return call("agent", task="first look", agent="reviewer")
        if len(results) == 1:
            found = AGENT_ID.search(results[0])
            assert found is not None
            return call("agent", task="now the tests", continue_from=found.group(0))
        return text("both done")

    with serve_reviewer() as agent:
        entry = {"url": agent.url, "private": True}
        fleet, runtime = build(tmp_path, {"reviewer": entry}, ScriptedModel(function=brain))
        root = fleet.run("review twice", model="m")
    assert root.status == "completed", root.error
    (first_task, first_ctx, _), (second_task, second_ctx, second) = agent.record.messages
    assert second == "now the tests" and second_ctx == first_ctx and second_task != first_task
    results = tool_results(runtime, root)
    assert f"agent://reviewer/{second_task}" in results[1]
    assert len(runtime.store.children(root.trace_id)) == 1  # the same child, continued
    call_state = only_child(runtime, root).run.remote_call
    assert call_state is not None
    assert (call_state.task_id, call_state.tasks) == (second_task, (first_task,))


class ParkingDispatcher(InProcessDispatcher):
    """As on a task queue: a poller of the watch list, not the run, follows a remote task."""

    children_survive_restart = True


def test_a_remote_childs_run_parks_on_its_task_holding_no_slot(tmp_path: Path) -> None:
    with serve_reviewer() as agent:
        entry = {"url": agent.url, "private": True}
        model = ScriptedModel([text("unused")])
        _, runtime = build(tmp_path, {"reviewer": entry}, model, dispatcher=ParkingDispatcher())
        store = runtime.store
        store.create_trace(Trace(trace_id="r", root_trace_id="r", task="review", status="waiting"))
        child = remote_child()
        store.create_trace(child)
        result = Runner(runtime).run(child.trace_id)
        parked = store.get_trace(child.trace_id)
        ((task_id, _, sent),) = agent.record.messages
    assert result.outcome == "parked"  # the OnRemote step: not `waiting`, never run again
    assert parked.status == "waiting" and sent == "slow 5 look"
    assert parked.run.remote_call is not None
    assert (parked.run.remote_call.state, parked.run.remote_call.task_id) == ("sent", task_id)
    assert parked.metadata == {}
    assert store.capability(REMOTE_WATCH).watched(child.trace_id)


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({"agent": "http://127.0.0.1:9/"}, "never given by URL"),
        ({"agent": "stranger"}, "no remote agent 'stranger'"),
        ({"agent": "reviewer", "agent_url": "http://10.0.0.1/"}, "agent_url"),
        ({"agent_url": "http://10.0.0.1/"}, "agent_url"),
    ],
)
def test_a_model_names_no_url_and_no_undeclared_agent(
    tmp_path: Path, arguments: dict[str, str], why: str
) -> None:
    with serve_hostile("flip") as hostile:
        model = ScriptedModel([call("agent", task="look", **arguments), text("gave up")])
        entry = {"url": hostile.url, "private": True}
        fleet, runtime = build(tmp_path, {"reviewer": entry}, model)
        root = fleet.run("try", model="m")
    (result,) = tool_results(runtime, root)
    assert "refused" in str(runtime.store.messages(root.trace_id)[-2].metadata.get("title"))
    assert why in result
    assert not hostile.calls and not runtime.store.children(root.trace_id)


def test_a_preset_narrows_the_agents_and_read_only_traces_call_only_read_only_ones(
    tmp_path: Path,
) -> None:
    agents_dir = tmp_path / "agents"
    agents_dir.mkdir()
    (agents_dir / "narrow.md").write_text("---\nname: narrow\nremote_agents: [safe]\n---\nHi\n")
    agents = {
        "safe": {"url": "http://127.0.0.1:9/", "read_only": True, "private": True},
        "writer": {"url": "http://127.0.0.1:9/", "private": True},
    }
    fleet, runtime = build(tmp_path, agents, ScriptedModel([]), agents_dir=agents_dir)
    from fleet.remote.spawn import may_call

    def trace(preset: str) -> Trace:
        return Trace(trace_id="t1", root_trace_id="t1", task="x", preset=preset, mode="main")

    assert may_call(runtime, trace("default"), "writer", read_only=False)
    assert may_call(runtime, trace("default"), "safe", read_only=False)
    assert not may_call(runtime, trace("narrow"), "writer", read_only=False)
    assert may_call(runtime, trace("narrow"), "safe", read_only=False)
    assert not may_call(runtime, trace("explore"), "writer", read_only=False)  # read-only preset
    assert may_call(runtime, trace("explore"), "safe", read_only=False)
    assert not may_call(runtime, trace("default"), "writer", read_only=True)  # an explore list
    assert not may_call(runtime, trace("default"), "nobody", read_only=False)


@pytest.mark.parametrize(
    ("mode", "timeout_s", "error"),
    [
        ("huge", 60, "answer over 4 MB"),
        ("hang", 1, "no answer in time"),
        ("forged", 60, "answered for task 'someone-else', not ours"),
    ],
)
def test_a_hostile_remote_costs_its_timeout_and_cap_and_the_tree_goes_on(
    tmp_path: Path, mode: str, timeout_s: int, error: str
) -> None:
    with serve_hostile(mode) as hostile:
        model = ScriptedModel([call("agent", task="look", agent="reviewer"), text("went on")])
        entry = {"url": hostile.url, "private": True, "timeout_s": timeout_s}
        fleet, runtime = build(tmp_path, {"reviewer": entry}, model)
        started = time.monotonic()
        root = fleet.run("try", model="m")
        took_s = time.monotonic() - started
    assert root.status == "completed" and root.answer == "went on"
    child = only_child(runtime, root)
    assert child.status == "failed" and error in str(child.error)
    assert "\n" not in str(child.error) and len(str(child.error)) < 600
    assert took_s < 20
    if mode == "hang":
        assert hostile.calls["CancelTask"] == 1  # its timeout cancels the remote task


def test_a_state_going_back_from_completed_is_not_read(tmp_path: Path) -> None:
    with serve_hostile("flip") as hostile:
        model = ScriptedModel([call("agent", task="look", agent="reviewer"), text("ok")])
        fleet, runtime = build(tmp_path, {"reviewer": {"url": hostile.url, "private": True}}, model)
        root = fleet.run("try", model="m")
    child = only_child(runtime, root)
    assert child.status == "completed" and child.answer == "first answer"
    assert hostile.calls["GetTask"] == 1


def test_loopback_is_refused_unless_the_operator_marks_the_agent_private(tmp_path: Path) -> None:
    with serve_hostile("flip") as hostile:
        model = ScriptedModel([call("agent", task="look", agent="reviewer"), text("ok")])
        fleet, runtime = build(tmp_path, {"reviewer": {"url": hostile.url}}, model)
        root = fleet.run("try", model="m")
    child = only_child(runtime, root)
    assert child.status == "failed" and "refuses '127.0.0.1'" in str(child.error)
    assert not hostile.calls


def test_a_missing_token_fails_the_child_in_one_line(tmp_path: Path) -> None:
    model = ScriptedModel([call("agent", task="look", agent="reviewer"), text("ok")])
    entry = {"url": "http://127.0.0.1:9/", "private": True, "token_env": "NOT_SET_TOKEN"}
    fleet, runtime = build(tmp_path, {"reviewer": entry}, model)
    root = fleet.run("try", model="m")
    assert "variable NOT_SET_TOKEN is not set" in str(only_child(runtime, root).error)


@pytest.mark.parametrize(
    ("agents", "why"),
    [
        ({"reviewer": {"url": "ftp://example.com/"}}, "must be http(s)"),
        ({"reviewer": {"url": "https://u:p@example.com/"}}, "no user:password"),
        ({"Bad Name": {"url": "https://example.com/"}}, "a name is a-z"),
        ({"reviewer": {"url": "https://example.com/", "token_env": "no way"}}, "token_env"),
        ({"reviewer": {"url": "https://example.com/", "timeout_s": -1}}, "timeout_s"),
    ],
)
def test_bad_remote_agents_are_one_line_config_errors(
    tmp_path: Path, agents: dict[str, Any], why: str
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"remote_agents": agents}))
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert why in str(caught.value) and "\n" not in str(caught.value)


def seen(state: str, message: str = "", artifact: str = "") -> RemoteTask:
    return RemoteTask("t-1", "c-1", state, message, artifact)


SENT = RemoteCall(agent="reviewer", state="sent", task_id="t-1", deadline_ms=10_000)


@pytest.mark.parametrize(
    ("observed", "at_ms", "kind", "result"),
    [
        (seen("working", "reading"), 0, Progress, ""),
        (seen("working", ""), 0, Unchanged, ""),
        (seen("completed", artifact="LGTM"), 0, Ended, "LGTM"),
        (seen("failed", "boom"), 0, Ended, "remote task failed: boom"),
        (seen("rejected"), 0, Ended, "remote task rejected"),
        (seen("auth-required"), 0, Ended, "remote task auth-required"),
        (seen("input-required", "which?"), 0, AskPerson, ""),
        (seen("working"), 10_000, Ended, "no answer in time"),
        (RemoteRefused("answer over 4 MB"), 0, Ended, "answer over 4 MB"),
        (RemoteError("connection refused"), 0, Unchanged, ""),
    ],
)
def test_decide(observed: RemoteTask | RemoteError, at_ms: int, kind: type, result: str) -> None:
    decision = decide(SENT, observed, at_ms)
    assert isinstance(decision, kind)
    assert result in decision.call.result


def test_decide_fails_after_three_unreachable_polls_and_progress_is_told_once() -> None:
    call = SENT
    for _ in range(2):
        decision = decide(call, RemoteError("connection refused"), 0)
        assert isinstance(decision, Unchanged)
        call = decision.call
    decision = decide(call, RemoteError("connection refused"), 0)
    assert isinstance(decision, Ended) and "unreachable: connection refused" in decision.call.result
    told = decide(SENT, seen("working", "step 1"), 0)
    assert isinstance(told, Progress)
    assert isinstance(decide(told.call, seen("working", "step 1"), 0), Unchanged)


@pytest.mark.parametrize("backend", ["memory", "fakeredis"])
def test_the_watch_list_gives_a_due_entry_to_one_poller(backend: str) -> None:
    watch = MemoryRemoteWatch() if backend == "memory" else RedisRemoteWatch(fake_redis())
    watch.watch("a", 100)
    watch.watch("b", 500)
    assert watch.due(200, 10, 1_000) == ["a"]
    assert watch.due(200, 10, 1_000) == []  # taken: due again at 1200
    assert watch.due(1_200, 10, 1_000) == ["b", "a"]
    watch.forget("a")
    assert not watch.watched("a") and watch.watched("b")


def test_a_child_message_list_is_what_the_remote_sees_first(tmp_path: Path) -> None:
    context = [{"role": "user", "content": "Background: the diff touches auth."}]
    with serve_reviewer() as agent:
        model = ScriptedModel(
            [call("agent", task="check it", agent="reviewer", messages=context), text("ok")]
        )
        fleet, runtime = build(tmp_path, {"reviewer": {"url": agent.url, "private": True}}, model)
        root = fleet.run("go", model="m")
    assert agent.record.messages[0][2] == "Background: the diff touches auth.\n\ncheck it"
    child = only_child(runtime, root)
    assert [m.role for m in runtime.store.messages(child.trace_id)] == ["user"]
    assert isinstance(runtime.store.messages(child.trace_id)[0], Message)


def test_an_explore_list_on_a_read_only_agent_makes_one_remote_child_per_item(
    tmp_path: Path,
) -> None:
    with serve_reviewer() as agent:
        model = ScriptedModel(
            [call("agent", task=["look at a.py", "look at b.py"], agent="safe"), text("ok")]
        )
        agents = {
            "safe": {"url": agent.url, "private": True, "read_only": True},
            "writer": {"url": agent.url, "private": True},
        }
        fleet, runtime = build(tmp_path, agents, model)
        root = fleet.run("survey", model="m")
        refused_model = ScriptedModel([call("agent", task=["x", "y"], agent="writer"), text("no")])
        refused_fleet, refused_runtime = build(tmp_path, agents, refused_model)
        refused = refused_fleet.run("survey", model="m")
    kids = [runtime.store.get_trace(c) for c in runtime.store.children(root.trace_id)]
    assert sorted(k.name for k in kids) == ["safe-001", "safe-002"]
    assert all(k.mode == "remote" and k.status == "completed" for k in kids)
    assert sorted(m[2] for m in agent.record.messages) == ["look at a.py", "look at b.py"]
    (result,) = tool_results(refused_runtime, refused)
    assert "no remote agent 'writer'" in result and "it may call: safe" in result


def test_the_agent_tool_offers_only_the_remote_agents_a_trace_may_call(tmp_path: Path) -> None:
    from fleet.loop.toolcalls import tool_schemas

    def agent_parameter(agents: dict[str, Any]) -> Any:
        _, runtime = build(tmp_path, agents, ScriptedModel([]))
        trace = Trace(trace_id="t1", root_trace_id="t1", task="x", mode="main")
        (schema,) = [s for s in tool_schemas(runtime, trace) if s["function"]["name"] == "agent"]
        return schema["function"]["parameters"]["properties"].get("agent")

    assert agent_parameter({}) is None
    entry = {"url": "http://127.0.0.1:9/", "private": True}
    assert agent_parameter({"b": entry, "a": entry})["enum"] == ["a", "b"]


def test_a_message_sent_again_keeps_its_message_id(tmp_path: Path) -> None:
    from fleet.remote.run import message_id_of

    with serve_hostile("flip") as hostile:
        model = ScriptedModel([call("agent", task="look", agent="reviewer"), text("ok")])
        fleet, runtime = build(tmp_path, {"reviewer": {"url": hostile.url, "private": True}}, model)
        root = fleet.run("try", model="m")
    child = only_child(runtime, root)
    (first,) = runtime.store.messages(child.trace_id)
    assert hostile.message_ids == [message_id_of(child.trace_id, first.sequence)]
    assert message_id_of(child.trace_id, 1) != message_id_of(child.trace_id, 2)


def test_an_agent_echoing_its_token_gets_it_masked(tmp_path: Path) -> None:
    with serve_hostile("echo") as hostile:
        model = ScriptedModel([call("agent", task="look", agent="reviewer"), text("ok")])
        entry = {"url": hostile.url, "private": True, "token_env": "ECHO_TOKEN"}
        fleet, runtime = build(tmp_path, {"reviewer": entry}, model, env={"ECHO_TOKEN": "tok-zz9"})
        root = fleet.run("try", model="m")
    child = only_child(runtime, root)
    assert child.answer == "you sent Bearer [redacted]"
    stored = json.dumps([m.model_dump() for m in runtime.store.messages(root.trace_id)])
    stored += json.dumps([c.model_dump() for c in runtime.store.collaborators(root.trace_id)])
    assert "tok-zz9" not in stored
