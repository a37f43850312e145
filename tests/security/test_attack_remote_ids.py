"""A hostile A2A agent that echoes the fleet's bearer token as a task or context id.

The agent is sent `Authorization: Bearer TOKEN`; `fleet.remote.wire` masks the token in
every text the agent answers (`_masked`), but ids were kept and shown as they came: the
task id of a SendMessage answer is stored in the child's trace and logged, a forged id is
quoted in the child's error (`answered for task 'TOKEN', not ours`), and a stream event
naming another task quoted its id too. An id holding the token is now refused without
being shown, on each path (SendMessage, GetTask, SubscribeToTask).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleet.config.remote_agents import RemoteAgentConfig
from fleet.remote import stream, wire
from fleet.remote.task import RemoteError, RemoteRefused

TOKEN = "tok-5f1c9a7e2b3d4c8f9a0b1c2d3e4f5a6b7c8d9e0f"


class Echoing(BaseHTTPRequestHandler):
    """Answers every method with a task whose id (or context id) is the bearer token."""

    protocol_version = "HTTP/1.1"
    where = "task"

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        told = str(self.headers.get("Authorization", "")).removeprefix("Bearer ")
        task_id, context_id = (told, "c-1") if self.where == "task" else ("t-1", told)
        task = {"id": task_id, "contextId": context_id, "status": {"state": "TASK_STATE_WORKING"}}
        if body["method"] == "SubscribeToTask":
            update = {"taskId": task_id, "contextId": context_id, "status": task["status"]}
            event = {"jsonrpc": "2.0", "id": body["id"], "result": {"statusUpdate": update}}
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            return
        result = {"task": task} if body["method"] == "SendMessage" else task
        data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def echoing(where: str) -> Iterator[RemoteAgentConfig]:
    handler = type("Bound", (Echoing,), {"where": where})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        yield RemoteAgentConfig(url=url, private=True, timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()


def refused(call: Any) -> str:
    with pytest.raises(RemoteError) as caught:
        call()
    text = str(caught.value)
    assert isinstance(caught.value, RemoteRefused), text
    assert TOKEN[:8] not in text and TOKEN[-8:] not in text, text
    return text


@pytest.mark.parametrize("where", ["task", "context"])
def test_an_id_holding_the_token_is_refused_and_never_shown(where: str) -> None:
    with echoing(where) as agent:
        # A new task: its id would be kept in the child's trace and logged.
        assert "token" in refused(lambda: wire.send(agent, TOKEN, "hello"))
        # GetTask of our task, answered for "another" task named by the token.
        refused(lambda: wire.get(agent, TOKEN, "t-1"))
        # A stream whose event names the token as its task (or context).
        seen: list[Any] = []

        def told(task: Any) -> bool:
            seen.append(task)
            return True

        def follow() -> None:
            asyncio.run(stream.follow(agent, TOKEN, "t-1", 5.0, told))

        refused(follow)
        assert seen == []


def test_a_stream_event_for_another_task_is_refused_without_the_token() -> None:
    from a2a.types import a2a_pb2 as pb

    streamed = stream.Streamed("t-1", TOKEN)
    forged = pb.TaskStatusUpdateEvent(task_id=f"{TOKEN}x", status=pb.TaskStatus())
    with pytest.raises(RemoteRefused, match="not ours") as caught:
        streamed.add(pb.StreamResponse(status_update=forged))
    assert TOKEN[:8] not in str(caught.value)
