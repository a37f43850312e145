"""A local provider that keeps a prompt cache and reports it in usage, on both wires.

`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) answer from a
`fleet.testing.Script` and count prompt tokens as characters / 4 of the request's prompt
(tools, system and messages serialised in the provider's prefix order). Like the real
caches, a prefix is readable only once the call that wrote it has answered (calls in
flight together all miss), and:

- OpenAI caches every prompt's whole prefix by itself, per `prompt_cache_key`; a later
  call reads the longest cached prefix of its own prompt (`prompt_tokens_details`).
- Anthropic caches only up to its `cache_control` breakpoints: a call reads the longest
  cached breakpoint prefix (`cache_read_input_tokens`) and writes the prefix of its last
  breakpoint beyond it (`cache_creation_input_tokens`); the rest is `input_tokens`.

Every request body is kept in `seen` for assertions; `latency_s` delays each answer.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from fleet.llm.base import LLMResponse
from fleet.testing import Script
from tests.fake_provider import CHARS_PER_TOKEN, send_json
from tests.loopback import LoopbackServer

MIN_CACHED_TOKENS = 0
"""Real providers cache from 1024 tokens on; this one caches any prefix (tests are small)."""


def tokens(text: str) -> int:
    """This server's token count of a text."""
    return len(text) // CHARS_PER_TOKEN


@dataclass
class CacheStats:
    """What the server answered and what its cache served, in tokens."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class CachingProvider:
    """The server; see the module docstring. Use as a context manager."""

    def __init__(self, script: Script, *, latency_s: float = 0.0) -> None:
        self.script = script
        self.latency_s = latency_s
        self.seen: list[dict[str, Any]] = []
        self.stats = CacheStats()
        self._cached: set[tuple[str, str]] = set()
        """(partition, prefix text) readable from the cache."""
        self._lock = threading.Lock()
        self._http = LoopbackServer(_handler_for(self))

    @property
    def url(self) -> str:
        return self._http.url

    def __enter__(self) -> CachingProvider:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._http.stop()

    # -- the caches ----------------------------------------------------------------------

    def openai(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Usage of an OpenAI call, and the prefixes it caches once answered."""
        partition = str(body.get("prompt_cache_key") or "")
        parts = [_dump(body.get("tools") or [])] + [_dump(m) for m in body["messages"]]
        prefixes = _prefixes(parts)
        with self._lock:
            read = max((p for p in prefixes if (partition, p) in self._cached), key=len, default="")
        total = tokens(prefixes[-1])
        usage = {
            "prompt_tokens": total,
            "completion_tokens": 0,
            "prompt_tokens_details": {"cached_tokens": _cacheable(tokens(read))},
        }
        return usage, [(partition, p) for p in prefixes]

    def anthropic(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Usage of a Messages call, and the breakpoint prefixes it caches once answered."""
        parts, marks = _anthropic_parts(body)
        prefixes = _prefixes(parts)
        points = [prefixes[i] for i in marks]
        with self._lock:
            read = max((p for p in points if ("", p) in self._cached), key=len, default="")
        total, read_n = tokens(prefixes[-1]), _cacheable(tokens(read))
        written = max((tokens(p) for p in points), default=0)
        write_n = _cacheable(written) - read_n if written > tokens(read) else 0
        usage = {
            "input_tokens": total - read_n - max(write_n, 0),
            "output_tokens": 0,
            "cache_read_input_tokens": read_n,
            "cache_creation_input_tokens": max(write_n, 0),
        }
        return usage, [("", p) for p in points]

    def answered(self, cached: list[tuple[str, str]], usage: dict[str, Any]) -> None:
        """The call answered: its prefixes become readable; counted."""
        with self._lock:
            self._cached.update(cached)
        with self.stats.lock:
            self.stats.calls += 1
            if "prompt_tokens" in usage:
                self.stats.prompt_tokens += usage["prompt_tokens"]
                self.stats.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
            else:
                read, write = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
                self.stats.prompt_tokens += usage["input_tokens"] + read + write
                self.stats.cached_tokens += read
                self.stats.cache_write_tokens += write


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _prefixes(parts: list[str]) -> list[str]:
    """The prompt's text up to and including each part."""
    out, text = [], ""
    for part in parts:
        text += part
        out.append(text)
    return out


def _cacheable(count: int) -> int:
    return count if count >= MIN_CACHED_TOKENS else 0


def _plain(block: Any) -> Any:
    """A block as the cache sees it: without its breakpoint mark."""
    return (
        {k: v for k, v in block.items() if k != "cache_control"}
        if isinstance(block, dict)
        else block
    )


def _anthropic_parts(body: dict[str, Any]) -> tuple[list[str], list[int]]:
    """The prompt in prefix order (tools, system, message blocks), and where its marks are."""
    parts: list[str] = []
    marks: list[int] = []
    system = body.get("system") or []
    blocks = [*(body.get("tools") or []), *(system if isinstance(system, list) else [system])]
    for turn in body.get("messages") or []:
        content = turn["content"]
        blocks += content if isinstance(content, list) else [content]
    for block in blocks:
        parts.append(_dump(_plain(block)))
        if isinstance(block, dict) and "cache_control" in block:
            marks.append(len(parts) - 1)
    return parts, marks


def _openai_answer(response: LLMResponse, usage: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": response.content}
    if response.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in response.tool_calls]
    usage["completion_tokens"] = max(1, len(response.content or "") // CHARS_PER_TOKEN)
    reason = "tool_calls" if response.tool_calls else "stop"
    return {
        "id": "chatcmpl-cache",
        "model": "cached",
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
        "usage": usage,
    }


def _anthropic_answer(response: LLMResponse, usage: dict[str, Any]) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if response.content:
        blocks.append({"type": "text", "text": response.content})
    for call in response.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": json.loads(call.arguments),
            }
        )
    usage["output_tokens"] = max(1, len(response.content or "") // CHARS_PER_TOKEN)
    return {
        "id": "msg_cache",
        "type": "message",
        "role": "assistant",
        "model": "cached",
        "content": blocks,
        "stop_reason": "tool_use" if response.tool_calls else "end_turn",
        "usage": usage,
    }


def _openai_history(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body["messages"])


def _anthropic_history(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Enough of an OpenAI-format history for a Script: one message per turn or result."""
    history: list[dict[str, Any]] = []
    for turn in body["messages"]:
        blocks = turn["content"]
        if turn["role"] == "assistant":
            history.append({"role": "assistant", "content": _texts(blocks)})
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                history.append({"role": "tool", "content": str(block.get("content", ""))})
        if text := _texts(blocks):
            history.append({"role": "user", "content": text})
    return history


def _texts(blocks: list[dict[str, Any]]) -> str:
    return "".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def _handler_for(fake: CachingProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            body = json.loads(raw)
            with fake._lock:
                fake.seen.append(body)
            anthropic = self.path.endswith("/messages")
            usage, cached = fake.anthropic(body) if anthropic else fake.openai(body)
            history = _anthropic_history(body) if anthropic else _openai_history(body)
            response = fake.script.respond(history, [])
            if fake.latency_s:
                time.sleep(fake.latency_s)
            answer = _anthropic_answer if anthropic else _openai_answer
            payload = answer(response, usage)
            fake.answered(cached, usage)
            send_json(self, 200, payload, {})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
