"""A local OpenAI-wire `/chat/completions` server that enforces its own rate limit.

It answers like a model (a `fleet.testing.Script` decides, from the conversation) and, like
a real provider, refuses with 429 and `retry-after-ms` whatever goes beyond its limits: a
token bucket of requests per second and one of tokens per second (prompt + completion,
counted at arrival). It counts what it answered and what it refused.

`window="rolling"` enforces the strict kind instead: at most N requests (tokens) in ANY
rolling second of arrival times, no burst beyond it, and a 429 whose `retry-after` (seconds,
as a decimal) says when the oldest request leaves the window. A limit booked at exactly N/s
meets it only if arrival jitter never puts N + 1 in one second.

    with RateLimitedProvider(script, requests_per_s=20) as server:
        ... point a provider's base_url at server.url + "/v1" ...
        server.stats.refused
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, Literal, Protocol

from fleet.limits.pacing import most_in_window
from fleet.llm.base import LLMResponse
from fleet.testing import Script
from tests.loopback import LoopbackServer

CHARS_PER_TOKEN = 4
"""How this server counts prompt tokens (the client's estimate must not be lower)."""


def send_json(
    handler: BaseHTTPRequestHandler, status: int, body: Any, headers: dict[str, str]
) -> None:
    """Answer one request with `body` as JSON, as a provider's API does."""
    payload = json.dumps(body).encode()
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class Bucket:
    """A token bucket: `rate_per_s` refill, at most `capacity` stored; thread-safe."""

    def __init__(self, rate_per_s: float, capacity: float) -> None:
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self._level = capacity
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self, amount: float) -> float:
        """Take `amount` if there; else 0.0 and how long until there would be (seconds)."""
        with self._lock:
            now = time.monotonic()
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate_per_s)
            self._at = now
            if self._level >= amount:
                self._level -= amount
                return 0.0
            return (amount - self._level) / self.rate_per_s


class RollingWindow:
    """At most `limit` units in any `window_s` of arrival times (a sliding log); thread-safe."""

    def __init__(
        self, limit: float, window_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._log: deque[tuple[float, float]] = deque()
        """(arrival, amount) of every unit taken within the last `window_s`."""
        self._held = 0.0
        self._lock = threading.Lock()

    def take(self, amount: float) -> float:
        """Take `amount` if the window has room; else 0.0 and the wait until it would have."""
        with self._lock:
            now = self.clock()
            while self._log and self._log[0][0] <= now - self.window_s:
                self._held -= self._log.popleft()[1]
            if self._held + amount <= self.limit:
                self._log.append((now, amount))
                self._held += amount
                return 0.0
            need, wait_s = self._held + amount - self.limit, 0.0
            for at, units in self._log:  # the oldest leave first
                need, wait_s = need - units, at + self.window_s - now
                if need <= 0:
                    break
            return max(wait_s, 0.001)


class Limit(Protocol):
    """A bucket or a window: `take` answers 0.0 (taken) or the wait in seconds."""

    def take(self, amount: float) -> float: ...


@dataclass
class Stats:
    answered: int = 0
    refused: int = 0
    tokens: int = 0
    first_at: float | None = None
    last_at: float | None = None
    arrivals: list[tuple[float, bool]] = field(default_factory=list, repr=False)
    """(monotonic arrival, answered) of every request: the request log."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        """Forget what was counted (between runs on the same server)."""
        with self.lock:
            self.answered = self.refused = self.tokens = 0
            self.first_at = self.last_at = None
            self.arrivals = []

    def max_in_window(self, window_s: float = 1.0) -> int:
        """The most answered requests any rolling `window_s` held."""
        return most_in_window([at for at, ok in self.arrivals if ok], window_s)

    def longest_gap_s(self) -> float:
        """The longest time between two requests (answered or not): the fleet's idlest spell."""
        times = [at for at, _ in self.arrivals]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    @property
    def refused_share(self) -> float:
        total = self.answered + self.refused
        return self.refused / total if total else 0.0


class RateLimitedProvider:
    """The server; see the module docstring."""

    def __init__(
        self,
        script: Script,
        *,
        requests_per_s: float | None = None,
        tokens_per_s: float | None = None,
        burst_s: float = 1.0,
        window: Literal["bucket", "rolling"] = "bucket",
        completion_tokens: int | None = None,
        latency_s: float = 0.0,
    ) -> None:
        """Limits are per second; each bucket holds `burst_s` seconds of its rate.

        `window="rolling"`: no bucket but a rolling one-second window holding exactly the
        rate, refused with `retry-after` in seconds. `completion_tokens`: what every answer
        reports (default: its length / 4).
        """
        self.script = script
        self.window = window
        self.requests = self._limit(requests_per_s, burst_s)
        self.tokens = self._limit(tokens_per_s, burst_s)
        self.completion_tokens = completion_tokens
        self.latency_s = latency_s
        self.stats = Stats()
        self._refusal: tuple[int, float] | None = None
        """(answers before it, retry-after s) of a 429 a test asked for."""
        self._server = LoopbackServer(_handler_for(self))

    def _limit(self, rate: float | None, burst_s: float) -> Limit | None:
        if rate is None:
            return None
        if self.window == "rolling":
            return RollingWindow(rate, 1.0)
        return Bucket(rate, max(1.0, rate * burst_s))

    @property
    def url(self) -> str:
        return self._server.url

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> RateLimitedProvider:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, body and headers for one request.

        Requests are counted as they arrive, before the model answers (a provider limits
        at its edge); tokens once the answer's size is known.
        """
        arrived = time.monotonic()
        wait_s = self._injected() or (self.requests.take(1) if self.requests else 0.0)
        response = self.script.respond(request["messages"], request.get("tools") or [])
        # Like real providers, the tool definitions count as prompt tokens too.
        prompt = len(json.dumps(request["messages"]) + json.dumps(request.get("tools") or []))
        prompt //= CHARS_PER_TOKEN
        completion = self.completion_tokens or response.usage.completion_tokens
        if not wait_s and self.tokens:
            wait_s = self.tokens.take(prompt + completion)
        self._count(arrived, wait_s, prompt + completion)
        if wait_s:
            error = {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}
            return 429, error, self._retry_after(wait_s)
        time.sleep(self.latency_s)
        return 200, _completion(response, prompt, completion), {}

    def _count(self, arrived: float, wait_s: float, tokens: int) -> None:
        with self.stats.lock:
            self.stats.first_at = self.stats.first_at or arrived
            self.stats.last_at = arrived
            self.stats.arrivals.append((arrived, not wait_s))
            if wait_s:
                self.stats.refused += 1
            else:
                self.stats.answered += 1
                self.stats.tokens += tokens

    def refuse_once(self, after_answered: int, retry_after_s: float) -> None:
        """Answer 429 with `retry_after_s` to the first request after `after_answered` answers."""
        with self.stats.lock:
            self._refusal = (after_answered, retry_after_s)

    def _injected(self) -> float:
        with self.stats.lock:
            if self._refusal is None or self.stats.answered < self._refusal[0]:
                return 0.0
            wait_s, self._refusal = self._refusal[1], None
            return wait_s

    def _retry_after(self, wait_s: float) -> dict[str, str]:
        if self.window == "rolling":  # seconds, as most providers say it (3 decimals here)
            return {"retry-after": f"{wait_s:.3f}"}
        return {"retry-after-ms": str(max(1, int(wait_s * 1000)))}


def _completion(response: LLMResponse, prompt: int, completion: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": response.content}
    if response.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in response.tool_calls]
    return {
        "id": "chatcmpl-fake",
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


def _handler_for(fake: RateLimitedProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as clients of real providers use

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            try:
                status, body, headers = fake.answer(json.loads(raw))
            except Exception as exc:  # a script that cannot answer: a 400 the client reports
                status, body, headers = 400, {"error": {"message": str(exc)}}, {}
            send_json(self, status, body, headers)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
