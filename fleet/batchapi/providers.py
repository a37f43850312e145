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
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fleet.batchapi.http import BatchHttp
from fleet.batchapi.lines import LineCounts, Outcome, read_outcomes
from fleet.errors import ConfigError, ModelBehaviorError
from fleet.llm.base import LLMResponse
from fleet.llm.clients import provider_key
from fleet.llm.config import FleetConfig, ModelTarget, resolve_target
from fleet.llm.pricing import CachedTokens, ModelPricing, cost_usd, lookup_pricing

# httpx (~0.2 s of CPU, its CLI included) and the live clients are imported where a model's
# Batch API client is built: every worker imports this module for the sweeper's poll.
if TYPE_CHECKING:
    from fleet.llm.anthropic import AnthropicClient
    from fleet.llm.openai import OpenAIClient

OPENAI_MAX_REQUESTS, OPENAI_MAX_BYTES = 50_000, 200 * 1024 * 1024  # the providers' limits
ANTHROPIC_MAX_REQUESTS, ANTHROPIC_MAX_BYTES = 100_000, 256 * 1024 * 1024
FIND_WINDOW_MS = 10 * 60 * 1000
"""A batch created this close to a lost flush may be that flush (Anthropic keeps no tag)."""
ERROR_CHARS = 500
_log = logging.getLogger(__name__)

Phase = Literal["running", "ended", "gone"]
"""`ended`: results are ready. `gone`: expired, cancelled or failed; whatever results it
has are read, the rest is sent again."""


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

    def results(self, batch_id: str, wanted: Collection[str]) -> dict[str, Outcome]:
        """Wire id -> outcome, for each of `wanted` the batch answered (the rest: ignored)."""

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


class _Wire:
    """What both providers share: the live client's request body and answer, one HTTP client."""

    target: ModelTarget
    _client: OpenAIClient | AnthropicClient
    _http: BatchHttp

    def request(self, body: dict[str, Any]) -> dict[str, Any]:  # noqa: D102
        return self._client.request_body(
            body["messages"],
            body.get("tools") or [],
            temperature=body.get("temperature"),
            max_output_tokens=body.get("max_output_tokens"),
        )

    def parse(self, body: dict[str, Any]) -> LLMResponse:  # noqa: D102
        import httpx  # loaded already: `BatchHttp` imported it

        try:
            answer = httpx.Response(200, json=body)
        except (ValueError, RecursionError) as exc:  # no strict JSON (`1e400` read as inf)
            raise ModelBehaviorError(
                f"{self.target.provider} sent a malformed batch answer ({type(exc).__name__})"
            ) from None
        return _priced(self._client.parse_response(answer), self.target)

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
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = BatchHttp(target, key, headers, env)

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

    def results(self, batch_id: str, wanted: Collection[str]) -> dict[str, Outcome]:  # noqa: D102
        batch = self._http.json("GET", f"{self.base}/batches/{batch_id}")
        found: dict[str, Outcome] = {}
        for field in ("error_file_id", "output_file_id"):  # answers beat errors
            file_id = batch.get(field)
            if isinstance(file_id, str) and 0 < len(file_id) <= 200 and "/" not in file_id:
                url = f"{self.base}/files/{file_id}/content"
                with self._http.stream("GET", url) as chunks:
                    counts = read_outcomes(chunks, wanted, _openai_outcome, found)
                _log_skipped(self.target, batch_id, counts)
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
    body = response.get("body") if isinstance(response, dict) else None
    return Outcome(error=_error_text(line.get("error") or body))


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
        self._http = BatchHttp(target, key, headers, env)

    def submit(self, lines: list[tuple[str, dict[str, Any]]], flush_id: str) -> str:  # noqa: D102
        requests = [{"custom_id": c, "params": b} for c, b in lines]
        return _batch_id(
            self._http.json("POST", self.base, json={"requests": requests}), self.target
        )

    def phase(self, batch_id: str) -> Phase:  # noqa: D102
        batch = self._http.json("GET", f"{self.base}/{batch_id}")
        if batch.get("processing_status") != "ended":
            return "running"
        counts = batch.get("request_counts")
        counts = counts if isinstance(counts, dict) else {}
        # Any count but a plain 0 (NaN, 1e300, text) says requests were lost: what the
        # batch has is read and the rest sent again, rather than the batch waited on forever.
        lost = any((counts.get(k) or 0) != 0 for k in ("expired", "canceled"))
        return "gone" if lost else "ended"

    def results(self, batch_id: str, wanted: Collection[str]) -> dict[str, Outcome]:  # noqa: D102
        found: dict[str, Outcome] = {}
        with self._http.stream("GET", f"{self.base}/{batch_id}/results") as chunks:
            counts = read_outcomes(chunks, wanted, _anthropic_outcome, found)
        _log_skipped(self.target, batch_id, counts)
        return found  # expired, cancelled: not in it (lost, sent again)

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
    return Outcome(error=_error_text(result.get("error")))


def _error_text(error: object) -> str:
    """A provider's error value as a short text (it may be anything JSON holds)."""
    try:
        return json.dumps(error or "no answer")[:ERROR_CHARS]
    except (ValueError, RecursionError):
        return "an error the provider described unreadably"


def _log_skipped(target: ModelTarget, batch_id: str, counts: LineCounts) -> None:
    """Counts only: a foreign line's text (and its custom id) is the provider's to choose."""
    if counts.foreign or counts.unreadable:
        _log.warning(
            "batch %s of %s: %d answer lines for calls not in it and %d unreadable lines ignored",
            batch_id,
            target.provider,
            counts.foreign,
            counts.unreadable,
        )


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
