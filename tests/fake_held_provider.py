"""A local provider that holds each request for a while and sees a client leave.

It speaks the OpenAI wire (`POST /v1/chat/completions`) and the Anthropic one
(`POST /v1/messages`); `decide(messages)` answers from the conversation (OpenAI-format
messages either way) and `latency(messages)` says how long the answer takes. While it holds
a request it watches the connection: a client that shuts it down ends the request as
`cancelled` at once (a real provider stops generating, and billing, there), and no answer
is sent. `requests` logs every one (`Held`).

    with HeldProvider(decide, latency=lambda m: 20.0) as provider:
        ... base_url = provider.url + "/v1" ...
        provider.cancelled()
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, Literal

from fleet.llm.base import LLMResponse
from tests.fake_batch import _anthropic_answer, _openai_answer, _text
from tests.fake_provider import send_json
from tests.loopback import LoopbackServer

Wire = Literal["openai", "anthropic"]
WATCH_S = 0.01
"""How often a held request looks at its connection."""


@dataclass
class Held:
    """One request the provider took."""

    wire: Wire
    task: str
    """The first user message's text: which trace asked."""
    peer: tuple[str, int]
    """The client's address and port: the same port, the same (kept-alive) connection."""
    arrived_at: float
    """`time.monotonic()` when the request was read."""
    ended_at: float | None = None
    """When it was answered or the client left; None while held."""
    cancelled: bool = False
    """The client left before the answer."""


def _messages(wire: Wire, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation in OpenAI form (tool results as `tool` messages)."""
    if wire == "openai":
        return list(body.get("messages") or [])
    messages: list[dict[str, Any]] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            messages += [{"role": "tool", "content": str(r.get("content"))} for r in results]
        else:
            messages.append({"role": message.get("role"), "content": _text(content)})
    return messages


def task_of(messages: list[dict[str, Any]]) -> str:
    """The first user message's text."""
    return next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")


class HeldProvider:
    """The server; see the module docstring."""

    def __init__(
        self,
        decide: Callable[[list[dict[str, Any]]], LLMResponse],
        latency: Callable[[list[dict[str, Any]]], float],
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """Answer with `decide` after `latency` seconds (both of the conversation).

        `tls`: serve HTTPS with this server context (`url` still says `http://`).
        """
        self.decide, self.latency = decide, latency
        self.requests: list[Held] = []
        self.lock = threading.Lock()
        self._server = LoopbackServer(_handler_for(self), tls)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return self._server.url

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()

    def __enter__(self) -> HeldProvider:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def in_flight(self, task: str | None = None) -> list[Held]:
        """The requests held now (of `task`, if given)."""
        with self.lock:
            return [h for h in self.requests if h.ended_at is None and task in (None, h.task)]

    def cancelled(self) -> list[Held]:
        """The requests whose client left before the answer."""
        with self.lock:
            return [h for h in self.requests if h.cancelled]

    def answered(self) -> list[Held]:
        """The requests answered in full."""
        with self.lock:
            return [h for h in self.requests if h.ended_at is not None and not h.cancelled]

    def take(self, wire: Wire, body: dict[str, Any], sock: socket.socket) -> bytes | None:
        """Hold the request; its answer, or None when the client left meanwhile."""
        messages = _messages(wire, body)
        held = Held(wire, task_of(messages), sock.getpeername()[:2], time.monotonic())
        with self.lock:
            self.requests.append(held)
        gone = _client_left_within(sock, self.latency(messages))
        with self.lock:
            held.ended_at, held.cancelled = time.monotonic(), gone
        if gone:
            return None
        response = self.decide(messages)
        answer = _openai_answer(response) if wire == "openai" else _anthropic_answer(response)
        return json.dumps(answer).encode()


def _client_left_within(sock: socket.socket, seconds: float) -> bool:
    """Wait `seconds` unless the client shuts the connection first (True then)."""
    deadline = time.monotonic() + seconds
    while (left_s := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], min(WATCH_S, left_s))
        if not readable:
            continue
        try:
            # The plain socket's recv: a TLS socket refuses flags, and peeks at raw bytes.
            if socket.socket.recv(sock, 1, socket.MSG_PEEK) == b"":
                return True
        except OSError:
            return True
        time.sleep(WATCH_S)  # bytes of a next request: not a departure
    return False


def _handler_for(fake: HeldProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as clients of real providers use

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            wire: Wire = "anthropic" if self.path.endswith("/messages") else "openai"
            payload = fake.take(wire, json.loads(raw), self.connection)
            if payload is None:
                self.close_connection = True
                return
            send_json(self, 200, json.loads(payload), {})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
