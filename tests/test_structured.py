"""Structured results, context fitting and goal links, in one process over every store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import ConfigError, ContextOverflow
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.llm.config import FleetConfig, ModelConfig
from fleet.loop.fit import estimate_tokens, fit
from fleet.loop.structured import VERDICT_SCHEMA, parse
from fleet.presets import AgentPreset, load_preset_file
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text

SCHEMA = {
    "type": "object",
    "properties": {"files": {"type": "integer"}, "names": {"type": "array"}},
    "required": ["files", "names"],
}


def users(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages if m["role"] == "user"]


def assistants(messages: list[dict[str, Any]]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def local_fleet(
    store: TraceStore, workspace: Path, model: ScriptedModel, **presets: AgentPreset
) -> InProcessFleet:
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    runtime = Runtime(**{**runtime.__dict__, "presets": {**runtime.presets, **presets}})
    return InProcessFleet(runtime)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"verdict": "pass", "reasons": ["ok"], "suggestions": []}', "pass"),
        ('Here:\n```json\n{"verdict": "fail", "reasons": [], "suggestions": ["x"]}\n```', "fail"),
        ("VERDICT: partial\nREASONS:\n- half done\nSUGGESTIONS:\n- finish it", "partial"),
    ],
)
def test_a_verdict_is_read_from_json_or_the_text_form(answer: str, expected: str) -> None:
    found = parse(answer, VERDICT_SCHEMA, verdict_text=True)
    assert isinstance(found, dict) and found["verdict"] == expected


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("looks good to me", "holds no JSON object"),
        (
            '{"verdict": "maybe", "reasons": [], "suggestions": []}',
            "verdict: 'maybe' is not one of",
        ),
        ('{"verdict": "pass"}', "'reasons' is a required property"),
    ],
)
def test_a_bad_verdict_names_what_is_wrong(answer: str, error: str) -> None:
    found = parse(answer, VERDICT_SCHEMA, verdict_text=True)
    assert isinstance(found, str) and error in found


def evaluating(first_answer: str) -> ScriptedModel:
    """Main evaluates, then answers with the tool result; the judge's first answer varies."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if users(messages)[0].startswith("Evaluate whether"):
            return text(
                first_answer
                if assistants(messages) == 0
                else "VERDICT: pass\nREASONS:\n- ok\nSUGGESTIONS:\n- none"
            )
        if assistants(messages) == 0:
            return call("evaluate")
        return text(str(messages[-1]["content"]))

    return ScriptedModel(function=respond)


def test_an_evaluate_without_a_verdict_is_corrected(store: TraceStore, tmp_path: Path) -> None:
    local = local_fleet(store, tmp_path, evaluating("it looks fine"))
    root = local.run("ship it", model="test")
    assert root.status == "completed"
    (judge_id,) = store.children(root.trace_id)
    judge = store.get_trace(judge_id)
    assert judge.output == {"verdict": "pass", "reasons": ["ok"], "suggestions": ["none"]}
    corrections = [m for m in store.messages(judge_id) if m.metadata.get("correction")]
    assert len(corrections) == 1 and "holds no JSON object" in (corrections[0].content or "")
    (entry,) = store.collaborators(root.trace_id)
    assert entry.output == judge.output
    assert "verdict: pass" in (root.answer or "")
    assert json.loads((root.answer or "").split("```json\n")[1].split("```")[0]) == judge.output


def reporter(answers: list[str]) -> ScriptedModel:
    """Main delegates to the reporter preset; the reporter answers from `answers` in turn."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if users(messages)[0] == "count the files":
            return text(answers[min(assistants(messages), len(answers) - 1)])
        if assistants(messages) == 0:
            return call("agent", task="count the files", agent_type="reporter")
        return text(str(messages[-1]["content"]))

    return ScriptedModel(function=respond)


def test_an_output_schema_answer_reaches_the_parent_as_json(
    store: TraceStore, tmp_path: Path
) -> None:
    preset = AgentPreset(name="reporter", output_schema=SCHEMA)
    model = reporter(["3 files", '{"files": "3"}', '{"files": 3, "names": ["a", "b", "c"]}'])
    root = local_fleet(store, tmp_path, model, reporter=preset).run("report", model="test")
    assert root.status == "completed"
    child = store.get_trace(store.children(root.trace_id)[0])
    assert child.output == {"files": 3, "names": ["a", "b", "c"]}
    assert "JSON Schema" in (store.messages(child.trace_id)[0].content or ""), "told up front"
    parsed = json.loads((root.answer or "").split("```json\n")[1].split("```")[0])
    assert parsed == child.output


def test_two_failed_corrections_fail_the_trace(store: TraceStore, tmp_path: Path) -> None:
    preset = AgentPreset(name="reporter", output_schema=SCHEMA)
    model = reporter(["no idea"])
    root = local_fleet(store, tmp_path, model, reporter=preset).run("report", model="test")
    child = store.get_trace(store.children(root.trace_id)[0])
    assert child.status == "failed" and child.output is None
    assert "after 2 corrections: the answer holds no JSON object" in (child.error or "")
    assert child.run.stop_reason == "output_schema"
    assert sum(1 for m in store.messages(child.trace_id) if m.role == "assistant") == 3


def test_a_preset_file_declares_its_output_schema(tmp_path: Path) -> None:
    path = tmp_path / "reporter.md"
    path.write_text(
        "---\nname: reporter\noutput_schema:\n  type: object\n  required: [files]\n---\nCount.\n"
    )
    assert load_preset_file(path).output_schema == {"type": "object", "required": ["files"]}
    path.write_text("---\nname: reporter\noutput_schema: {type: 12}\n---\nCount.\n")
    with pytest.raises(ConfigError, match=r"reporter.md: .*output_schema"):
        load_preset_file(path)


# -- context fitting -------------------------------------------------------------------


def conversation(outputs: int, size: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "system prompt"},
        {"role": "user", "content": "the task"},
    ]
    for i in range(outputs):
        out.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}"}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": str(i) * size})
    return out


def test_fit_elides_the_oldest_tool_outputs_first() -> None:
    messages = conversation(5, 2000)
    assert fit(messages, [], None, 0.8).elided == 0
    fitted = fit(messages, [], 2000, 0.8)
    assert 0 < fitted.elided < 5
    assert fitted.tokens_after <= 1600 < fitted.tokens_before
    assert estimate_tokens(fitted.messages, []) <= 1600
    contents = [m["content"] for m in fitted.messages if m["role"] == "tool"]
    assert "elided to fit the context window" in contents[0]
    assert contents[-1] == "4" * 2000, "the newest result is kept whole when the rest is enough"
    assert [m["role"] for m in fitted.messages] == [m["role"] for m in messages]
    assert messages[2 + 1]["content"] == "0" * 2000, "the input is not changed"


def test_fit_cuts_the_latest_results_last_and_refuses_what_cannot_fit() -> None:
    fitted = fit(conversation(1, 8000), [], 1000, 0.8)
    assert fitted.tokens_after <= 800 and fitted.messages[-1]["content"].startswith("0" * 100)
    with pytest.raises(ContextOverflow, match="context window is 10 tokens"):
        fit(conversation(1, 10), [], 10, 0.8)


def test_a_tiny_window_keeps_every_request_under_it(store: TraceStore, tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"part{i}.txt").write_text(f"{i}" * 3000)
    reads = [call("read_file", path=f"part{i}.txt") for i in range(6)]
    model = ScriptedModel([*reads, text("read them all")])
    local = local_fleet(store, tmp_path, model)
    window = 3500  # the default preset offers every tool: their schemas take ~2.4k tokens
    config = FleetConfig(
        models={"tiny": ModelConfig(provider="scripted", name="x", context_window=window)}
    )
    runtime = Runtime(**{**local.runtime.__dict__, "config": config, "clients": {"tiny": model}})
    root = InProcessFleet(runtime).run("read the parts", model="tiny")
    assert root.status == "completed", root.error
    sizes = [estimate_tokens(r, t) for r, t in zip(model.requests, model.tools_seen, strict=True)]
    assert max(sizes) <= window * 0.8, sizes
    assert root.run.context is not None and root.run.context.compactions >= 1
    stored = [m for m in store.messages(root.trace_id) if m.role == "tool"]
    assert all(len(m.content or "") >= 3000 for m in stored), "stored outputs stay whole"


# -- goals linked to sub-traces -------------------------------------------------------


def test_a_goal_links_the_sub_traces_that_worked_on_it(store: TraceStore, tmp_path: Path) -> None:
    script = [
        call("goal", action="add", description="survey the code"),
        call("agent", task=["look at a", "look at b"]),
        text("done"),
    ]

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if users(messages)[0].startswith("look at"):
            return text("seen")
        return script[assistants(messages)]

    local = local_fleet(store, tmp_path, ScriptedModel(function=respond))
    root = local.run("plan it", model="test")
    (goal,) = root.goals.goals
    assert goal.sub_trace_ids == store.children(root.trace_id) and len(goal.sub_trace_ids) == 2
    assert f"[sub-traces: {goal.sub_trace_ids[0]}" in root.goals.render()


def test_trace_show_lists_goals_with_their_sub_traces(store: TraceStore, tmp_path: Path) -> None:
    from fleetops.cli.output import render_tree, trace_object

    script = [
        call("goal", action="add", description="survey the code"),
        call("agent", task="look at a"),
        text("done"),
    ]

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        if users(messages)[0].startswith("look at"):
            return text("seen")
        return script[assistants(messages)]

    root = local_fleet(store, tmp_path, ScriptedModel(function=respond)).run("plan", model="test")
    (child,) = store.children(root.trace_id)
    shown = "\n".join(render_tree(store, root))
    assert root.status == "completed" and root.goals.goals[0].status == "in_progress"
    # A finished tree shows no goal still in progress: what the model left open is done.
    assert f"goal 1 [done] survey the code  sub-traces: {child}" in shown
    assert "took " in shown.splitlines()[1]
    assert trace_object(store, root)["goals"][0]["sub_trace_ids"] == [child]
