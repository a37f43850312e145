"""The agent loop in one process: scripted models, the in-memory store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner
from fleet.models import Message
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.writes import Append, TraceWrite, WriteResult
from fleet.testing import ScriptedModel, call, calls, text


def make_fleet(workspace: Path, model: ScriptedModel, **settings: Any) -> InProcessFleet:
    return InProcessFleet.from_settings(
        Settings(workspace=workspace, env={}, **settings), clients={"test": model}
    )


def task_of(messages: list[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def turns(messages: list[dict[str, Any]]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def explorer(branches: int, branch_step: LLMResponse | None = None) -> ScriptedModel:
    """Main agent explores `branches` tasks; each branch does one step, then answers."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = task_of(messages)
        if task.startswith("branch"):
            if turns(messages) == 0 and branch_step is not None:
                return branch_step
            return text(f"found: {task}")
        if turns(messages) == 0:
            return call("agent", task=[f"branch {i}" for i in range(branches)])
        return text("summary:\n" + str(messages[-1]["content"]))

    return ScriptedModel(function=respond)


def test_explore_five_branches_gives_five_completed_collaborators(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("hello\n")
    local = make_fleet(tmp_path, explorer(5, call("read_file", path="README.md")))
    trace = local.run("survey the repo", model="test")
    assert trace.status == "completed"
    collaborators = local.store.collaborators(trace.trace_id)
    assert len(collaborators) == 5
    assert {c.status for c in collaborators} == {"completed"}
    for c in collaborators:
        child = local.store.get_trace(c.trace_id)
        assert child.parent_trace_id == trace.trace_id
        assert child.root_trace_id == trace.trace_id
        assert child.mode == "explore" and child.preset == "explore"
        assert child.trace_id.startswith(f"{trace.trace_id}@explore-")
        assert c.summary == child.answer
        tool_results = [m for m in local.store.messages(child.trace_id) if m.role == "tool"]
        assert "hello" in (tool_results[0].content or "")
    assert sorted(local.store.children(trace.trace_id)) == sorted(c.trace_id for c in collaborators)
    assert "found: branch 4" in (trace.answer or "")


def test_explore_branch_cannot_write(tmp_path: Path) -> None:
    local = make_fleet(tmp_path, explorer(1, call("write_file", path="pwned.txt", content="x")))
    trace = local.run("try to write", model="test")
    assert trace.status == "completed"
    child_id = local.store.children(trace.trace_id)[0]
    result = next(m for m in local.store.messages(child_id) if m.role == "tool")
    assert result.metadata["is_error"] is True
    assert "not allowed" in (result.content or "")
    assert not (tmp_path / "pwned.txt").exists()


def test_failing_branch_does_not_lose_siblings(tmp_path: Path) -> None:
    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = task_of(messages)
        if task == "branch 2":
            raise RuntimeError("model exploded")
        if task.startswith("branch"):
            return text(f"ok {task}")
        if turns(messages) == 0:
            return call("agent", task=[f"branch {i}" for i in range(4)])
        return text(str(messages[-1]["content"]))

    local = make_fleet(tmp_path, ScriptedModel(function=respond))
    trace = local.run("explore", model="test")
    assert trace.status == "completed"
    statuses = sorted(c.status for c in local.store.collaborators(trace.trace_id))
    assert statuses == ["completed", "completed", "completed", "failed"]
    assert "model exploded" in (trace.answer or "")
    assert "3 completed" in (trace.answer or "")


def test_delegate_runs_one_child_that_cannot_recurse(tmp_path: Path) -> None:
    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        names = {t["function"]["name"] for t in tools}
        task = task_of(messages)
        if task == "sub job":
            assert "agent" not in names and "evaluate" not in names
            if turns(messages) == 0:
                return call("agent", task="recurse")
            return text("child saw: " + str(messages[-1]["content"]))
        if turns(messages) == 0:
            return call("agent", task="sub job")
        return text(str(messages[-1]["content"]))

    local = make_fleet(tmp_path, ScriptedModel(function=respond))
    trace = local.run("delegate it", model="test")
    (child_id,) = local.store.children(trace.trace_id)
    child = local.store.get_trace(child_id)
    assert child.mode == "delegate" and "@delegate-" in child_id
    assert "cannot start sub-agents" in (child.answer or "")
    assert f"sub_trace_id: {child_id}" in (trace.answer or "")
    assert local.store.children(child_id) == []


def test_continue_from_reopens_a_delegate(tmp_path: Path) -> None:
    state: dict[str, str] = {}

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if task_of(messages) == "sub job":
            return text(f"child turn {turns(messages)}")
        if turns(messages) == 0:
            return call("agent", task="sub job")
        if turns(messages) == 1:
            content = str(messages[-1]["content"])
            state["sub"] = content.split("sub_trace_id: ")[1].split()[0]
            return call("agent", task="and more", continue_from=state["sub"])
        return text(str(messages[-1]["content"]))

    local = make_fleet(tmp_path, ScriptedModel(function=respond))
    trace = local.run("two rounds", model="test")
    assert trace.status == "completed"
    assert local.store.children(trace.trace_id) == [state["sub"]]
    assert "child turn 1" in (trace.answer or "")


def test_doom_loop_stops_the_run(tmp_path: Path) -> None:
    model = ScriptedModel([call("list_dir", path=".") for _ in range(5)])
    trace = make_fleet(tmp_path, model).run("loop", model="test")
    assert trace.status == "failed"
    assert trace.run.stop_reason == "doom_loop"
    assert "doom loop" in (trace.error or "")
    assert trace.iteration == 3


def test_max_iterations_stops_the_run(tmp_path: Path) -> None:
    model = ScriptedModel([call("list_dir", path=str(i)) for i in range(40)])
    for i in range(40):
        (tmp_path / str(i)).mkdir()
    trace = make_fleet(tmp_path, model).run("wander", model="test")
    assert trace.status == "failed"
    assert trace.run.stop_reason == "max_iterations"
    assert trace.iteration == 30
    assert "max_iterations=30" in (trace.error or "")


def test_resume_heals_a_call_killed_before_its_result(tmp_path: Path) -> None:
    model = ScriptedModel(["recovered"])
    local = make_fleet(tmp_path, model)
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    store = local.store
    store.append_message(Message(trace_id=root.trace_id, role="system", content="sys"))
    store.append_message(Message(trace_id=root.trace_id, role="user", content="work"))
    orphan = call("read_file", call_id="call_dead", path="x").tool_calls[0]
    store.append_message(
        Message(trace_id=root.trace_id, role="assistant", tool_calls=[orphan.to_openai()])
    )
    store.update_trace(root.trace_id, status="running", iteration=1)

    assert Runner(local.runtime).run(root.trace_id).outcome == "completed"
    sent = model.requests[0]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[-1]["tool_call_id"] == "call_dead"
    assert "interrupted" in sent[-1]["content"]
    healed = [m for m in store.messages(root.trace_id) if m.metadata.get("healed")]
    assert len(healed) == 1


def test_healed_agent_call_names_its_sub_trace(tmp_path: Path) -> None:
    model = ScriptedModel([call("agent", call_id="call_sub", task="job"), "never used"])
    local = make_fleet(tmp_path, model)
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    # Simulate a crash right after the child was created: its dispatcher never ran.
    from fleet.children.subagents import spawn

    store = local.store
    for m in ("sys", "work"):
        store.append_message(Message(trace_id=root.trace_id, role="user", content=m))
    agent_call = model.complete([], []).tool_calls[0]
    store.append_message(
        Message(trace_id=root.trace_id, role="assistant", tool_calls=[agent_call.to_openai()])
    )
    request = spawn(local.runtime, store.get_trace(root.trace_id), agent_call)
    resumed = ScriptedModel(["done"])
    local.runtime.clients["test"] = resumed
    Runner(local.runtime).run(root.trace_id)
    tool_message = resumed.requests[0][-1]
    assert f"sub_trace_id: {request.child_ids[0]}" in tool_message["content"]
    assert "continue_from" in tool_message["content"]


def test_stop_request_stops_between_turns(tmp_path: Path) -> None:
    local = make_fleet(tmp_path, ScriptedModel([]))
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    local.store.request_stop(root.trace_id)
    assert Runner(local.runtime).run(root.trace_id).outcome == "stopped"
    assert local.store.get_trace(root.trace_id).status == "stopped"


def test_duplicate_runner_is_refused_by_the_lease(tmp_path: Path) -> None:
    local = make_fleet(tmp_path, ScriptedModel(["x"]))
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    assert local.store.acquire_lease(root.trace_id, "someone-else", 60_000)
    assert Runner(local.runtime).run(root.trace_id).outcome == "busy"
    assert local.store.messages(root.trace_id) == []


def test_collaborators_and_plan_are_injected_every_ten_turns(tmp_path: Path) -> None:
    script = [call("goal", action="add", description="look around")]
    script += [call("list_dir", path=str(i)) for i in range(11)]
    for i in range(11):
        (tmp_path / str(i)).mkdir()
    model = ScriptedModel([*script, "done"])
    trace = make_fleet(tmp_path, model).run("plan", model="test")
    assert trace.status == "completed"
    tenth = model.requests[10]
    assert tenth[-1]["role"] == "user" and "## Plan" in tenth[-1]["content"]
    assert "look around" in tenth[-1]["content"]


def test_usage_is_recorded_per_message_and_in_stats(tmp_path: Path) -> None:
    local = make_fleet(tmp_path, ScriptedModel([calls(("list_dir", {"path": "."})), "ok"]))
    trace = local.run("count", model="test")
    assistant = [m for m in local.store.messages(trace.trace_id) if m.role == "assistant"]
    assert all(m.prompt_tokens == 10 for m in assistant)
    assert trace.stats.prompt_tokens == 20
    assert trace.stats.messages == 2
    assert trace.stats.completion_tokens == sum(m.completion_tokens for m in assistant)


def test_json_messages_round_trip(tmp_path: Path) -> None:
    local = make_fleet(tmp_path, ScriptedModel([call("list_dir", path="."), "ok"]))
    trace = local.run("x", model="test")
    for message in local.store.messages(trace.trace_id):
        assert Message.model_validate_json(message.model_dump_json()) == message
    json.dumps([m.to_openai() for m in local.store.messages(trace.trace_id)])


@pytest.mark.parametrize("bad", ["unknown-preset"])
def test_unknown_preset_is_a_config_error(tmp_path: Path, bad: str) -> None:
    from fleet.errors import ConfigError

    local = make_fleet(tmp_path, ScriptedModel([]))
    with pytest.raises(ConfigError, match="unknown preset"):
        local.run("x", model="test", preset=bad)


def test_cached_delegate_is_answered_from_the_store(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (tmp_path / "ws").mkdir()
    (agents / "lookup.md").write_text(
        "---\nname: lookup\ndescription: looks things up\ntools: [read_file]\n"
        "cache: {ttl_s: 600, keys: [task]}\n---\nLook it up.\n"
    )

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if task_of(messages) == "what is x":
            return text("x is 42")
        if turns(messages) == 0:
            return call("agent", task="what is x", agent_type="lookup")
        return text(str(messages[-1]["content"]))

    model = ScriptedModel(function=respond)
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path / "ws", agents_dir=agents, env={}), clients={"test": model}
    )
    first = local.run("ask", model="test")
    second = local.run("ask again", model="test")
    assert "x is 42" in (first.answer or "") and "x is 42" in (second.answer or "")
    assert len(local.store.children(first.trace_id)) == 1
    assert local.store.children(second.trace_id) == [], "the second call hit the cache"
    hit = next(m for m in local.store.messages(second.trace_id) if m.role == "tool")
    assert hit.metadata["title"] == "agent (cached)"


def test_a_sub_agent_runs_on_its_presets_model(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (tmp_path / "ws").mkdir()
    (agents / "cheap.md").write_text(
        "---\nname: cheap\ndescription: a cheaper helper\nmodel: cheapmodel\n---\nHelp.\n"
    )
    main_model = ScriptedModel([call("agent", task="sub job", agent_type="cheap"), "done"])
    cheap = ScriptedModel(["cheap answer"])
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path / "ws", agents_dir=agents, env={}),
        clients={"test": main_model, "cheapmodel": cheap},
    )
    trace = local.run("delegate cheaply", model="test")
    assert trace.status == "completed"
    assert len(cheap.requests) == 1
    (child_id,) = local.store.children(trace.trace_id)
    assert local.store.get_trace(child_id).model == "cheapmodel"


def test_a_stop_during_the_model_call_creates_none_of_the_children_it_asks_for(
    tmp_path: Path,
) -> None:
    holder: dict[str, InProcessFleet] = {}

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if task_of(messages).startswith("branch"):
            return call("list_dir", path=".")
        root = holder["fleet"].store.list_traces(1)[0]
        holder["fleet"].store.request_stop(root.trace_id)  # arrives while the model "thinks"
        return call("agent", task=["branch a", "branch b"])

    local = make_fleet(tmp_path, ScriptedModel(function=respond))
    holder["fleet"] = local
    trace = local.run("explore", model="test")
    assert trace.status == "stopped"
    assert local.store.children(trace.trace_id) == [], "no child is created after a stop"


def test_a_read_only_preset_is_not_offered_writing_tools(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (tmp_path / "ws").mkdir()
    (agents / "looker.md").write_text(
        "---\nname: looker\ndescription: looks\nread_only: true\n---\nLook only.\n"
    )
    model = ScriptedModel(["ok"])
    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path / "ws", agents_dir=agents, env={}), clients={"test": model}
    )
    local.run("look", model="test", preset="looker")
    offered = {t["function"]["name"] for t in model.tools_seen[0]}
    assert "read_file" in offered
    assert not offered & {"write_file", "edit_file", "bash"}


def test_continue_from_a_doom_looped_child_heals_its_open_call_first(tmp_path: Path) -> None:
    state: dict[str, str] = {}

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if task_of(messages) == "sub job":
            if messages[-1]["role"] == "user" and turns(messages) > 0:
                return text("recovered")
            return call("list_dir", path=".")  # the same call every turn: a doom loop
        if turns(messages) == 0:
            return call("agent", task="sub job")
        if turns(messages) == 1:
            state["sub"] = str(messages[-1]["content"]).split("sub_trace_id: ")[1].split()[0]
            return call("agent", task="try again", continue_from=state["sub"])
        return text(str(messages[-1]["content"]))

    model = ScriptedModel(function=respond)
    trace = make_fleet(tmp_path, model).run("two rounds", model="test")
    assert trace.status == "completed"
    assert "recovered" in (trace.answer or "")
    child_requests = [r for r in model.requests if task_of(r) == "sub job"]
    roles = [m["role"] for m in child_requests[-1]]
    assert roles[-3:] == ["assistant", "tool", "user"], roles


class WriteLog(MemoryStore):
    """A MemoryStore that notes, per applied write, the roles of the messages it appends."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[str, list[str]]] = []

    def apply(self, write: TraceWrite) -> WriteResult:
        roles: list[str] = [op.message.role for op in write.ops if isinstance(op, Append)]
        self.appends.append((write.trace_id, roles))
        return super().apply(write)


def test_a_read_only_turn_of_plain_tools_is_stored_with_their_results(tmp_path: Path) -> None:
    """A branch's model turn and its list_dir result: one write; a main agent's: two.

    A fresh trace's first messages (system, task) are written with its first model turn.
    """
    log = WriteLog()

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if turns(messages) == 0:
            if task_of(messages) == "survey":
                return call("agent", task=["branch 1"])
            return call("list_dir", path=".")
        if turns(messages) == 1 and task_of(messages) == "look":
            return call("list_dir", path=".")
        return text("done")

    local = InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}),
        store=log,
        clients={"test": ScriptedModel(function=respond)},
    )
    assert local.run("survey", model="test").status == "completed"
    branch = next(t for t, _ in log.appends if "@explore" in t)
    # The branch's first messages wait for its first model turn, which waits for its tool.
    assert [roles for t, roles in log.appends if t == branch and roles] == [
        ["system", "user", "assistant", "tool"],
        ["assistant"],
    ]
    assert local.run("look", model="test").status == "completed"
    main = log.appends[-1][0]
    assert [roles for t, roles in log.appends if t == main and roles] == [
        ["system", "user", "assistant"],
        ["tool"],
        ["assistant"],
        ["tool"],
        ["assistant"],
    ]
