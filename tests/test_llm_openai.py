"""OpenAIClient against a real HTTP server on 127.0.0.1 that speaks /chat/completions."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

import fleet.llm.base
from fleet.errors import ConfigError, ModelBehaviorError, ModelRequestsDisabled
from fleet.llm.base import ToolCall
from fleet.llm.openai import OpenAIClient, normalise_tool_call_id
from fleet.llm.pricing import ModelPricing
from fleet.llm.retry import RetryPolicy
from tests.fake_provider import send_json
from tests.loopback import LoopbackServer

KEY = "sk-test-SECRET-0123456789"


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


def completion(message: dict[str, Any], finish: str = "stop", **usage: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def client_for(server: FakeProvider, api_key: str = KEY, **kwargs: Any) -> OpenAIClient:
    no_wait = RetryPolicy(sleep=lambda _s: None)
    return OpenAIClient(f"{server.url}/v1", api_key, "gpt-4o-mini", retry=no_wait, **kwargs)


READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


@pytest.mark.usefixtures("allow_requests")
def test_request_json_headers_and_ids_from_anthropic_history(server: FakeProvider) -> None:
    server.replies.append(Reply(body=completion({"role": "assistant", "content": "ok"})))
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Read a.txt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                ToolCall("toolu_01AbC", "read_file", '{"path": "a.txt"}').to_openai(),
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01AbC", "content": "hello"},
    ]
    client = client_for(server)

    client.complete(history, [READ_TOOL], temperature=0.0, max_output_tokens=256)
    client.close()

    (seen,) = server.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Read a.txt"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_01AbC",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_01AbC", "content": "hello"},
        ],
        "tools": [READ_TOOL],
        "tool_choice": "auto",
        "temperature": 0.0,
        "max_tokens": 256,
    }
    assert history[3]["tool_call_id"] == "toolu_01AbC", "the caller's history is not mutated"


@pytest.mark.usefixtures("allow_requests")
def test_local_server_without_key_gets_no_auth_header_and_no_tool_fields(
    server: FakeProvider,
) -> None:
    server.replies.append(Reply(body=completion({"role": "assistant", "content": "hi"})))
    client = client_for(server, api_key="")

    response = client.complete([{"role": "user", "content": "hi"}], [])
    client.close()

    (seen,) = server.seen
    assert "authorization" not in seen.headers
    assert seen.body == {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    assert response.content == "hi"


@pytest.mark.usefixtures("allow_requests")
def test_parses_tool_calls_usage_and_cost(server: FakeProvider) -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_x1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "b.txt"}'},
            },
            # Some local servers send the arguments as an object.
            {"id": "call_x2", "type": "function", "function": {"name": "ls", "arguments": {}}},
        ],
    }
    body = completion(message, "tool_calls", prompt_tokens=1000, completion_tokens=500)
    server.replies.append(Reply(body=body))
    client = client_for(server)

    response = client.complete([{"role": "user", "content": "go"}], [READ_TOOL])
    client.close()

    assert response.content is None
    assert response.tool_calls == (
        ToolCall("call_x1", "read_file", '{"path": "b.txt"}'),
        ToolCall("call_x2", "ls", "{}"),
    )
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (1000, 500)
    assert response.usage.cost_usd == pytest.approx(0.00045)  # gpt-4o-mini: $0.15 / $0.60
    assert response.model == "gpt-4o-mini-2024-07-18"
    assert response.finish_reason == "tool_calls"


@pytest.mark.usefixtures("allow_requests")
def test_pricing_override_beats_the_table(server: FakeProvider) -> None:
    body = completion({"role": "assistant", "content": "x"}, prompt_tokens=2, completion_tokens=1)
    server.replies.append(Reply(body=body))
    client = client_for(server, pricing=ModelPricing(1_000_000.0, 2_000_000.0))

    response = client.complete([{"role": "user", "content": "x"}], [])
    client.close()

    assert response.usage.cost_usd == pytest.approx(4.0)


def test_guard_off_raises_and_sends_nothing(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", False)
    client = client_for(server)

    with pytest.raises(ModelRequestsDisabled):
        client.complete([{"role": "user", "content": "hi"}], [])
    client.close()

    assert server.seen == []


@pytest.mark.usefixtures("allow_requests")
def test_401_is_config_error_naming_env_var_not_key(server: FakeProvider) -> None:
    # OpenAI echoes part of a rejected key in the body; none of it may reach the message.
    error = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}}
    server.replies.append(Reply(status=401, body=error))
    client = client_for(server)

    with pytest.raises(ConfigError) as caught:
        client.complete([{"role": "user", "content": "hi"}], [])
    client.close()

    message = str(caught.value)
    assert "OPENAI_API_KEY" in message
    assert "openai" in message
    assert KEY not in message and "SECRET" not in message
    assert len(server.seen) == 1, "a 401 is not retried"


@pytest.mark.usefixtures("allow_requests")
def test_400_is_model_behavior_error_with_providers_message_on_one_line(
    server: FakeProvider,
) -> None:
    error = {"error": {"message": "Invalid schema for function\n'read_file'."}}
    server.replies.append(Reply(status=400, body=error))
    client = client_for(server)

    with pytest.raises(ModelBehaviorError) as caught:
        client.complete([{"role": "user", "content": "hi"}], [READ_TOOL])
    client.close()

    assert str(caught.value) == (
        "openai rejected the request (HTTP 400): Invalid schema for function 'read_file'."
    )
    assert len(server.seen) == 1


@pytest.mark.usefixtures("allow_requests")
def test_response_without_choices_is_model_behavior_error(server: FakeProvider) -> None:
    server.replies.append(Reply(body={"object": "error"}))
    client = client_for(server)

    with pytest.raises(ModelBehaviorError, match="choices"):
        client.complete([{"role": "user", "content": "hi"}], [])
    client.close()


def test_repr_hides_the_key() -> None:
    client = OpenAIClient("http://127.0.0.1:1/v1", KEY, "gpt-4o")
    try:
        assert KEY not in repr(client)
        assert "gpt-4o" in repr(client)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("tool_id", "prefix", "expected"),
    [
        ("toolu_01AbC", "call_", "call_01AbC"),
        ("call_01AbC", "toolu_", "toolu_01AbC"),
        ("call_abc", "call_", "call_abc"),
        ("toolu_abc", "toolu_", "toolu_abc"),
        ("t1", "call_", "call_t1"),
    ],
)
def test_normalise_tool_call_id_table(tool_id: str, prefix: str, expected: str) -> None:
    assert normalise_tool_call_id(tool_id, prefix) == expected


@pytest.mark.parametrize("tool_id", ["fc.1/2", "x" * 60, "toolu_"])
def test_unsafe_or_long_ids_hash_deterministically(tool_id: str) -> None:
    first = normalise_tool_call_id(tool_id, "call_")

    assert first == normalise_tool_call_id(tool_id, "call_")
    assert first.startswith("call_") and len(first) == len("call_") + 24
    assert first != normalise_tool_call_id(tool_id + "2", "call_")
