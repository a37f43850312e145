"""A cancelled model call closes its HTTP request: the provider sees the client go.

Real HTTP against a local provider that holds each request and watches its connection
(`tests.fake_held_provider`), on both wires, plain and over TLS; and the httpx internals
`fleet.llm.transport` relies on, asserted on httpx itself.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

import fleet.llm.base
from fleet.llm.anthropic import AnthropicClient
from fleet.llm.base import LLMClient
from fleet.llm.cancel import CallCancelled, Cancel, cancelling
from fleet.llm.openai import OpenAIClient
from fleet.llm.retry import RetryPolicy
from fleet.llm.transport import CutBackend, arm, cuttable_client
from fleet.testing import text
from tests.fake_held_provider import HeldProvider
from tests.fleetkit import wait_until

SLOW_S = 20.0
BOUND_S = 1.0
"""Cancel -> the provider saw the client go: the shutdown is one system call."""


@pytest.fixture
def allow_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)


@pytest.fixture
def provider() -> Iterator[HeldProvider]:
    def latency(messages: list[dict[str, Any]]) -> float:
        return SLOW_S if "slow" in str(messages[-1].get("content")) else 0.05

    with HeldProvider(lambda m: text("the answer"), latency) as server:
        yield server


_made: list[OpenAIClient | AnthropicClient] = []


@pytest.fixture(autouse=True)
def closed() -> Iterator[None]:
    """Every client `make` built is closed after the test (its kept-alive connection)."""
    yield
    while _made:
        _made.pop().close()


def make(wire: str, base_url: str, **options: Any) -> OpenAIClient | AnthropicClient:
    retry = RetryPolicy(sleep=lambda s: None)
    if wire == "openai":
        made: OpenAIClient | AnthropicClient = OpenAIClient(
            f"{base_url}/v1", "", "m", retry=retry, **options
        )
    else:
        made = AnthropicClient(base_url, "sk-ant-test", "m", retry=retry, **options)
    _made.append(made)
    return made


class Call:
    """`client.complete(...)` in a thread as the call `handle` cancels."""

    def __init__(self, client: LLMClient, handle: Cancel, content: str) -> None:
        self.handle = handle
        self.result: object = None
        self.error: BaseException | None = None
        self.ended_at: float | None = None

        def complete() -> object:
            return client.complete([{"role": "user", "content": content}], [])

        def target() -> None:
            try:
                with cancelling(handle):
                    self.result = complete()
            except BaseException as exc:
                self.error = exc
            self.ended_at = time.monotonic()

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()


@pytest.mark.usefixtures("allow_requests")
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_cancel_closes_the_request_and_the_provider_sees_it_at_once(
    provider: HeldProvider, wire: str
) -> None:
    call = Call(make(wire, provider.url), Cancel(), "slow")
    wait_until(lambda: len(provider.in_flight()) == 1, 10, "the request")
    cancelled_at = time.monotonic()
    assert call.handle.cancel() == 1
    wait_until(lambda: len(provider.cancelled()) == 1, BOUND_S * 5, "the provider seeing it")
    [held] = provider.cancelled()
    assert held.ended_at is not None and held.ended_at - cancelled_at < BOUND_S
    call.thread.join(5)
    assert isinstance(call.error, CallCancelled), call.error
    assert call.ended_at is not None and call.ended_at - cancelled_at < BOUND_S
    assert len(provider.requests) == 1, "no retry after the cut"


@pytest.mark.usefixtures("allow_requests")
@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make a certificate")
def test_a_cancel_over_tls_closes_the_request(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    with HeldProvider(lambda m: text("the answer"), lambda m: SLOW_S, tls=server_side) as tls:
        http = arm(client := httpx.Client(verify=ssl.create_default_context(cafile=cert)))
        assert http == 1
        base_url = tls.url.replace("http://", "https://")
        call = Call(make("openai", base_url, http=client), Cancel(), "slow")
        wait_until(lambda: len(tls.in_flight()) == 1, 10, "the request")
        cancelled_at = time.monotonic()
        assert call.handle.cancel() == 1
        wait_until(lambda: len(tls.cancelled()) == 1, BOUND_S * 5, "the provider seeing it")
        call.thread.join(5)
        client.close()
        assert isinstance(call.error, CallCancelled), call.error
        assert call.ended_at is not None and call.ended_at - cancelled_at < BOUND_S


@pytest.mark.usefixtures("allow_requests")
def test_a_late_cancel_leaves_the_next_call_on_the_same_connection_alone(
    provider: HeldProvider,
) -> None:
    client = make("openai", provider.url)
    first = Call(client, Cancel(), "quick")
    first.thread.join(10)
    assert first.error is None
    second = Call(client, Cancel(), "slow")
    wait_until(lambda: len(provider.in_flight()) == 1, 10, "the second request")
    assert provider.requests[0].peer == provider.requests[1].peer, "the connection was kept"
    assert first.handle.cancel() == 0, "the first call holds no connection any more"
    time.sleep(0.3)
    assert provider.cancelled() == [] and second.thread.is_alive()
    second.handle.cancel()
    wait_until(lambda: len(provider.cancelled()) == 1, 5, "the second call's cut")


@pytest.mark.usefixtures("allow_requests")
def test_a_call_cancelled_before_it_leaves_sends_nothing(provider: HeldProvider) -> None:
    handle = Cancel()
    handle.cancel()
    call = Call(make("anthropic", provider.url), handle, "quick")
    call.thread.join(10)
    assert isinstance(call.error, CallCancelled) and provider.requests == []


@pytest.mark.usefixtures("allow_requests")
def test_a_call_outside_any_handle_is_never_cut(provider: HeldProvider) -> None:
    client = make("openai", provider.url)
    assert client.complete([{"role": "user", "content": "quick"}], []).content == "the answer"


def test_the_httpx_internals_the_cut_relies_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx 0.28 / httpcore 1.0: each name `fleet.llm.transport` reaches for is there."""
    plain = httpx.Client()
    plain.close()
    pool = plain._transport._pool  # type: ignore[attr-defined]
    assert isinstance(pool, httpcore.ConnectionPool)
    assert isinstance(pool._network_backend, httpcore.NetworkBackend)
    with cuttable_client(1.0) as cut:
        assert isinstance(cut._transport._pool._network_backend, CutBackend)  # type: ignore[attr-defined]
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    proxied = cuttable_client(1.0)
    proxied.close()
    assert len(proxied._mounts) >= 1, "the environment's proxy is kept"
    assert arm(proxied) == 1 + len(proxied._mounts), "its pool is cut too"
