"""The model seam: one protocol, one response shape, and the test guard."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.errors import ModelRequestsDisabled
from fleet.llm.ratelimit import RateSignal
from fleet.llm.timing import CallTiming

ALLOW_MODEL_REQUESTS = True
"""Switched off by the test suite so no real client can ever send a request."""


def check_model_requests_allowed(provider: str) -> None:
    """Raise `ModelRequestsDisabled` when the test guard is on."""
    if not ALLOW_MODEL_REQUESTS:
        raise ModelRequestsDisabled(f"real model requests are disabled (provider {provider!r})")


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for. `arguments` is the raw JSON text."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; malformed JSON raises `ValueError`."""
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError("tool arguments must be a JSON object")
        return value

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI wire form, as stored in assistant messages."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of one model call."""

    prompt_tokens: int = 0
    """Every prompt token, the cached ones included."""
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """At the model's prices, cached prompt tokens at the cached prices."""
    cached_tokens: int = 0
    """Prompt tokens the provider's prompt cache served (part of `prompt_tokens`)."""
    cache_write_tokens: int = 0
    """Prompt tokens written to the provider's prompt cache (part of `prompt_tokens`)."""


@dataclass(frozen=True)
class LLMResponse:
    """What every client returns: text and/or tool calls, with usage."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    rate: RateSignal | None = None
    """The provider's rate-limit headers on this response, if it sent any."""
    batch_id: str | None = None
    """The provider batch that answered this call (`fleet.batchapi`); None for a live call."""
    timing: CallTiming | None = None
    """When the call ran and its attempts (`fleet.loop.call.call_model` sets it)."""


class LLMClient(Protocol):
    """Anything that turns OpenAI-format messages plus tool schemas into a response.

    A client whose call ends at once when the call's cancel handle (`fleet.llm.cancel`) is
    cancelled from another thread says so with an attribute `ends_on_cancel = True` (the
    HTTP clients: the handle shuts their connections down; the scripted model: its latency
    waits on the handle): a cut may then come while the call runs in the run's own thread
    (`fleet.loop.cut`). Any other is run in a thread of its own, which a cut abandons. A
    client that opens no connection may say so with `holds_no_connection = True`: unless it
    ends on a cancel, it is then given no handle, there being nothing to close.
    """

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        """One chat completion. Raises `TransientLLMError` for retryable failures.

        `cache_key` groups calls that share a prompt prefix (one preset of one tree) so a
        provider's prompt cache can serve them (`fleet.llm.caching.cache_key`); a client
        whose provider has no such routing ignores it.
        """
        ...
