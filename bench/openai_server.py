"""A local OpenAI-wire `/chat/completions` server with a set latency, for benchmarks only.

python -m bench.openai_server [--port 0]     (prints `listening on PORT`, serves until killed)

It answers like the scripted explore model, as a function of the conversation, so any
process may ask it anything in any order:

- a root whose task reads `survey the workspace in N branches`: first an `agent` call with
  N tasks `Branch i of the survey`, and once it has a tool result, a summary;
- a root whose task is anything else: a one-line answer at once (a one-completion run);
- a branch (task `Branch ...`): first a `list_dir` call, and once it has a tool result,
  `done: <task>`.

The latency is the model name: `lat200` waits 200 ms before answering. One asyncio loop
serves every connection (HTTP/1.1 keep-alive), so hundreds of calls wait together.

While it holds a request it watches the connection: a client that closes it (a stop that
cuts the call, `fleet.llm.cancel`) ends the request at once, unanswered, as a provider stops
generating there.

`GET /v1/arrivals` returns (`?clear`: and forgets) when (`time.time()`) each task's first request
arrived (`first`), how many requests came in all (`count`), and when the first answer with
an `agent` call left (`spawned`): bench/branch_cost_bench.py's clocks. And `requests`: every
request as `[task, arrived, ended, cancelled]` (`ended` null while held; `cancelled`: the
client left first): bench/stop_bench.py's record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from itertools import count
from typing import Any

_ROOT = re.compile(r"survey the workspace in (\d+) branches")
_LATENCY = re.compile(r"lat(\d+)")
_ids = count(1)
_seen: dict[str, Any] = {"first": {}, "count": 0, "spawned": {}, "requests": []}


def _arrived(body: dict[str, Any]) -> tuple[str, list[Any]]:
    """Note the request's arrival under its task; the task and its `requests` entry."""
    messages = body.get("messages") or []
    task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
    now = time.time()
    _seen["first"].setdefault(task, now)
    _seen["count"] += 1
    entry: list[Any] = [task, now, None, False]
    _seen["requests"].append(entry)
    return task, entry


def _arrivals(clear: bool) -> bytes:
    global _seen
    payload = json.dumps(_seen).encode()
    if clear:
        _seen = {"first": {}, "count": 0, "spawned": {}, "requests": []}
    return payload


async def _client_left_within(reader: asyncio.StreamReader, wait_s: float) -> bool:
    """Hold for `wait_s` unless the client closes the connection first (True then).

    A client sends nothing more while it waits for an answer (no pipelining): the next
    thing read is the end of the stream.
    """
    if wait_s <= 0:
        return False
    eof = asyncio.ensure_future(reader.read(1))
    done, _ = await asyncio.wait({eof}, timeout=wait_s)
    if not done:
        eof.cancel()
        await asyncio.gather(eof, return_exceptions=True)  # its read is over before the next
        return False
    try:
        return not eof.result()
    except ConnectionError:  # reset rather than closed: gone all the same
        return True


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for this request (see the module docstring)."""
    messages = body.get("messages") or []
    task = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
    has_result = any(m.get("role") == "tool" for m in messages)
    if task.startswith("Branch"):
        if has_result:
            return {"role": "assistant", "content": f"done: {task}"}
        return _call("list_dir", {"path": "."})
    found = _ROOT.search(task)
    if found is None or has_result:
        return {"role": "assistant", "content": f"summary: {len(messages)} messages"}
    tasks = [f"Branch {i} of the survey" for i in range(1, int(found.group(1)) + 1)]
    return _call("agent", {"task": tasks})


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def completion(body: dict[str, Any]) -> bytes:
    """The whole `/chat/completions` response body."""
    message = answer(body)
    return json.dumps(
        {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    ).encode()


def latency_s(body: dict[str, Any]) -> float:
    """`lat200` -> 0.2; any other model name answers at once."""
    found = _LATENCY.fullmatch(str(body.get("model", "")))
    return int(found.group(1)) / 1000 if found else 0.0


async def _respond(writer: asyncio.StreamWriter, status: str, payload: bytes) -> None:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(payload)}\r\n\r\n"
    writer.write(head.encode() + payload)
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
            length = int({k.lower(): v for k, v in fields.items()}.get("content-length", "0"))
            raw = await reader.readexactly(length)
            if lines[0].startswith("GET ") and "/arrivals" in lines[0]:
                await _respond(writer, "200 OK", _arrivals("clear" in lines[0]))
                continue
            if not lines[0].startswith("POST ") or "/chat/completions" not in lines[0]:
                await _respond(writer, "404 Not Found", b'{"error": {"message": "not found"}}')
                continue
            body = json.loads(raw)
            task, entry = _arrived(body)
            left = await _client_left_within(reader, latency_s(body))
            entry[2:] = [time.time(), left]
            if left:
                return
            payload = completion(body)
            await _respond(writer, "200 OK", payload)
            if b'"agent"' in payload:
                _seen["spawned"].setdefault(task, time.time())
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    """Serve on 127.0.0.1:`port` (0: a free one), printing the port once listening."""
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="local OpenAI-wire server for benchmarks")
    parser.add_argument("--port", type=int, default=0)
    try:
        asyncio.run(main(parser.parse_args().port))
    except KeyboardInterrupt:
        sys.exit(0)
