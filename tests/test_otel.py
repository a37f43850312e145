"""OpenTelemetry hooks in one process: the SDK's in-memory exporter, scripted models."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ConfigError
from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner
from fleet.observe import otel
from fleet.observe.hooks import NO_HOOKS
from fleet.observe.otel_spans import OtelHooks
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.testing import ScriptedModel, call, text
from tests.fleetkit import explore_script

SECRET_PROMPT = "the launch code is 0000"


def traced(
    tmp_path: Path, *, capture: bool = False, **clients: ScriptedModel
) -> tuple[Runtime, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = MemoryStore()
    hooks = OtelHooks(store, provider.get_tracer("test"), capture_content=capture)
    settings = Settings(workspace=tmp_path, allow_scripted=True)
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients=clients, hooks=hooks)
    return runtime, exporter


def run(runtime: Runtime, task: str, model: str) -> str:
    root = create_root(runtime, TaskSpec(task, model))
    Runner(runtime).run(root.trace_id)
    return root.trace_id


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_an_inline_explore_is_one_trace_with_genai_spans(tmp_path: Path) -> None:
    runtime, exporter = traced(tmp_path)
    model = explore_script(tmp_path / "model.yaml", 2, branch_turns=1)
    root = run(runtime, f"survey: {SECRET_PROMPT}", model)
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1
    (agent_tool,) = [s for s in spans if s.name == "execute_tool agent"]
    runs = by_name(spans, "invoke_agent")
    assert sorted(s.name for s in runs) == [
        "invoke_agent explore-001",
        "invoke_agent explore-002",
        "invoke_agent main",
    ]
    for branch in (s for s in runs if s.name != "invoke_agent main"):
        assert branch.parent is not None and branch.parent.span_id == agent_tool.context.span_id
        assert attrs(branch)["fleet.mode"] == "explore"
        assert attrs(branch)["fleet.root_trace_id"] == root
    for trace_id in [root, *runtime.store.children(root)]:
        stats = runtime.store.get_trace(trace_id).stats
        mine = [s for s in spans if attrs(s).get("fleet.trace_id") == trace_id]
        chats = [s for s in mine if s.name.startswith("chat ")]
        assert {attrs(c)["gen_ai.operation.name"] for c in chats} == {"chat"}
        assert sum(attrs(c)["gen_ai.usage.input_tokens"] for c in chats) == stats.prompt_tokens
        assert sum(attrs(c)["gen_ai.usage.output_tokens"] for c in chats) == stats.completion_tokens
        (run_span,) = by_name(tuple(mine), "invoke_agent")
        assert attrs(run_span)["gen_ai.usage.input_tokens"] == stats.prompt_tokens
        assert attrs(run_span)["gen_ai.operation.name"] == "invoke_agent"
    listing = [s for s in spans if s.name == "execute_tool list_dir"]
    assert len(listing) == 2 and attrs(listing[0])["gen_ai.tool.name"] == "list_dir"
    # Content is opt-in: nothing of the prompt or the answers is on any span.
    assert SECRET_PROMPT not in json.dumps([attrs(s) for s in spans])


def test_content_is_captured_only_when_the_operator_opts_in(tmp_path: Path) -> None:
    model = ScriptedModel([call("list_dir", path="."), text("all done")])
    runtime, exporter = traced(tmp_path, capture=True, test=model)
    run(runtime, SECRET_PROMPT, "test")
    (first, second) = by_name(exporter.get_finished_spans(), "chat ")
    sent = json.loads(attrs(first)["gen_ai.input.messages"])
    assert {"type": "text", "content": SECRET_PROMPT} in sent[-1]["parts"]
    answer = json.loads(attrs(second)["gen_ai.output.messages"])
    assert answer == [{"role": "assistant", "parts": [{"type": "text", "content": "all done"}]}]
    (tool,) = by_name(exporter.get_finished_spans(), "execute_tool")
    assert json.loads(attrs(tool)["gen_ai.tool.call.arguments"]) == {"path": "."}
    assert "gen_ai.tool.call.result" in attrs(tool)


def test_a_failing_model_and_a_refused_tool_set_error_type(tmp_path: Path) -> None:
    def explode(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if any(m["role"] == "tool" for m in messages):
            raise TimeoutError("provider hung up")
        return call("write_file", path="x.txt", content="no")

    runtime, exporter = traced(tmp_path, test=ScriptedModel(function=explode))
    root = create_root(runtime, TaskSpec("x", "test", preset="explore"))
    with pytest.raises(TimeoutError):
        Runner(runtime).run(root.trace_id)
    spans = exporter.get_finished_spans()
    (tool,) = by_name(spans, "execute_tool write_file")
    assert attrs(tool)["error.type"] == "tool_error"
    failed_chat = by_name(spans, "chat ")[-1]
    assert attrs(failed_chat)["error.type"] == "TimeoutError"
    (run_span,) = by_name(spans, "invoke_agent")
    assert attrs(run_span)["error.type"] == "TimeoutError"
    assert attrs(run_span)["fleet.outcome"] == "crashed"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
    ],
)
def test_tracing_is_on_only_when_otel_variables_ask_for_it(env: dict[str, str], on: bool) -> None:
    assert Settings.from_env(env).otel_tracing is on
    if not on:
        assert otel.make_hooks(Settings.from_env(env), MemoryStore()) is NO_HOOKS


def test_without_the_extra_tracing_is_off_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    settings = Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert otel.make_hooks(settings, MemoryStore()) is NO_HOOKS
    assert "agent-fleet[otel]" in caplog.text


def test_an_unsupported_exporter_is_a_config_error() -> None:
    settings = Settings.from_env(
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    with pytest.raises(ConfigError, match="http/protobuf"):
        otel._exporter(settings)


def test_tracing_off_loads_no_tracing_code(tmp_path: Path) -> None:
    # redis-py 8 imports the OpenTelemetry API for its own metrics when it is installed;
    # what tracing adds (our spans, the trace SDK, an exporter) must stay unloaded.
    probe = (
        "import sys; import workers.tasks; from workers.runtime import get_runtime; "
        "from fleet.observe.hooks import NO_HOOKS; hooks = get_runtime().hooks; "
        # The experiences' outcome counter may come first; the process's own are the no-ops.
        "assert hooks is NO_HOOKS or hooks.members[-1].hook is NO_HOOKS; "
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'fleet.observe.otel_spans', 'opentelemetry.sdk.trace', 'opentelemetry.exporter'))))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_a_continued_delegate_runs_under_the_call_that_continued_it(tmp_path: Path) -> None:
    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        task = next(str(m["content"]) for m in messages if m["role"] == "user")
        turns = sum(m["role"] == "assistant" for m in messages)
        if task.startswith("helper"):
            return text(f"helped {turns}")
        if turns == 0:
            return call("agent", task="helper: look")
        if turns == 1:
            sub = str(messages[-1]["content"]).split("sub_trace_id: ")[1].split()[0]
            return call("agent", task="helper: again", continue_from=sub)
        return text("done")

    runtime, exporter = traced(tmp_path, test=ScriptedModel(function=respond))
    root = run(runtime, "main task", "test")
    assert runtime.store.get_trace(root).status == "completed"
    spans = exporter.get_finished_spans()
    first_call, second_call = [s for s in spans if s.name == "execute_tool agent"]
    first_run, second_run = by_name(spans, "invoke_agent delegate")
    assert first_run.parent is not None and second_run.parent is not None
    assert first_run.parent.span_id == first_call.context.span_id
    assert second_run.parent.span_id == second_call.context.span_id
    assert len({s.context.trace_id for s in spans}) == 1


def test_a_delivered_message_is_an_event_on_the_run_span_without_its_text(
    tmp_path: Path,
) -> None:
    from fleet.conversation.messages import CHECK_MESSAGES, send

    holder: dict[str, Runtime] = {}

    def reader(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        done = sum(m["role"] == "tool" for m in messages)
        if done == 0:
            trace_id = holder["runtime"].store.list_traces(1)[0].trace_id
            send(holder["runtime"], trace_id, SECRET_PROMPT, sender="lead")
            return call("glob", pattern="*")
        return call(CHECK_MESSAGES) if done == 1 else text("ok")

    runtime, exporter = traced(tmp_path, m=ScriptedModel(function=reader))
    holder["runtime"] = runtime
    run(runtime, "task", "m")
    [agent] = by_name(exporter.get_finished_spans(), "invoke_agent")
    [event] = [e for e in agent.events if e.name == "fleet.messages.delivered"]
    assert dict(event.attributes or {}) == {
        "fleet.messages.count": 1,
        "fleet.messages.from": ("lead",),
    }
