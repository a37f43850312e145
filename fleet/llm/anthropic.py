"""A client for Anthropic's Messages API, fed the same OpenAI-format history as every client.

The conversion: system messages become the top-level `system`; assistant `tool_calls`
become `tool_use` blocks; consecutive `tool` messages become one user message of
`tool_result` blocks (consecutive same-role turns are merged, which Anthropic expects);
tool-call ids are re-prefixed to `toolu_` on both sides of every pair. Prompt-cache
breakpoints go on the last tool, the system prompt and the conversation
(`fleet.llm.caching.mark_breakpoints`) unless the alias sets `prompt_cache: false`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from fleet.errors import ModelBehaviorError
from fleet.llm.base import LLMResponse, ToolCall, Usage, check_model_requests_allowed
from fleet.llm.caching import mark_breakpoints
from fleet.llm.openai import DEFAULT_TIMEOUT_S, normalise_tool_call_id
from fleet.llm.pricing import CachedTokens, ModelPricing, cost_usd, token_count
from fleet.llm.ratelimit import RateSignal, rate_signal
from fleet.llm.retry import DEFAULT_RETRY, RetryPolicy, send_with_retry
from fleet.llm.transport import cuttable_client, is_cut
from fleet.llm.vision import split_data_url
from fleet.security.redact import SHAPES_ONLY, Redactor

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_OUTPUT_TOKENS = 4096

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}
"""Anthropic `stop_reason` -> the OpenAI `finish_reason` the rest of the runtime reads."""


def _text_of(content: Any) -> str:
    """Plain text of an OpenAI `content`: a string, a list of text parts, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """User/assistant content as blocks; `image_url` parts become `image` blocks."""
    if not isinstance(content, list):
        text = _text_of(content)
        # Anthropic rejects empty text blocks.
        return [{"type": "text", "text": text}] if text else []
    return [_block(part) for part in content if part.get("type") != "text" or part.get("text")]


def _block(part: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI content part as an Anthropic block (other kinds pass through as given)."""
    if part.get("type") == "text":
        return {"type": "text", "text": part["text"]}
    if part.get("type") != "image_url":
        return part
    url = str((part.get("image_url") or {}).get("url", ""))
    inline = split_data_url(url)
    if inline is None:
        return {"type": "image", "source": {"type": "url", "url": url}}
    media_type, data = inline
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _result_content(content: Any) -> str | list[dict[str, Any]]:
    """A tool result's content: its text, or text and `image` blocks when it has images."""
    if isinstance(content, list) and any(p.get("type") == "image_url" for p in content):
        return _text_blocks(content)
    return _text_of(content)


def _tool_input(arguments: str) -> dict[str, Any]:
    """`tool_use.input` must be an object; malformed arguments are kept, not dropped."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"_unparsed_arguments": arguments}
    return value if isinstance(value, dict) else {"_unparsed_arguments": arguments}


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = _text_blocks(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": normalise_tool_call_id(call["id"], "toolu_"),
                "name": function["name"],
                "input": _tool_input(function.get("arguments", "")),
            }
        )
    return blocks


def _turn(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The Anthropic role and content blocks of one non-system OpenAI message."""
    role = message.get("role")
    if role == "user":
        return "user", _text_blocks(message.get("content"))
    if role == "assistant":
        return "assistant", _assistant_blocks(message)
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": normalise_tool_call_id(message["tool_call_id"], "toolu_"),
            "content": _result_content(message.get("content")),
        }
        return "user", [result]
    raise ModelBehaviorError(f"cannot send a message with role {role!r} to Anthropic")


def to_anthropic_messages(
    messages: list[dict[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """OpenAI-format history -> (`system` text, Anthropic `messages`)."""
    system_parts: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "system":
            system_parts.append(_text_of(message.get("content")))
            continue
        role, blocks = _turn(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(part for part in system_parts if part), turns


def to_anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools -> `{name, description, input_schema}`."""
    converted = []
    for tool in tools:
        function = tool.get("function", tool)
        entry: dict[str, Any] = {
            "name": function["name"],
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            entry["description"] = function["description"]
        converted.append(entry)
    return converted


class AnthropicClient:
    """`LLMClient` over `POST {base_url}/v1/messages`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        pricing: ModelPricing | None = None,
        http: httpx.Client | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        provider: str = "anthropic",
        api_key_env: str = "ANTHROPIC_API_KEY",
        redactor: Redactor = SHAPES_ONLY,
        prompt_cache: bool = True,
    ) -> None:
        """Build a client.

        Args:
            base_url: e.g. `https://api.anthropic.com` (without `/v1`).
            api_key: sent as `x-api-key`; never shown in reprs or errors.
            model: e.g. `claude-sonnet-4-5`.
            max_output_tokens: used when a call gives none (the API requires a value).
            timeout_s: per request.
            pricing: overrides the built-in price table.
            http: a shared client; one is created (and owned) when None.
            retry: backoff policy for 429, 5xx and network errors.
            provider: name used in error messages.
            api_key_env: the env var the key came from, named in auth errors.
            redactor: masks the process's secrets in error texts; this key is added.
            prompt_cache: mark prompt-cache breakpoints on every request.
        """
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.prompt_cache = prompt_cache
        self.provider = provider
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
        return f"AnthropicClient(base_url={self.base_url!r}, model={self.model!r})"

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
    ) -> dict[str, Any]:
        """The JSON this client would send for an OpenAI-format history."""
        system, turns = to_anthropic_messages(messages)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_output_tokens or self.max_output_tokens,
            "messages": turns,
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = to_anthropic_tools(tools)
        if temperature is not None:
            body["temperature"] = temperature
        return mark_breakpoints(body) if self.prompt_cache else body

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        """One Messages call; see `LLMClient.complete` (Anthropic has no `cache_key`)."""
        check_model_requests_allowed("anthropic")
        body = self.request_body(
            messages, tools, temperature=temperature, max_output_tokens=max_output_tokens
        )
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        response = send_with_retry(
            lambda: self._http.post(
                f"{self.base_url}/v1/messages", json=body, headers=headers, timeout=self._timeout_s
            ),
            provider=self.provider,
            api_key_env=self._api_key_env,
            policy=self._retry,
            redactor=self._redactor,
        )
        return self.parse_response(response)

    def parse_response(self, response: httpx.Response) -> LLMResponse:
        """Turn a 2xx Messages answer into an `LLMResponse`."""
        try:
            data = response.json()
            blocks: list[dict[str, Any]] = data["content"]
            texts = [block["text"] for block in blocks if block.get("type") == "text"]
            calls = tuple(
                ToolCall(id=block["id"], name=block["name"], arguments=json.dumps(block["input"]))
                for block in blocks
                if block.get("type") == "tool_use"
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ModelBehaviorError(
                f"{self.provider} sent a malformed Messages response ({exc!r})"
            ) from exc
        usage = self._usage(data.get("usage"))
        stop_reason = data.get("stop_reason")
        return LLMResponse(
            content="".join(texts) if texts else None,
            tool_calls=calls,
            usage=usage,
            model=str(data.get("model") or self.model),
            finish_reason=STOP_REASONS.get(stop_reason, stop_reason) if stop_reason else None,
            rate=_signal(response),
        )

    def _usage(self, raw: Any) -> Usage:
        """`usage`: cached prompt tokens are reported apart from `input_tokens`; all were read."""
        raw = raw if isinstance(raw, dict) else {}
        fresh, completion = token_count(raw, "input_tokens"), token_count(raw, "output_tokens")
        cached = CachedTokens(
            read=token_count(raw, "cache_read_input_tokens"),
            written=token_count(raw, "cache_creation_input_tokens"),
        )
        prompt = fresh + cached.read + cached.written
        cost = cost_usd(
            self.model, prompt, completion, self._pricing, cached=cached, kind="anthropic"
        )
        return Usage(prompt, completion, cost, cached.read, cached.written)


def _signal(response: httpx.Response) -> RateSignal | None:
    signal = rate_signal(response.headers, time.time())
    return None if signal.empty else signal
