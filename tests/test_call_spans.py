"""Model and tool calls are timed spans: start, end, tokens, cost, and every HTTP attempt.

The trace page draws them (tests/test_serve_page_spans.py); this is what a run records: an
assistant message's `call_span` metadata and its `message` event, a tool message's start,
and a failed call's attempts on the `queued` event of its hand-back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fleet.llm.base
from fleet import lifecycle
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import TransientLLMError
from fleet.inprocess import InProcessFleet
from fleet.llm.retry import RetryPolicy
from fleet.llm.timing import CALL_SPAN_KEY, recording_attempts
from fleet.settings import Settings
from fleet.testing import ScriptedModel, call, text
from tests.test_llm_openai import FakeProvider, Reply, client_for, completion


@pytest.fixture
def server() -> Any:
    fake = FakeProvider()
    yield fake
    fake.stop()


def _fleet(tmp_path: Path, client: Any) -> InProcessFleet:
    return InProcessFleet.from_settings(
        Settings(workspace=tmp_path, env={}), clients={"test": client}
    )


def test_a_retried_call_keeps_both_attempts_and_its_span(
    tmp_path: Path, server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)
    server.replies.extend(
        [
            Reply(500, {"error": {"message": "upstream hiccup"}}),
            Reply(
                200,
                completion(
                    {"role": "assistant", "content": "done"}, prompt_tokens=40, completion_tokens=7
                ),
            ),
        ]
    )
    local = _fleet(tmp_path, client_for(server))
    trace = local.run("say done", model="test")
    assert trace.status == "completed"
    (answer,) = [m for m in local.store.messages(trace.trace_id) if m.role == "assistant"]
    span = answer.metadata[CALL_SPAN_KEY]
    first, second = span["attempts"]
    assert "HTTP 500" in first["error"] and "upstream hiccup" in first["error"]
    assert "error" not in second
    assert span["started_at_ms"] <= first["started_at_ms"] <= first["ended_at_ms"]
    assert first["ended_at_ms"] <= second["started_at_ms"] <= second["ended_at_ms"]
    assert second["ended_at_ms"] <= span["ended_at_ms"] <= answer.created_at_ms
    assert span["duration_ms"] == span["ended_at_ms"] - span["started_at_ms"]
    event = next(
        e
        for _, e in local.store.read_events(trace.trace_id)
        if e.kind == "message" and e.data.get("role") == "assistant"
    )
    assert event.data["attempts"] == 2 and event.data["started_at_ms"] == span["started_at_ms"]
    assert (event.data["prompt_tokens"], event.data["completion_tokens"]) == (40, 7)


def test_a_tool_call_starts_before_its_result_is_written(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("hello\n")
    model = ScriptedModel([call("read_file", path="notes.md"), text("read it")])
    local = _fleet(tmp_path, model)
    trace = local.run("read the notes", model="test")
    messages = local.store.messages(trace.trace_id)
    (result,) = [m for m in messages if m.role == "tool"]
    asked = next(m for m in messages if m.role == "assistant")
    assert asked.metadata[CALL_SPAN_KEY]["attempts"] == []  # the scripted model: no HTTP
    assert asked.created_at_ms <= result.metadata["started_at_ms"] <= result.created_at_ms


def test_every_attempt_of_a_call_that_failed_is_recorded(server: FakeProvider) -> None:
    fleet.llm.base.ALLOW_MODEL_REQUESTS = True
    try:
        server.replies.extend([Reply(503, {"error": {"message": "busy"}})] * 3)
        client = client_for(server)
        client._retry = RetryPolicy(max_attempts=3, sleep=lambda _s: None)
        with recording_attempts() as attempts, pytest.raises(TransientLLMError):
            client.complete([{"role": "user", "content": "x"}], [])
    finally:
        fleet.llm.base.ALLOW_MODEL_REQUESTS = False
    assert [a.error.split(":")[0] for a in attempts] == ["HTTP 503"] * 3


def test_a_hand_back_after_a_provider_error_lists_the_attempts(tmp_path: Path) -> None:
    local = _fleet(tmp_path, ScriptedModel([text("x")]))
    trace = create_root(local.runtime, TaskSpec("t", "test")).model_copy(
        update={"status": "running"}  # as the runner holds it when the call fails
    )
    attempts = [{"started_at_ms": 1, "ended_at_ms": 2, "error": "HTTP 500: boom"}] * 4
    lifecycle.requeue(local.runtime, trace, "provider error", 2.0, attempts=attempts)
    events = [e for _, e in local.store.read_events(trace.trace_id) if e.kind == "trace"]
    assert events[-1].data["attempts"] == attempts and events[-1].data["on"] == "provider error"
