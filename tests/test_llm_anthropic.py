"""AnthropicClient against a real HTTP server on 127.0.0.1 that speaks the Messages API."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

import fleet.llm.base
from fleet.errors import ConfigError, ModelRequestsDisabled
from fleet.llm.anthropic import AnthropicClient
from fleet.llm.base import ToolCall
from fleet.llm.openai import OpenAIClient
from fleet.llm.retry import RetryPolicy
from tests.fake_provider import send_json
from tests.loopback import LoopbackServer

KEY = "sk-ant-test-SECRET-0123456789"


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeProvider:
    """Answers queued replies in order and records every request it receives."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.seen: list[Seen] = []
        self._server = LoopbackServer(_handler_for(self))

    @property
    def url(self) -> str:
        return self._server.url

    def stop(self) -> None:
        self._server.stop()


def _handler_for(fake: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            fake.seen.append(Seen(self.path, headers, json.loads(raw)))
            reply = fake.replies.popleft()
            send_json(self, reply.status, reply.body, reply.headers)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    yield fake
    fake.stop()


@pytest.fixture
def allow_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)


def no_wait(sleeps: list[float] | None = None) -> RetryPolicy:
    return RetryPolicy(sleep=(sleeps if sleeps is not None else []).append)


def anthropic_client(server: FakeProvider, api_key: str = KEY, **kwargs: Any) -> AnthropicClient:
    return AnthropicClient(server.url, api_key, "claude-sonnet-4-5", retry=no_wait(), **kwargs)


def message(*blocks: dict[str, Any], stop: str = "end_turn", **usage: int) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": list(blocks),
        "stop_reason": stop,
        "usage": usage,
    }


def openai_tool(name: str, description: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


@pytest.mark.usefixtures("allow_requests")
def test_request_json_groups_tool_results_and_renames_openai_ids(server: FakeProvider) -> None:
    server.replies.append(Reply(body=message({"type": "text", "text": "done"})))
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Compare a.txt and b.txt"},
        {
            "role": "assistant",
            "content": "Reading both.",
            "tool_calls": [
                ToolCall("call_aaa", "read_file", '{"path": "a.txt"}').to_openai(),
                ToolCall("call_bbb", "read_file", '{"path": "b.txt"}').to_openai(),
            ],
        },
        {"role": "tool", "tool_call_id": "call_aaa", "content": "A"},
        {"role": "tool", "tool_call_id": "call_bbb", "content": "B"},
        {"role": "user", "content": "And now?"},
    ]
    client = anthropic_client(server, prompt_cache=False)  # breakpoints: test_prompt_cache.py

    client.complete(history, [openai_tool("read_file", "Read a file.")], temperature=0.5)
    client.close()

    (seen,) = server.seen
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == KEY
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in seen.headers
    assert seen.body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": "Be brief.",
        "temperature": 0.5,
        "tools": [
            {
                "name": "read_file",
                "description": "Read a file.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Compare a.txt and b.txt"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading both."},
                    {
                        "type": "tool_use",
                        "id": "toolu_aaa",
                        "name": "read_file",
                        "input": {"path": "a.txt"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_bbb",
                        "name": "read_file",
                        "input": {"path": "b.txt"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_aaa", "content": "A"},
                    {"type": "tool_result", "tool_use_id": "toolu_bbb", "content": "B"},
                    {"type": "text", "text": "And now?"},
                ],
            },
        ],
    }


@pytest.mark.usefixtures("allow_requests")
def test_parses_text_tool_use_usage_and_cost(server: FakeProvider) -> None:
    body = message(
        {"type": "text", "text": "Let me "},
        {"type": "text", "text": "look."},
        {"type": "tool_use", "id": "toolu_01X", "name": "read_file", "input": {"path": "a"}},
        stop="tool_use",
        input_tokens=2000,
        output_tokens=100,
    )
    server.replies.append(Reply(body=body))
    client = anthropic_client(server)

    response = client.complete([{"role": "user", "content": "go"}], [])
    client.close()

    assert response.content == "Let me look."
    assert response.tool_calls == (ToolCall("toolu_01X", "read_file", '{"path": "a"}'),)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (2000, 100)
    assert response.usage.cost_usd == pytest.approx(0.0075)  # $3 / $15 per Mtok
    assert response.model == "claude-sonnet-4-5-20250929"
    assert response.finish_reason == "tool_calls"
    assert "tools" not in server.seen[0].body


@pytest.mark.usefixtures("allow_requests")
def test_trace_moves_anthropic_to_openai_and_back_with_matching_ids(
    server: FakeProvider,
) -> None:
    tool_use = {"type": "tool_use", "id": "toolu_01Q", "name": "ls", "input": {}}
    server.replies.append(Reply(body=message(tool_use, stop="tool_use")))
    openai_answer = {
        "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]
    }
    server.replies.append(Reply(body=openai_answer))
    server.replies.append(Reply(body=message({"type": "text", "text": "ok"})))
    claude = anthropic_client(server, prompt_cache=False)  # ids only: no breakpoints
    gpt = OpenAIClient(f"{server.url}/v1", "sk-o", "gpt-4o", retry=no_wait())

    first = claude.complete([{"role": "user", "content": "list"}], [])
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [first.tool_calls[0].to_openai()]},
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "a b"},
    ]
    gpt.complete(history, [])
    claude.complete(history, [])
    claude.close()
    gpt.close()

    sent_openai = server.seen[1].body["messages"]
    assert sent_openai[1]["tool_calls"][0]["id"] == "call_01Q"
    assert sent_openai[2]["tool_call_id"] == "call_01Q"
    sent_anthropic = server.seen[2].body["messages"]
    assert sent_anthropic[1]["content"] == [
        {"type": "tool_use", "id": "toolu_01Q", "name": "ls", "input": {}}
    ]
    assert sent_anthropic[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01Q", "content": "a b"}
    ]


@pytest.mark.usefixtures("allow_requests")
def test_overloaded_529_is_retried_then_succeeds(server: FakeProvider) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.replies.append(Reply(status=529, body=overloaded))
    server.replies.append(Reply(body=message({"type": "text", "text": "fine"})))
    sleeps: list[float] = []
    client = AnthropicClient(server.url, KEY, "claude-haiku-4-5", retry=no_wait(sleeps))

    response = client.complete([{"role": "user", "content": "hi"}], [])
    client.close()

    assert response.content == "fine"
    assert len(server.seen) == 2
    assert len(sleeps) == 1


@pytest.mark.usefixtures("allow_requests")
def test_401_is_config_error_naming_env_var_not_key(server: FakeProvider) -> None:
    error = {"type": "error", "error": {"type": "authentication_error", "message": KEY}}
    server.replies.append(Reply(status=401, body=error))
    client = anthropic_client(server)

    with pytest.raises(ConfigError) as caught:
        client.complete([{"role": "user", "content": "hi"}], [])
    client.close()

    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert KEY not in str(caught.value)
    assert len(server.seen) == 1


def test_guard_off_raises_and_sends_nothing(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", False)
    client = anthropic_client(server)

    with pytest.raises(ModelRequestsDisabled):
        client.complete([{"role": "user", "content": "hi"}], [])
    client.close()

    assert server.seen == []


def test_max_output_tokens_per_call_beats_the_default_and_repr_hides_key() -> None:
    client = AnthropicClient("http://127.0.0.1:1", KEY, "claude-haiku-4-5", max_output_tokens=10)
    try:
        body = client.request_body([{"role": "user", "content": "x"}], [], max_output_tokens=99)
        assert body["max_tokens"] == 99
        assert client.request_body([{"role": "user", "content": "x"}], [])["max_tokens"] == 10
        assert KEY not in repr(client)
    finally:
        client.close()


def test_malformed_tool_arguments_are_kept_not_dropped() -> None:
    client = AnthropicClient("http://127.0.0.1:1", KEY, "claude-haiku-4-5", prompt_cache=False)
    broken = ToolCall("call_1", "ls", "{not json").to_openai()
    try:
        body = client.request_body(
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [broken]},
            ],
            [],
        )
    finally:
        client.close()

    assert body["messages"][1]["content"] == [
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "ls",
            "input": {"_unparsed_arguments": "{not json"},
        }
    ]
