"""Local servers speaking OpenAI's Batch API and Anthropic's Message Batches wire.

Answers come from a `fleet.testing.Script` (a pure function of the conversation) once a
batch is `delay_s` old, as a real provider answers hours later. Each server records every
custom id it was sent (`sent`: a list, so a custom id sent twice shows twice) and counts
live calls (`/v1/chat/completions`, `/v1/messages`), which a batch tree must never make.

    with OpenAIBatchServer(script, delay_s=0.5) as server:
        ... a provider with base_url=server.url + "/v1", batch_api: true ...
        server.sent, server.live_calls

Faults a test asks for: `error_next(n)` answers the next n requests with an error line;
`expire_next()` lets the next batch expire unanswered; `tamper_next(fn)` serves the next
batch's output as `fn(lines)` (the answer lines it would send, as dicts -> the bytes to
send instead, streamed chunked: hostile lines, a file of any size).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from fleet.llm.base import LLMResponse
from fleet.testing import Script
from tests.fake_provider import send_json
from tests.loopback import LoopbackServer

Tamper = Callable[[list[dict[str, Any]]], Iterable[bytes]]
"""The answer lines of a batch (dicts) -> the bytes served instead (`tamper_next`)."""

USAGE = (100, 20)
"""Prompt and completion tokens every answer reports (cost checks compare against it)."""


class BatchServer:
    """What both fakes share: the HTTP server, batches, faults and the counts."""

    def __init__(self, script: Script, *, delay_s: float = 0.3) -> None:
        self.script = script
        self.delay_s = delay_s
        self.sent: list[str] = []
        self.live_calls = 0
        self.cancelled: list[str] = []
        self.batches: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self._errors = 0
        self._expire = False
        self._tamper: Tamper | None = None
        self._http = LoopbackServer(_handler_for(self))

    @property
    def url(self) -> str:
        return self._http.url

    def stop(self) -> None:
        self._http.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def error_next(self, count: int) -> None:
        """Answer the next `count` requests of new batches with an error line."""
        with self.lock:
            self._errors = count

    def expire_next(self) -> None:
        """The next batch created expires without an answer."""
        with self.lock:
            self._expire = True

    def tamper_next(self, tamper: Tamper) -> None:
        """Serve the next batch's output lines as `tamper(lines)` (streamed, chunked)."""
        with self.lock:
            self._tamper = tamper

    def new_batch(
        self, requests: list[tuple[str, dict[str, Any]]], metadata: Any
    ) -> dict[str, Any]:
        """Record a batch of (custom id, request body); its answers are due after the delay."""
        with self.lock:
            errors, self._errors = (
                min(self._errors, len(requests)),
                max(self._errors - len(requests), 0),
            )
            expire, self._expire = self._expire, False
            tamper, self._tamper = self._tamper, None
            self.sent += [custom_id for custom_id, _ in requests]
            batch = {
                "id": f"batch_{uuid.uuid4().hex[:16]}",
                "requests": requests,
                "errors": {custom_id for custom_id, _ in requests[:errors]},
                "expire": expire,
                "due": time.monotonic() + self.delay_s,
                "created": datetime.now(UTC).isoformat(),
                "metadata": metadata,
                "cancelled": False,
                "tamper": tamper,
            }
            self.batches[batch["id"]] = batch
            return batch

    def ended(self, batch: dict[str, Any]) -> bool:
        return bool(batch["cancelled"]) or time.monotonic() >= batch["due"]

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is not None:
                batch["cancelled"] = True
                self.cancelled.append(batch_id)
            return batch

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        return self.script.respond(messages, tools)

    def get(self, path: str) -> tuple[int, Any]:
        raise NotImplementedError

    def post(self, path: str, headers: Any, raw: bytes) -> tuple[int, Any]:
        raise NotImplementedError


class OpenAIBatchServer(BatchServer):
    """`/v1/files`, `/v1/batches`, `/v1/files/{id}/content`, and a counted live endpoint."""

    def __init__(self, script: Script, *, delay_s: float = 0.3) -> None:
        super().__init__(script, delay_s=delay_s)
        self.files: dict[str, str | Callable[[], Iterable[bytes]]] = {}

    def post(self, path: str, headers: Any, raw: bytes) -> tuple[int, Any]:
        if path == "/v1/chat/completions":
            with self.lock:
                self.live_calls += 1
            body = json.loads(raw)
            return 200, _openai_answer(self.respond(body["messages"], body.get("tools") or []))
        if path == "/v1/files":
            text = _multipart_file(headers.get("content-type", ""), raw)
            file_id = f"file-{uuid.uuid4().hex[:16]}"
            with self.lock:
                self.files[file_id] = text
            return 200, {"id": file_id, "object": "file", "purpose": "batch"}
        if path == "/v1/batches":
            body = json.loads(raw)
            uploaded = self.files[body["input_file_id"]]
            assert isinstance(uploaded, str)  # an input file is text; only outputs stream
            lines = [json.loads(line) for line in uploaded.splitlines()]
            assert all(line["url"] == body["endpoint"] == "/v1/chat/completions" for line in lines)
            batch = self.new_batch(
                [(line["custom_id"], line["body"]) for line in lines], body.get("metadata")
            )
            return 200, self._view(batch)
        if (match := re.fullmatch(r"/v1/batches/([^/]+)/cancel", path)) is not None:
            cancelled = self.cancel(match[1])
            if cancelled is None:
                return 404, {"error": "no batch"}
            return 200, self._view(cancelled)
        return 404, {"error": {"message": f"no route {path}"}}

    def get(self, path: str) -> tuple[int, Any]:
        if path == "/v1/batches":
            with self.lock:
                batches = list(self.batches.values())
            return 200, {"data": [self._view(b) for b in batches]}
        if (match := re.fullmatch(r"/v1/batches/([^/]+)", path)) is not None:
            batch = self.batches.get(match[1])
            return (404, {"error": "no batch"}) if batch is None else (200, self._view(batch))
        if (match := re.fullmatch(r"/v1/files/([^/]+)/content", path)) is not None:
            return 200, self.files.get(match[1], "")
        return 404, {"error": {"message": f"no route {path}"}}

    def _view(self, batch: dict[str, Any]) -> dict[str, Any]:
        view = {"id": batch["id"], "object": "batch", "metadata": batch["metadata"]}
        if not self.ended(batch):
            return view | {"status": "in_progress"}
        if batch["cancelled"] or batch["expire"]:
            return view | {"status": "cancelled" if batch["cancelled"] else "expired"}
        with self.lock:
            if "output_file_id" not in batch:
                self._answer(batch)
        return view | {
            "status": "completed",
            "output_file_id": batch["output_file_id"],
            "error_file_id": batch["error_file_id"],
        }

    def _answer(self, batch: dict[str, Any]) -> None:
        out, errors = [], []
        for custom_id, body in batch["requests"]:
            if custom_id in batch["errors"]:
                error = {"code": "server_error", "message": "the model is overloaded"}
                errors.append({"custom_id": custom_id, "response": None, "error": error})
                continue
            answer = _openai_answer(self.respond(body["messages"], body.get("tools") or []))
            response = {"status_code": 200, "body": answer}
            out.append({"custom_id": custom_id, "response": response, "error": None})
        batch["output_file_id"] = out_id = f"file-{uuid.uuid4().hex[:16]}"
        batch["error_file_id"] = err_id = f"file-{uuid.uuid4().hex[:16]}"
        tamper = batch["tamper"]
        self.files[out_id] = (
            "".join(json.dumps(line) + "\n" for line in out)
            if tamper is None
            else lambda: tamper(out)
        )
        self.files[err_id] = "".join(json.dumps(line) + "\n" for line in errors)


class AnthropicBatchServer(BatchServer):
    """`/v1/messages/batches` (create, get, results, cancel, list) and a counted `/v1/messages`."""

    def post(self, path: str, headers: Any, raw: bytes) -> tuple[int, Any]:
        if path == "/v1/messages":
            with self.lock:
                self.live_calls += 1
            return 200, _anthropic_answer(self._respond(json.loads(raw)))
        if path == "/v1/messages/batches":
            requests = json.loads(raw)["requests"]
            batch = self.new_batch([(r["custom_id"], r["params"]) for r in requests], None)
            return 200, self._view(batch)
        if (match := re.fullmatch(r"/v1/messages/batches/([^/]+)/cancel", path)) is not None:
            cancelled = self.cancel(match[1])
            if cancelled is None:
                return 404, {"error": "no batch"}
            return 200, self._view(cancelled)
        return 404, {"error": {"message": f"no route {path}"}}

    def get(self, path: str) -> tuple[int, Any]:
        if path == "/v1/messages/batches":
            with self.lock:
                batches = list(self.batches.values())
            return 200, {"data": [self._view(b) for b in batches]}
        if (match := re.fullmatch(r"/v1/messages/batches/([^/]+)", path)) is not None:
            batch = self.batches.get(match[1])
            return (404, {"error": "no batch"}) if batch is None else (200, self._view(batch))
        if (match := re.fullmatch(r"/v1/messages/batches/([^/]+)/results", path)) is not None:
            lines = self._results(match[1])
            tamper = self.batches[match[1]]["tamper"]
            if tamper is not None:
                return 200, lambda: tamper(lines)
            return 200, "".join(json.dumps(line) + "\n" for line in lines)
        return 404, {"error": {"message": f"no route {path}"}}

    def _view(self, batch: dict[str, Any]) -> dict[str, Any]:
        total = len(batch["requests"])
        ended = self.ended(batch)
        lost = total if ended and (batch["cancelled"] or batch["expire"]) else 0
        kind = "canceled" if batch["cancelled"] else "expired"
        counts = {"processing": 0 if ended else total, "succeeded": 0, "errored": 0}
        counts |= {"canceled": 0, "expired": 0}
        if ended:
            counts[kind] = lost
            counts["errored"] = 0 if lost else len(batch["errors"])
            counts["succeeded"] = total - counts["errored"] - lost
        return {
            "id": batch["id"],
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": counts,
            "created_at": batch["created"],
        }

    def _results(self, batch_id: str) -> list[dict[str, Any]]:
        batch = self.batches[batch_id]
        lines = []
        for custom_id, params in batch["requests"]:
            if batch["cancelled"] or batch["expire"]:
                kind = "canceled" if batch["cancelled"] else "expired"
                lines.append({"custom_id": custom_id, "result": {"type": kind}})
            elif custom_id in batch["errors"]:
                error = {"type": "overloaded_error", "message": "overloaded"}
                lines.append(
                    {"custom_id": custom_id, "result": {"type": "errored", "error": error}}
                )
            else:
                message = _anthropic_answer(self._respond(params))
                lines.append(
                    {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}
                )
        return lines

    def _respond(self, params: dict[str, Any]) -> LLMResponse:
        messages: list[dict[str, Any]] = []
        for message in params.get("messages") or []:
            content = message["content"]
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            messages += [
                {"role": "tool", "content": _text([{"text": r["content"]}])} for r in results
            ]
            if not results:
                messages.append({"role": message["role"], "content": _text(content)})
        return self.respond(messages, params.get("tools") or [])


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def _openai_answer(response: LLMResponse) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": response.content}
    if response.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in response.tool_calls]
    return {
        "id": "chatcmpl-batch",
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": USAGE[0], "completion_tokens": USAGE[1]},
    }


def _anthropic_answer(response: LLMResponse) -> dict[str, Any]:
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
    return {
        "id": "msg_batch",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": blocks,
        "stop_reason": "tool_use" if response.tool_calls else "end_turn",
        "usage": {"input_tokens": USAGE[0], "output_tokens": USAGE[1]},
    }


def _multipart_file(content_type: str, raw: bytes) -> str:
    """The `file` part of a multipart/form-data body, as text."""
    boundary = content_type.split("boundary=", 1)[1].strip('"').encode()
    for part in raw.split(b"--" + boundary):
        head, _, body = part.partition(b"\r\n\r\n")
        if b'name="file"' in head:
            return body.rsplit(b"\r\n", 1)[0].decode()
    raise ValueError("no file part")


def _stream(handler: BaseHTTPRequestHandler, status: int, chunks: Iterable[bytes]) -> None:
    """Send `chunks` as they come (chunked): a file of any size, never held whole."""
    handler.send_response(status)
    handler.send_header("content-type", "application/jsonl")
    handler.send_header("transfer-encoding", "chunked")
    handler.end_headers()
    for chunk in chunks:
        if chunk:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    handler.wfile.write(b"0\r\n\r\n")


def _handler_for(fake: BatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, answer: Callable[[], tuple[int, Any]]) -> None:
            try:
                status, body = answer()
            except Exception as exc:  # a request the fake cannot read: a 400, as a provider
                status, body = 400, {"error": {"message": str(exc)}}
            if callable(body):
                _stream(self, status, body())
                return
            if isinstance(body, str):
                payload = body.encode()
                self.send_response(status)
                self.send_header("content-type", "application/jsonl")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            send_json(self, status, body, {})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            self._reply(lambda: fake.post(urlsplit(self.path).path, self.headers, raw))

        def do_GET(self) -> None:
            self._reply(lambda: fake.get(urlsplit(self.path).path))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
