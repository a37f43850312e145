"""Retries against a real HTTP server on 127.0.0.1, plus the pure backoff arithmetic."""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

import fleet.llm.base
from fleet.errors import ConfigError, TransientLLMError
from fleet.llm.openai import OpenAIClient
from fleet.llm.retry import (
    RetryPolicy,
    backoff_s,
    overload_wait_s,
    retry_after_s,
    send_with_retry,
)
from tests.fake_provider import send_json
from tests.loopback import LoopbackServer

NOW_S = 1_700_000_000.0


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    """Answer nothing until the server stops, so the client times out."""


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
        self.released = threading.Event()
        self._server = LoopbackServer(_handler_for(self))

    @property
    def url(self) -> str:
        return self._server.url

    def stop(self) -> None:
        self.released.set()
        self._server.stop()


def _handler_for(fake: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            fake.seen.append(Seen(self.path, headers, json.loads(raw)))
            reply = fake.replies.popleft()
            if reply.hang:
                fake.released.wait(timeout=10)
                return
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


OK = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
BUSY = {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}


def recording_client(
    base_url: str, sleeps: list[float], timeout_s: float = 5.0, **policy: Any
) -> OpenAIClient:
    retry = RetryPolicy(sleep=sleeps.append, random_fraction=lambda: 1.0, **policy)
    return OpenAIClient(f"{base_url}/v1", "sk-x", "gpt-4o-mini", timeout_s=timeout_s, retry=retry)


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.usefixtures("allow_requests")
def test_429_with_retry_after_is_retried_after_the_asked_wait(server: FakeProvider) -> None:
    server.replies.extend([Reply(429, BUSY, {"retry-after": "1"}), Reply(200, OK)])
    sleeps: list[float] = []
    client = recording_client(server.url, sleeps)

    response = client.complete(HI, [])
    client.close()

    assert response.content == "ok"
    assert sleeps == [1.0]
    assert len(server.seen) == 2
    assert server.seen[0].body == server.seen[1].body


@pytest.mark.usefixtures("allow_requests")
def test_retry_after_ms_wins_and_is_capped_by_max_delay(server: FakeProvider) -> None:
    server.replies.extend(
        [
            Reply(429, BUSY, {"retry-after-ms": "250", "retry-after": "1"}),
            Reply(429, BUSY, {"retry-after": "3600"}),
            Reply(200, OK),
        ]
    )
    sleeps: list[float] = []
    client = recording_client(server.url, sleeps, max_delay_s=20.0)

    client.complete(HI, [])
    client.close()

    assert sleeps == [0.25, 20.0]


@pytest.mark.usefixtures("allow_requests")
def test_5xx_is_retried_with_exponential_backoff_then_succeeds(server: FakeProvider) -> None:
    server.replies.extend([Reply(500, {}), Reply(502, {}), Reply(503, {}), Reply(200, OK)])
    sleeps: list[float] = []
    client = recording_client(server.url, sleeps, base_delay_s=0.5)

    response = client.complete(HI, [])
    client.close()

    assert response.content == "ok"
    assert sleeps == [0.5, 1.0, 2.0]  # jitter pinned to its upper bound
    assert len(server.seen) == 4


@pytest.mark.usefixtures("allow_requests")
def test_exhausted_attempts_raise_transient_error(server: FakeProvider) -> None:
    server.replies.extend([Reply(503, {"error": {"message": "down"}})] * 3)
    sleeps: list[float] = []
    client = recording_client(server.url, sleeps, max_attempts=3)

    with pytest.raises(TransientLLMError) as caught:
        client.complete(HI, [])
    client.close()

    assert str(caught.value) == "openai request failed after 3 attempts; last: HTTP 503: down"
    assert len(server.seen) == 3
    assert len(sleeps) == 2, "no wait after the last attempt"


@pytest.mark.usefixtures("allow_requests")
def test_read_timeout_is_retried(server: FakeProvider) -> None:
    server.replies.extend([Reply(hang=True), Reply(200, OK)])
    sleeps: list[float] = []
    client = recording_client(server.url, sleeps, timeout_s=0.2)

    response = client.complete(HI, [])
    client.close()

    assert response.content == "ok"
    assert len(server.seen) == 2
    assert len(sleeps) == 1


@pytest.mark.usefixtures("allow_requests")
def test_refused_connection_is_retried_then_transient_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    sleeps: list[float] = []
    client = recording_client(f"http://127.0.0.1:{closed_port}", sleeps, max_attempts=2)

    with pytest.raises(TransientLLMError, match="after 2 attempts; last: ConnectError"):
        client.complete(HI, [])
    client.close()

    assert len(sleeps) == 1


@pytest.mark.parametrize(
    ("headers", "expected_s"),
    [
        ({}, None),
        ({"retry-after": "1"}, 1.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "200", "retry-after": "9"}, 0.2),
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": formatdate(NOW_S + 30, usegmt=True)}, 30.0),
        ({"retry-after": formatdate(NOW_S - 30, usegmt=True)}, 0.0),
        ({"retry-after": "tomorrow"}, None),
        ({"retry-after": "nan"}, None),  # a header may say anything: not a wait to sleep
        ({"retry-after": "inf"}, None),
        ({"retry-after-ms": "1e309", "retry-after": "2"}, 2.0),
    ],
)
def test_retry_after_table(headers: dict[str, str], expected_s: float | None) -> None:
    assert retry_after_s(headers, now_s=NOW_S) == expected_s


@pytest.mark.parametrize(
    ("headers", "expected_s"),
    [
        ({}, None),
        ({"retry-after": "0.3"}, 0.3),
        ({"retry-after-ms": "250", "x-ratelimit-reset-requests": "20s"}, 0.25),
        # No retry-after: until one request is back (20 s for 100 requests: 0.2 s).
        (
            {
                "x-ratelimit-limit-requests": "100",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "20s",
            },
            0.2,
        ),
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "450ms"}, 0.45),
        ({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "450ms"}, None),
        (
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:02Z",
            },
            2.0,
        ),
    ],
)
def test_an_overload_waits_for_what_the_provider_says(
    headers: dict[str, str], expected_s: float | None
) -> None:
    now_s = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    assert overload_wait_s(headers, now_s=now_s) == expected_s


@pytest.mark.parametrize(
    ("attempt", "fraction", "expected_s"),
    [
        (0, 1.0, 0.5),
        (1, 1.0, 1.0),
        (3, 1.0, 4.0),
        (10, 1.0, 8.0),  # capped by max_delay_s
        (3, 0.25, 1.0),
        (3, 0.0, 0.0),
    ],
)
def test_backoff_table(attempt: int, fraction: float, expected_s: float) -> None:
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=8.0, random_fraction=lambda: fraction)

    assert backoff_s(attempt, policy) == expected_s


def test_an_unsendable_request_never_quotes_the_key() -> None:
    secret = "sk-very-secret\n"

    def send() -> httpx.Response:
        raise httpx.LocalProtocolError(f"Illegal header value b'Bearer {secret}'")

    with pytest.raises(ConfigError) as caught:
        send_with_retry(send, provider="openai", api_key_env="OPENAI_API_KEY")
    assert "sk-very-secret" not in str(caught.value)
    assert "OPENAI_API_KEY" in str(caught.value)
