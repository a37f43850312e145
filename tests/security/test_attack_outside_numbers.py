"""Numbers from outside: NaN, Infinity and 1e300 where a provider, an embedding endpoint or a
client gives a count, a cost or a time.

Attack: a provider answers `"prompt_tokens": NaN` (or `Infinity`, `1e300`, a 400-digit
integer); a header says `x-ratelimit-limit-requests: inf`; an embedding holds `1e400`. On
main `int(inf)` raised an `OverflowError` nothing caught (the run died with a traceback),
`1e300` became a 10^300 integer in the trace's stats and cost, and `inf` in a rate-limit
header crashed the answer's parse. Control: `fleet.security.numbers` at every edge; a bad
number is that call's error, in one line, and nothing of it is stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

import fleet.llm.base
from fleet.errors import ConfigError, ModelBehaviorError
from fleet.inprocess import InProcessFleet
from fleet.llm.embeddings import parse_vectors
from fleet.llm.pricing import token_count
from fleet.llm.ratelimit import rate_signal
from fleet.llm.retry import retry_after_s
from fleet.security.numbers import MAX_WAIT_S
from fleet.settings import Settings
from tests.loopback import LoopbackServer

HOSTILE = ["NaN", "Infinity", "-Infinity", "1e300", "1" + "0" * 400]
"""JSON number texts Python's json reads without complaint."""


class Answers:
    """A provider at 127.0.0.1 answering every POST with `body` (raw JSON text) + headers."""

    def __init__(self, body: str, headers: dict[str, str] | None = None) -> None:
        self.body, self.headers = body, headers or {}
        self.calls = 0
        self._http = LoopbackServer(self._handler())

    @property
    def url(self) -> str:
        return self._http.url

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                answers.calls += 1
                payload = answers.body.encode()
                self.send_response(200)
                for name, value in answers.headers.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler


@pytest.fixture
def allow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only
    yield


def openai_body(number: str) -> str:
    return (
        '{"model": "m", "choices": [{"message": {"role": "assistant", "content": "hi"},'
        f' "finish_reason": "stop"}}], "usage": {{"prompt_tokens": {number},'
        ' "completion_tokens": 3}}'
    )


def anthropic_body(number: str) -> str:
    return (
        '{"type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",'
        ' "content": [{"type": "text", "text": "hi"}],'
        f' "usage": {{"input_tokens": 5, "output_tokens": {number}}}}}'
    )


def local_fleet(tmp_path: Path, url: str) -> InProcessFleet:
    config = tmp_path / "operator" / "fleet.yaml"
    config.parent.mkdir(exist_ok=True)
    price = "input_usd_per_mtok: 2.0, output_usd_per_mtok: 8.0"
    config.write_text(
        "providers:\n"
        f"  o: {{kind: openai, base_url: '{url}/v1'}}\n"
        f"  a: {{kind: anthropic, base_url: '{url}'}}\n"
        "models:\n"
        f"  om: {{provider: o, name: gpt-x, {price}}}\n"
        f"  am: {{provider: a, name: claude-x, {price}}}\n"
    )
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    env = {
        "FLEET_CONFIG": str(config),
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "FLEET_TRANSIENT_RETRIES": "0",
    }
    return InProcessFleet.from_settings(Settings.from_env(env))


@pytest.mark.parametrize("number", HOSTILE)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_hostile_usage_on_the_live_path_fails_that_call_in_one_line(
    tmp_path: Path, allow: None, kind: str, number: str
) -> None:
    body = openai_body(number) if kind == "openai" else anthropic_body(number)
    server = Answers(body)
    try:
        local = local_fleet(tmp_path, server.url)
        trace = local.run("hello", model="om" if kind == "openai" else "am")
    finally:
        server._http.stop()
    assert server.calls >= 1
    assert trace.status == "failed", trace.status
    error = trace.error or ""
    assert "not a finite number" in error or "outside" in error, error
    assert "\n" not in error and "Traceback" not in error and len(error) < 400
    stored = local.store.get_trace(trace.trace_id)
    assert stored.stats.cost_usd < 1.0  # no 10^300 in the stats
    assert stored.stats.prompt_tokens < 10**9 and stored.stats.completion_tokens < 10**9


@pytest.mark.parametrize("number", [float("nan"), float("inf"), 1e300, 10**400, "inf", "nan"])
def test_token_counts_are_finite_and_bounded(number: object) -> None:
    with pytest.raises(ModelBehaviorError, match="prompt_tokens"):
        token_count({"prompt_tokens": number}, "prompt_tokens")


def test_plain_token_counts_still_read() -> None:
    assert token_count({"a": 12}, "a") == 12 and token_count({"a": "7"}, "a") == 7
    assert token_count({"a": -3}, "a") == 0 and token_count({}, "a") == 0
    assert token_count({"a": True}, "a") == 0 and token_count({"a": "many"}, "a") == 0


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-5"])
def test_a_hostile_rate_limit_header_is_no_signal_not_a_crash(value: str) -> None:
    headers = {
        "x-ratelimit-limit-requests": value,
        "x-ratelimit-remaining-requests": value,
        "x-ratelimit-reset-requests": "1s",
    }
    signal = rate_signal(headers, 0.0)
    assert signal.requests.limit is None and signal.requests.remaining is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "1e300"}, MAX_WAIT_S),
        ({"retry-after": "inf"}, None),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after": "2"}, 2.0),
    ],
)
def test_retry_after_is_finite_and_bounded(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers, 0.0) == expected


@pytest.mark.parametrize("component", ["NaN", "Infinity", "1e400", "1" + "0" * 400, "1e300"])
def test_an_embedding_with_a_hostile_component_is_that_calls_error(component: str) -> None:
    data = json.loads(f'{{"data": [{{"index": 0, "embedding": [0.5, {component}]}}]}}')
    with pytest.raises(ModelBehaviorError, match="/embeddings"):
        parse_vectors(data, 1, "emb")


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), -1.0, 1e300])
def test_a_clients_hostile_timeout_is_one_line_before_anything_is_submitted(
    tmp_path: Path, timeout_s: float
) -> None:
    import asyncio

    from mcp.server.mcpserver.exceptions import ToolError

    from fleet.client import Fleet
    from fleet.inprocess import InProcessDispatcher
    from fleet.runtime import Runtime
    from fleet.storage.backends.memory.store import MemoryStore
    from fleet.testing import ScriptedModel, text
    from fleetops.mcp_server import FleetTools
    from tests.test_batch import ThreadBackend

    settings = Settings(workspace=tmp_path, env={})
    store = MemoryStore()
    model = ScriptedModel(function=lambda messages, tools: text("done"))
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": model})
    backend = ThreadBackend(runtime)
    fleet = Fleet(runtime, backend)
    tools = FleetTools(fleet)
    try:
        calls = [
            tools.wait("t-none", timeout_s=timeout_s),
            tools.delegate("change it", model="test", timeout_s=timeout_s),
            tools.explore(["a", "b"], None, model="test", timeout_s=timeout_s),  # type: ignore[arg-type]
        ]
        for pending in calls:
            with pytest.raises(ToolError, match="timeout_s") as caught:
                asyncio.run(pending)
            assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
        assert store.list_traces(limit=10) == []  # nothing half-submitted
        with pytest.raises(ConfigError, match="timeout_s"):  # the client library, too
            list(fleet.events("t-none", timeout_s))
    finally:
        backend.pool.shutdown(wait=True)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_live_answer_nested_200000_deep_is_a_malformed_answer(kind: str) -> None:
    import httpx

    from fleet.llm.anthropic import AnthropicClient
    from fleet.llm.openai import OpenAIClient
    from fleet.llm.retry import error_detail

    deep = b'{"choices": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    client = (OpenAIClient if kind == "openai" else AnthropicClient)("http://127.0.0.1:9", "", "m")
    try:
        with pytest.raises(ModelBehaviorError):
            client.parse_response(httpx.Response(200, content=deep))
    finally:
        client.close()
    assert len(error_detail(httpx.Response(400, content=deep))) < 600  # an error body, too
