"""Tool calls that wait for a person's approval, in one process: scripted models, every store."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet.config.approval_rules import ApprovalRule, ApprovalRuleIn, needs_approval, rules_of
from fleet.conversation import approval
from fleet.conversation.human import time_out_waits, waiting_on
from fleet.errors import ConversationError
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.llm.config import FleetConfig
from fleet.models import Trace, now_ms
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text


def local_fleet(
    store: TraceStore, workspace: Path, model: ScriptedModel, *rules: ApprovalRule
) -> InProcessFleet:
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    default = replace(runtime.presets["default"], approve=rules or (ApprovalRule("write_file"),))
    return InProcessFleet(replace(runtime, presets={**runtime.presets, "default": default}))


def writer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Writes a file once, then answers with the tool's result."""
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return call("write_file", call_id="w1", path="out.txt", content="written")
    return text(f"tool said: {results[-1]['content']}")


def test_a_call_needing_approval_waits_unrun_and_approve_runs_it(
    store: TraceStore, tmp_path: Path
) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=writer))
    trace = local.run("write it", model="test")
    assert trace.status == "waiting" and not (tmp_path / "out.txt").exists()
    pending = approval.pending(trace)
    assert pending is not None and pending["tool"] == "write_file"
    assert pending["arguments"] == {"path": "out.txt", "content": "written"}
    (entry,) = store.collaborators(trace.trace_id)
    assert (entry.type, entry.status) == ("approval", "waiting")
    assert store.expired_leases(now_ms() + 10**9) == [], "no runner holds the trace"
    done = local.approve(trace.trace_id, pending["tool_call_id"])
    assert done.status == "completed", done.error
    assert (tmp_path / "out.txt").read_text() == "written"
    assert done.run.approved_call is None and waiting_on(done) is None
    assert store.collaborators(trace.trace_id)[0].status == "completed"


def test_deny_gives_the_model_the_reason_and_runs_nothing(
    store: TraceStore, tmp_path: Path
) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=writer))
    trace = local.run("write it", model="test")
    done = local.deny(trace.trace_id, "not on a Friday")
    assert done.status == "completed" and "not on a Friday" in (done.answer or "")
    assert not (tmp_path / "out.txt").exists()
    assert store.collaborators(trace.trace_id)[0].status == "failed"


def test_a_second_answer_a_forged_id_and_reply_are_refused(
    store: TraceStore, tmp_path: Path
) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=writer))
    trace = local.run("write it", model="test")
    with pytest.raises(ConversationError, match="is not the call"):
        approval.approve(local.runtime, trace.trace_id, "call_forged")
    from fleet.conversation import human

    with pytest.raises(ConversationError, match="fleet approve"):
        human.reply(local.runtime, trace.trace_id, "yes")
    approval.deny(local.runtime, trace.trace_id, "no")  # queued, not yet run
    before = store.messages(trace.trace_id)
    with pytest.raises(ConversationError, match="no approval pending"):
        approval.approve(local.runtime, trace.trace_id)
    assert store.messages(trace.trace_id) == before
    assert not (tmp_path / "out.txt").exists()


def test_a_timeout_ends_the_wait_as_a_denial(store: TraceStore, tmp_path: Path) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=writer))
    trace = local.run("write it", model="test")
    later_ms = now_ms() + 25 * 3600 * 1000
    assert time_out_waits(local.runtime, later_ms) == [trace.trace_id]
    with pytest.raises(ConversationError):
        approval.approve(local.runtime, trace.trace_id)
    done = local._run(trace.trace_id)
    assert done.status == "completed" and "Not run" in (done.answer or "")
    assert not (tmp_path / "out.txt").exists()


def test_fleet_yaml_rules_apply_to_every_preset(store: TraceStore, tmp_path: Path) -> None:
    local = local_fleet(store, tmp_path, ScriptedModel(function=writer), ApprovalRule("bash"))
    config = FleetConfig(approve=("write_file",))
    local = InProcessFleet(replace(local.runtime, config=config))
    assert local.run("write it", model="test").status == "waiting"


@pytest.mark.parametrize(
    ("arguments", "needed"),
    [
        ('{"path": "a.py", "content": "x"}', True),
        ('{"path": "a.txt", "content": "x"}', False),
        ('{"content": "x"}', False),
        ("not json", False),
    ],
)
def test_argument_patterns_narrow_a_rule(arguments: str, needed: bool) -> None:
    rules = rules_of([ApprovalRuleIn(tool="write_file", arguments={"path": "*.py"})])
    assert needs_approval(rules, "write_file", arguments) is needed
    assert not needs_approval(rules, "read_file", arguments)


def test_a_tool_only_rule_holds_even_unparsed_arguments() -> None:
    assert needs_approval(rules_of(["bash", "mcp__*"]), "bash", "not json")
    assert needs_approval(rules_of(["mcp__*"]), "mcp__git__push", "{}")


def test_a_stop_ends_the_wait_and_the_call_never_runs(store: TraceStore, tmp_path: Path) -> None:
    from fleet.lifecycle import stop_subtree

    local = local_fleet(store, tmp_path, ScriptedModel(function=writer))
    trace = local.run("write it", model="test")
    stop_subtree(local.runtime, trace.trace_id)
    assert store.get_trace(trace.trace_id).status == "stopped"
    assert store.collaborators(trace.trace_id)[0].status == "stopped"
    with pytest.raises(ConversationError, match="no approval pending"):
        approval.approve(local.runtime, trace.trace_id)
    again = local.continue_trace(trace.trace_id, "go on")
    assert again.status == "completed" and not (tmp_path / "out.txt").exists()


def test_an_in_process_sub_agent_is_refused_rather_than_left_waiting() -> None:
    from fleet.llm.base import ToolCall
    from fleet.models import Trace

    branch = Trace(trace_id="r@explore-000", root_trace_id="r", task="look", mode="explore")
    call_ = ToolCall("c1", "read_file", '{"path": "a"}')
    refused = approval.refusal(call_, branch, first=True, children_wait=False)
    assert refused is not None and refused.is_error and "in-process sub-agent" in refused.output
    assert approval.refusal(call_, branch, first=True, children_wait=True) is None, "on Celery"
    main = branch.model_copy(update={"mode": "main"})
    assert approval.refusal(call_, main, first=True) is None
    assert "one approval or question per turn" in approval.refusal(call_, main, first=False).output  # type: ignore[union-attr]


def test_approve_entries_load_from_a_preset_file_and_fleet_yaml(tmp_path: Path) -> None:
    from fleet.errors import ConfigError
    from fleet.llm.config import load_config
    from fleet.presets import load_preset_file

    preset = tmp_path / "guarded.md"
    preset.write_text(
        "---\napprove: [bash, {tool: write_file, arguments: {path: '*.py'}}]\n---\nBe careful.\n"
    )
    rules = load_preset_file(preset).approve
    assert rules == (ApprovalRule("bash"), ApprovalRule("write_file", (("path", "*.py"),)))
    config = tmp_path / "fleet.yaml"
    config.write_text("approve: [write_file]\n")
    assert load_config(config, env={}).approve == ("write_file",)
    preset.write_text("---\napprove: [{tool: bash, when: always}]\n---\nx\n")
    with pytest.raises(ConfigError, match="approve"):
        load_preset_file(preset)


def test_the_workers_secret_never_reaches_the_approval_a_person_sees(
    store: TraceStore, tmp_path: Path
) -> None:
    secret = "sk-approval-secret-0123456789abcdef"

    def leaker(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if any(m["role"] == "tool" for m in messages):
            return text("done")
        return call("write_file", path="leak.txt", content=f"key={secret}")

    local = local_fleet(store, tmp_path, ScriptedModel(function=leaker))
    runtime = local.runtime
    local = InProcessFleet(replace(runtime, redactor=runtime.redactor.with_values([secret])))
    trace = local.run("leak it", model="test")
    pending = approval.pending(trace)
    assert pending is not None and secret not in str(pending)
    assert secret not in str([c.model_dump() for c in store.collaborators(trace.trace_id)])
    done = local.approve(trace.trace_id)
    assert done.status == "completed"
    assert secret not in (tmp_path / "leak.txt").read_text(), "it runs as stored: masked"


def test_racing_answers_land_exactly_once(store: TraceStore, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    local = local_fleet(store, tmp_path, ScriptedModel(function=writer))
    trace = local.run("write it", model="test")

    def answer(i: int) -> str:
        try:
            if i % 2:
                approval.approve(local.runtime, trace.trace_id)
            else:
                approval.deny(local.runtime, trace.trace_id, f"no {i}")
        except ConversationError:
            return "refused"
        return "landed"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(answer, range(16)))
    assert outcomes.count("landed") == 1, outcomes
    done = local._run(trace.trace_id)
    assert done.status == "completed"
    results = [m for m in store.messages(trace.trace_id) if m.role == "tool"]
    assert len(results) == 1, "one result for the one call: run once or denied once"


def test_a_stop_during_the_approved_call_ends_the_trace_stopped(
    store: TraceStore, tmp_path: Path
) -> None:
    # The approved call runs as the trace resumes (`fleet.loop.resume`), before its loop: a
    # stop cutting it there ends the trace `stopped`, as in the loop (a chaos run saw the
    # cut escape as a crash, the trace failed).
    from fleet.lifecycle import stop_subtree
    from tests.test_stop_cuts_tool_http import hanging_server, wait_for

    with hanging_server() as server:
        url = f"{server.url}/slow"

        def fetcher(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
            if not [m for m in messages if m["role"] == "tool"]:
                return call("web_fetch", call_id="f1", url=url)
            return text("unused")

        settings = Settings(workspace=tmp_path, env={}, web_allow=("127.0.0.1",))
        model = ScriptedModel(function=fetcher)
        runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
        rules = (ApprovalRule("web_fetch"),)
        default = replace(runtime.presets["default"], approve=rules)
        local = InProcessFleet(replace(runtime, presets={**runtime.presets, "default": default}))
        trace = local.run("fetch it", model="test")
        assert trace.status == "waiting" and not server.held
        ended: list[Trace] = []
        approver = threading.Thread(
            target=lambda: ended.append(local.approve(trace.trace_id)), daemon=True
        )
        approver.start()
        wait_for(lambda: server.held, 20)
        stop_subtree(local.runtime, trace.trace_id)
        approver.join(30)
    assert [t.status for t in ended] == ["stopped"]
    assert store.get_trace(trace.trace_id).error == "stop requested"
