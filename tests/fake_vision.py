"""A local server speaking both wires (OpenAI `/v1/chat/completions`, Anthropic
`/v1/messages`) that records every request body and answers like a model that looks:

- a conversation with a tool result already in it: the answer `saw it`;
- else a task whose text says `read_image`: one call of `read_image(path="shot.png")`;
- else the answer `saw it`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from tests.fake_provider import send_json
from tests.loopback import LoopbackServer

ANSWER = "saw it"


class VisionProvider:
    """The server; `bodies(path)` are the JSON requests it received on that path."""

    def __init__(self, image: bytes = b"") -> None:
        self.image = image
        """What a GET of any path answers."""
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._http = LoopbackServer(_handler_for(self))

    @property
    def url(self) -> str:
        return self._http.url

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for seen, body in self.seen if seen == path]

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()

    def __enter__(self) -> VisionProvider:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._http.stop()

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.seen.append((path, body))
        if path.endswith("/chat/completions"):
            return _openai(body["messages"])
        return _anthropic(body["messages"])


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content
    return " ".join(str(p.get("text", "")) for p in content or [] if p.get("type") == "text")


def _openai(messages: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ANSWER}
    looked = any(m["role"] == "tool" for m in messages)
    task = next(_texts(m["content"]) for m in messages if m["role"] == "user")
    if not looked and "read_image" in task:
        arguments = json.dumps({"path": "shot.png"})
        function = {"name": "read_image", "arguments": arguments}
        call = {"id": "call_look", "type": "function", "function": function}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    usage = {"prompt_tokens": 10, "completion_tokens": 2}
    return {"id": "x", "model": "gpt-fake", "choices": [choice], "usage": usage}


def _anthropic(messages: list[dict[str, Any]]) -> dict[str, Any]:
    blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
    looked = any(b.get("type") == "tool_result" for b in blocks)
    task = _texts(messages[0]["content"])
    content: list[dict[str, Any]] = [{"type": "text", "text": ANSWER}]
    stop = "end_turn"
    if not looked and "read_image" in task:
        content = [{"type": "tool_use", "id": "toolu_look", "name": "read_image"}]
        content[0]["input"] = {"path": "shot.png"}
        stop = "tool_use"
    usage = {"input_tokens": 10, "output_tokens": 2}
    return {"model": "claude-fake", "content": content, "stop_reason": stop, "usage": usage}


def _handler_for(fake: VisionProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            send_json(self, 200, fake.answer(self.path, json.loads(raw)), {})

        def do_GET(self) -> None:  # an image URL: served (and counted) only if reached
            with fake._lock:
                fake.seen.append((f"GET {self.path}", {}))
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.send_header("content-length", str(len(fake.image)))
            self.end_headers()
            self.wfile.write(fake.image)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
