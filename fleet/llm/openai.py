"""A client for any OpenAI-compatible `/chat/completions` server.

OpenAI, OpenRouter, vLLM, Ollama and LiteLLM all speak this wire format; local servers
often need no key, and then no `Authorization` header is sent. A call's `cache_key` goes
out as `prompt_cache_key` (`fleet.llm.caching`) unless the alias sets `prompt_cache: false`
(some compatible servers refuse fields they do not know).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from typing import Any

import httpx

from fleet.errors import ModelBehaviorError
from fleet.llm.base import LLMResponse, ToolCall, Usage, check_model_requests_allowed
from fleet.llm.pricing import CachedTokens, ModelPricing, cost_usd, token_count
from fleet.llm.ratelimit import RateSignal, rate_signal
from fleet.llm.retry import DEFAULT_RETRY, RetryPolicy, send_with_retry
from fleet.llm.transport import cuttable_client, is_cut
from fleet.security.redact import SHAPES_ONLY, Redactor

DEFAULT_TIMEOUT_S = 120.0

TOOL_ID_MAX_CHARS = 40
"""OpenAI rejects longer `tool_call_id`s; Anthropic's `toolu_` ids fit once re-prefixed."""

TOOL_ID_PREFIXES = ("call_", "toolu_")
_TOOL_ID_SAFE = re.compile(r"[A-Za-z0-9_-]+")


def normalise_tool_call_id(tool_id: str, prefix: str) -> str:
    """The id under `prefix` (`call_` or `toolu_`), the same every time for the same input.

    A known foreign prefix is swapped (`toolu_01A` <-> `call_01A`), so a trace can move
    between providers and back and keep its ids; an id that would be unsafe or too long
    is replaced by a hash of itself. Applied to both sides of every call/result pair, the
    pairs stay matched.
    """
    rest = tool_id
    for known in TOOL_ID_PREFIXES:
        if tool_id.startswith(known):
            rest = tool_id[len(known) :]
            break
    candidate = prefix + rest
    if rest and _TOOL_ID_SAFE.fullmatch(rest) and len(candidate) <= TOOL_ID_MAX_CHARS:
        return candidate
    return prefix + hashlib.sha256(tool_id.encode()).hexdigest()[:24]


TOOL_IMAGES_NOTE = "The images the tool results above returned:"


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of `messages` with every tool-call id in `call_` form.

    A tool message carries text only on this wire: the images of a run of tool results
    follow it as one user message of `image_url` parts (a user message between two tool
    results would break the call/result pairing).
    """
    converted: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for message in messages:
        message = dict(message)
        if images and message.get("role") != "tool":
            converted.append(_images_turn(images))
            images = []
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**call, "id": normalise_tool_call_id(call["id"], "call_")}
                for call in message["tool_calls"]
            ]
        if message.get("role") == "tool" and "tool_call_id" in message:
            message["tool_call_id"] = normalise_tool_call_id(message["tool_call_id"], "call_")
            if isinstance(message.get("content"), list):
                parts: list[dict[str, Any]] = message["content"]
                images += [p for p in parts if p.get("type") == "image_url"]
                message["content"] = "\n".join(
                    str(p.get("text", "")) for p in parts if p.get("type") == "text"
                )
        converted.append(message)
    if images:
        converted.append(_images_turn(images))
    return converted


def _images_turn(images: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": TOOL_IMAGES_NOTE}, *images]}


def parse_tool_call(raw: dict[str, Any]) -> ToolCall:
    """One `tool_calls` entry of a response; some local servers send arguments as an object."""
    function = raw.get("function") or {}
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    # Some local servers omit the id; the runtime needs one to pair the result.
    tool_id = raw.get("id") or f"call_{uuid.uuid4().hex[:24]}"
    return ToolCall(id=tool_id, name=str(function.get("name", "")), arguments=arguments)


class OpenAIClient:
    """`LLMClient` over `POST {base_url}/chat/completions`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        pricing: ModelPricing | None = None,
        http: httpx.Client | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        provider: str = "openai",
        api_key_env: str = "OPENAI_API_KEY",
        redactor: Redactor = SHAPES_ONLY,
        prompt_cache: bool = True,
    ) -> None:
        """Build a client; `api_key` may be empty for a local server.

        Args:
            base_url: e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
            api_key: sent as a bearer token; never shown in reprs or errors.
            model: the provider's model name, e.g. `gpt-4o-mini`.
            timeout_s: per request.
            pricing: overrides the built-in price table.
            http: a shared client; one is created (and owned) when None.
            retry: backoff policy for 429, 5xx and network errors.
            provider: name used in error messages.
            api_key_env: the env var the key came from, named in auth errors.
            redactor: masks the process's secrets in error texts; this key is added.
            prompt_cache: send a call's `cache_key` as `prompt_cache_key`.
        """
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.provider = provider
        self.prompt_cache = prompt_cache
        self._api_key = api_key
        self._api_key_env = api_key_env
        self._redactor = redactor.with_values([api_key])
        self._timeout_s = timeout_s
        self._pricing = pricing
        self._retry = retry
        self._owns_http = http is None
        self._http = http if http is not None else cuttable_client(timeout_s)
        self.ends_on_cancel = http is None and is_cut(self._http)
        """A call ends at once when its cancel handle is (`fleet.llm.base.LLMClient`)."""

    def __repr__(self) -> str:
        return f"OpenAIClient(base_url={self.base_url!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http:
            self._http.close()

    def request_body(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> dict[str, Any]:
        """The JSON this client would send; tools are passed through unchanged."""
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages)}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if temperature is not None:
            body["temperature"] = temperature
        if max_output_tokens is not None:
            # `max_tokens`, not `max_completion_tokens`: every compatible server knows it.
            body["max_tokens"] = max_output_tokens
        if cache_key and self.prompt_cache:
            body["prompt_cache_key"] = cache_key
        return body

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        """One chat completion; see `LLMClient.complete`."""
        check_model_requests_allowed("openai")
        body = self.request_body(
            messages,
            tools,
            temperature=temperature,
            max_output_tokens=max_output_tokens,
            cache_key=cache_key,
        )
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        response = send_with_retry(
            lambda: self._http.post(
                f"{self.base_url}/chat/completions",
                json=body,
                headers=headers,
                timeout=self._timeout_s,
            ),
            provider=self.provider,
            api_key_env=self._api_key_env,
            policy=self._retry,
            redactor=self._redactor,
        )
        return self.parse_response(response)

    def parse_response(self, response: httpx.Response) -> LLMResponse:
        """Turn a 2xx `/chat/completions` answer into an `LLMResponse`."""
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            raise ModelBehaviorError(
                f"{self.provider} sent a response without choices[0].message ({exc!r})"
            ) from exc
        return LLMResponse(
            content=message.get("content"),
            tool_calls=tuple(parse_tool_call(raw) for raw in message.get("tool_calls") or ()),
            usage=self._usage(data.get("usage")),
            model=str(data.get("model") or self.model),
            finish_reason=choice.get("finish_reason"),
            rate=_signal(response),
        )

    def _usage(self, raw: Any) -> Usage:
        """`usage`; the cached tokens are part of `prompt_tokens` (`prompt_tokens_details`)."""
        prompt = token_count(raw, "prompt_tokens")
        completion = token_count(raw, "completion_tokens")
        details = raw.get("prompt_tokens_details") if isinstance(raw, dict) else None
        cached = CachedTokens(read=min(token_count(details, "cached_tokens"), prompt))
        cost = cost_usd(self.model, prompt, completion, self._pricing, cached=cached, kind="openai")
        return Usage(prompt, completion, cost, cached.read)


def _signal(response: httpx.Response) -> RateSignal | None:
    signal = rate_signal(response.headers, time.time())
    return None if signal.empty else signal
