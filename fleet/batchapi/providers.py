"""The providers' Batch APIs behind one small Protocol: submit, status, results, cancel, find.

OpenAI: the requests go up as a JSONL file (`POST /files`, `purpose=batch`), a batch is
created on it (`POST /batches`, endpoint `/v1/chat/completions`, the flush id in its
`metadata`), and its output and error files are read back by `custom_id`. Anthropic: the
requests go in the body of `POST /v1/messages/batches`; results are JSONL by `custom_id`.
Each request body is what the live client would send (`request_body`), and each answer is
parsed by the live client's own parser, then priced at the batch price.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fleet.errors import ConfigError, ModelBehaviorError
from fleet.llm.base import LLMResponse, check_model_requests_allowed
from fleet.llm.clients import provider_key
from fleet.llm.config import FleetConfig, ModelTarget, resolve_target
from fleet.llm.pricing import CachedTokens, ModelPricing, cost_usd, lookup_pricing
from fleet.llm.retry import DEFAULT_RETRY, send_with_retry
from fleet.security.redact import Redactor

# httpx (~0.2 s of CPU, its CLI included) and the live clients are imported where a model's
# Batch API client is built: every worker imports this module for the sweeper's poll.
if TYPE_CHECKING:
    import httpx

    from fleet.llm.anthropic import AnthropicClient
    from fleet.llm.openai import OpenAIClient

OPENAI_MAX_REQUESTS, OPENAI_MAX_BYTES = 50_000, 200 * 1024 * 1024  # the providers' limits
ANTHROPIC_MAX_REQUESTS, ANTHROPIC_MAX_BYTES = 100_000, 256 * 1024 * 1024
FIND_WINDOW_MS = 10 * 60 * 1000
"""A batch created this close to a lost flush may be that flush (Anthropic keeps no tag)."""
HTTP_TIMEOUT_S = 120.0

Phase = Literal["running", "ended", "gone"]
"""`ended`: results are ready. `gone`: expired, cancelled or failed; whatever results it
has are read, the rest is sent again."""


@dataclass(frozen=True)
class Outcome:
    """One request's result: the provider's answer body, or the error it gave."""

    body: dict[str, Any] | None = None
    error: str | None = None


class BatchProvider(Protocol):
    """What the poller needs of a provider's Batch API."""

    max_requests: int
    max_bytes: int

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The provider's request for a queued call (messages, tools, temperature...)."""

    def submit(self, lines: list[tuple[str, dict[str, Any]]], flush_id: str) -> str:
        """Send (wire id, request) pairs as one batch tagged `flush_id`; its batch id."""

    def phase(self, batch_id: str) -> Phase:
        """Where the batch is."""

    def results(self, batch_id: str) -> dict[str, Outcome]:
        """Wire id -> outcome, for every request the batch answered."""

    def cancel(self, batch_id: str) -> None:
        """Ask the provider to cancel the batch."""

    def find(self, flush_id: str, at_ms: int, count: int) -> str | None:
        """The batch a lost flush created, if the provider has one; else None."""

    def parse(self, body: dict[str, Any]) -> LLMResponse:
        """An answer body as the live client reads it, at the batch price."""

    def close(self) -> None:
        """Close the HTTP connections."""


def batch_pricing(target: ModelTarget) -> ModelPricing | None:
    """The alias's batch prices, else half its live prices (the providers' discount)."""
    if target.batch_pricing is not None:
        return target.batch_pricing
    live = target.pricing or lookup_pricing(target.model)
    if live is None:
        return None
    cached, written = live.cached_input_usd_per_mtok, live.cache_write_usd_per_mtok
    return ModelPricing(
        live.input_usd_per_mtok / 2,
        live.output_usd_per_mtok / 2,
        None if cached is None else cached / 2,
        None if written is None else written / 2,
    )


class _Http:
    """The HTTP side both providers share: headers, retries, redaction, the test guard."""

    def __init__(
        self, target: ModelTarget, key: str, headers: dict[str, str], env: Mapping[str, str]
    ) -> None:
        self.target = target
        self._headers = headers
        self._redactor = Redactor.from_env(env).with_values([key])
        import httpx  # see the TYPE_CHECKING block

        self._http = httpx.Client(timeout=HTTP_TIMEOUT_S)

    def send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        check_model_requests_allowed(self.target.kind)

        def once() -> httpx.Response:
            return self._http.request(method, url, headers=self._headers, **kwargs)

        return send_with_retry(
            once,
            provider=self.target.provider,
            api_key_env=self.target.api_key_env,
            policy=DEFAULT_RETRY,
            redactor=self._redactor,
        )

    def close(self) -> None:
        self._http.close()

    def json(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        response = self.send(method, url, **kwargs)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ModelBehaviorError(f"{self.target.provider} sent no JSON object from {url}")
        return data


def _priced(response: LLMResponse, target: ModelTarget) -> LLMResponse:
    usage = response.usage
    cached = CachedTokens(read=usage.cached_tokens, written=usage.cache_write_tokens)
    cost = cost_usd(
        target.model,
        usage.prompt_tokens,
        usage.completion_tokens,
        batch_pricing(target),
        cached=cached,
        kind=target.kind,
    )
    return replace(response, usage=replace(usage, cost_usd=cost))


def _jsonl(text: str) -> list[dict[str, Any]]:
    """The objects of a JSONL text; a line that is not an object is skipped (hostile files)."""
    found = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("custom_id"), str):
            found.append(value)
    return found


class _Wire:
    """What both providers share: the live client's request body and answer, one HTTP client."""

    target: ModelTarget
    _client: OpenAIClient | AnthropicClient
    _http: _Http

    def request(self, body: dict[str, Any]) -> dict[str, Any]:  # noqa: D102
        return self._client.request_body(
            body["messages"],
            body.get("tools") or [],
            temperature=body.get("temperature"),
            max_output_tokens=body.get("max_output_tokens"),
        )

    def parse(self, body: dict[str, Any]) -> LLMResponse:  # noqa: D102
        import httpx  # loaded already: `_Http` imported it

        return _priced(self._client.parse_response(httpx.Response(200, json=body)), self.target)

    def close(self) -> None:  # noqa: D102
        self._http.close()
        self._client.close()


class OpenAIBatch(_Wire):
    """OpenAI's Batch API (files + batches) for one model."""

    max_requests, max_bytes = OPENAI_MAX_REQUESTS, OPENAI_MAX_BYTES

    def __init__(self, target: ModelTarget, key: str, env: Mapping[str, str]) -> None:
        """Talk to `target.base_url` (e.g. `https://api.openai.com/v1`)."""
        self.base = target.base_url.rstrip("/")
        self.target = target
        from fleet.llm.openai import OpenAIClient  # see the TYPE_CHECKING block

        self._client = OpenAIClient(target.base_url, "", target.model, pricing=target.pricing)
        self._http = _Http(target, key, {"Authorization": f"Bearer {key}"} if key else {}, env)

    def submit(self, lines: list[tuple[str, dict[str, Any]]], flush_id: str) -> str:  # noqa: D102
        payload = "".join(
            json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b})
            + "\n"
            for c, b in lines
        )
        files = {"file": ("fleet-batch.jsonl", payload.encode(), "application/jsonl")}
        uploaded = self._http.json(
            "POST", f"{self.base}/files", data={"purpose": "batch"}, files=files
        )
        created = self._http.json(
            "POST",
            f"{self.base}/batches",
            json={
                "input_file_id": str(uploaded.get("id")),
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": {"fleet_flush_id": flush_id},
            },
        )
        return _batch_id(created, self.target)

    def phase(self, batch_id: str) -> Phase:  # noqa: D102
        status = self._http.json("GET", f"{self.base}/batches/{batch_id}").get("status")
        if status == "completed":
            return "ended"
        if status in ("failed", "expired", "cancelled"):
            return "gone"
        return "running"

    def results(self, batch_id: str) -> dict[str, Outcome]:  # noqa: D102
        batch = self._http.json("GET", f"{self.base}/batches/{batch_id}")
        found: dict[str, Outcome] = {}
        for field in ("error_file_id", "output_file_id"):  # answers beat errors
            if isinstance(file_id := batch.get(field), str) and file_id:
                text = self._http.send("GET", f"{self.base}/files/{file_id}/content").text
                found |= {line["custom_id"]: _openai_outcome(line) for line in _jsonl(text)}
        return found

    def cancel(self, batch_id: str) -> None:  # noqa: D102
        self._http.send("POST", f"{self.base}/batches/{batch_id}/cancel")

    def find(self, flush_id: str, at_ms: int, count: int) -> str | None:  # noqa: D102
        listed = self._http.json("GET", f"{self.base}/batches", params={"limit": 100})
        for batch in listed.get("data") or []:
            metadata = batch.get("metadata") if isinstance(batch, dict) else None
            if isinstance(metadata, dict) and metadata.get("fleet_flush_id") == flush_id:
                return _batch_id(batch, self.target)
        return None


def _openai_outcome(line: dict[str, Any]) -> Outcome:
    response = line.get("response")
    if isinstance(response, dict) and response.get("status_code") == 200:
        body = response.get("body")
        if isinstance(body, dict):
            return Outcome(body=body)
    error = line.get("error") or (response or {}).get("body") or "no answer"
    return Outcome(error=json.dumps(error)[:500])


class AnthropicBatch(_Wire):
    """Anthropic's Message Batches for one model."""

    max_requests, max_bytes = ANTHROPIC_MAX_REQUESTS, ANTHROPIC_MAX_BYTES

    def __init__(self, target: ModelTarget, key: str, env: Mapping[str, str]) -> None:
        """Talk to `target.base_url` (e.g. `https://api.anthropic.com`)."""
        self.base = target.base_url.rstrip("/") + "/v1/messages/batches"
        self.target = target
        from fleet.llm.anthropic import ANTHROPIC_VERSION, AnthropicClient  # as OpenAIClient

        self._client = AnthropicClient(target.base_url, "", target.model, pricing=target.pricing)
        headers = {"anthropic-version": ANTHROPIC_VERSION} | ({"x-api-key": key} if key else {})
        self._http = _Http(target, key, headers, env)

    def submit(self, lines: list[tuple[str, dict[str, Any]]], flush_id: str) -> str:  # noqa: D102
        requests = [{"custom_id": c, "params": b} for c, b in lines]
        return _batch_id(
            self._http.json("POST", self.base, json={"requests": requests}), self.target
        )

    def phase(self, batch_id: str) -> Phase:  # noqa: D102
        batch = self._http.json("GET", f"{self.base}/{batch_id}")
        if batch.get("processing_status") != "ended":
            return "running"
        counts = batch.get("request_counts") or {}
        lost = int(counts.get("expired") or 0) + int(counts.get("canceled") or 0)
        return "gone" if lost else "ended"

    def results(self, batch_id: str) -> dict[str, Outcome]:  # noqa: D102
        text = self._http.send("GET", f"{self.base}/{batch_id}/results").text
        found = {line["custom_id"]: _anthropic_outcome(line) for line in _jsonl(text)}
        return {c: o for c, o in found.items() if o is not None}  # expired, cancelled: lost

    def cancel(self, batch_id: str) -> None:  # noqa: D102
        self._http.send("POST", f"{self.base}/{batch_id}/cancel")

    def find(self, flush_id: str, at_ms: int, count: int) -> str | None:  # noqa: D102
        """Anthropic keeps no tag: a batch of `count` requests created near `at_ms`, if one."""
        listed = self._http.json("GET", self.base, params={"limit": 100})
        matches = [
            b
            for b in listed.get("data") or []
            if isinstance(b, dict) and _near(b.get("created_at"), at_ms) and _total(b) == count
        ]
        return _batch_id(matches[0], self.target) if len(matches) == 1 else None


def _anthropic_outcome(line: dict[str, Any]) -> Outcome | None:
    """The request's answer or error; None when the batch lost it (it is sent again)."""
    result = line.get("result")
    if not isinstance(result, dict):
        return Outcome(error="no result")
    if result.get("type") == "succeeded" and isinstance(message := result.get("message"), dict):
        return Outcome(body=message)
    if result.get("type") in ("expired", "canceled"):
        return None
    return Outcome(error=json.dumps(result.get("error") or "no answer")[:500])


def _near(created_at: object, at_ms: int) -> bool:
    if not isinstance(created_at, str):
        return False
    try:
        created_ms = int(datetime.fromisoformat(created_at).timestamp() * 1000)
    except ValueError:
        return False
    return abs(created_ms - at_ms) <= FIND_WINDOW_MS


def _total(batch: dict[str, Any]) -> int:
    counts = batch.get("request_counts")
    if not isinstance(counts, dict):
        return -1
    return sum(int(v) for v in counts.values() if isinstance(v, int))


def _batch_id(data: dict[str, Any], target: ModelTarget) -> str:
    batch_id = data.get("id")
    if not isinstance(batch_id, str) or not batch_id or len(batch_id) > 200 or "/" in batch_id:
        raise ModelBehaviorError(f"{target.provider} answered a batch without a usable id")
    return batch_id


ProviderFactory = Callable[[str], BatchProvider]
"""Model name -> the Batch API of its provider (tests inject their own)."""


def check_batch_api(config: FleetConfig, model_name: str) -> ModelTarget:
    """The model's target, if its provider has a Batch API; else `ConfigError` in one line."""
    target = resolve_target(config, model_name)
    if target.kind == "scripted" or not target.batch_api:
        raise ConfigError(
            f"model {model_name!r}: provider {target.provider!r} has no batch API "
            "(set batch_api: true on the provider in fleet.yaml if it speaks one)"
        )
    return target


class BatchProviders:
    """A `ProviderFactory` building each model's Batch API client once; `close` ends them."""

    def __init__(self, config: FleetConfig, env: Mapping[str, str]) -> None:
        """Clients for the models of `config`, keys read from `env`."""
        self._config = config
        self._env = env
        self._built: dict[str, BatchProvider] = {}

    def __call__(self, model_name: str) -> BatchProvider:
        """The model's Batch API; `ConfigError` if its provider has none."""
        if model_name not in self._built:
            target = check_batch_api(self._config, model_name)
            key = provider_key(target, self._env)
            made: BatchProvider
            if target.kind == "anthropic":
                made = AnthropicBatch(target, key, self._env)
            else:
                made = OpenAIBatch(target, key, self._env)
            self._built[model_name] = made
        return self._built[model_name]

    def close(self) -> None:
        """Close every client built."""
        for provider in self._built.values():
            provider.close()
        self._built.clear()


def provider_for(config: FleetConfig, env: Mapping[str, str]) -> BatchProviders:
    """The Batch API clients of a process (one per model)."""
    return BatchProviders(config, env)
