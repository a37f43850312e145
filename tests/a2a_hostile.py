"""A hostile A2A agent speaking the JSON-RPC wire by hand (what a2a-sdk's server never does).

Modes: `echo` (GetTask completes with the Authorization header it got), `huge` (GetTask
streams 100 MB without end of its JSON, never built in memory), `hang` (GetTask never
answers), `forged` (GetTask answers for another task id), `flip` (GetTask says completed
once, then working again). SendMessage always answers a working task `t-1` in context
`c-1`. `calls` counts the methods it was asked, `message_ids` the messages' ids.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNK = b"x" * 65_536
HUGE_BYTES = 100 * 1024 * 1024


@dataclass
class Hostile:
    mode: str
    url: str = ""
    calls: Counter[str] = field(default_factory=Counter)
    message_ids: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _task(task_id: str, state: str, text: str = "") -> dict[str, Any]:
    task: dict[str, Any] = {"id": task_id, "contextId": "c-1", "status": {"state": state}}
    if text:
        task["artifacts"] = [{"artifactId": "a", "parts": [{"text": text}]}]
    return task


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hostile: Hostile

    def log_message(self, *_: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        method, rpc_id = body["method"], body["id"]
        self.hostile.calls[method] += 1
        if self.hostile.mode == "echo" and method == "GetTask":  # our token, in its answer
            told = f"you sent {self.headers.get('Authorization')}"
            return self._json(rpc_id, _task("t-1", "TASK_STATE_COMPLETED", told))
        if method == "SendMessage":
            self.hostile.message_ids.append(body["params"]["message"]["messageId"])
            return self._json(rpc_id, {"task": _task("t-1", "TASK_STATE_WORKING")})
        if method == "CancelTask":
            return self._json(rpc_id, _task("t-1", "TASK_STATE_CANCELED"))
        return self._get(rpc_id)

    def _get(self, rpc_id: str) -> None:
        match self.hostile.mode:
            case "huge":
                return self._huge()
            case "hang":
                self.hostile.stop.wait(120)
                return None
            case "forged":
                return self._json(rpc_id, _task("someone-else", "TASK_STATE_COMPLETED", "x"))
            case _:  # flip: completed once, working ever after
                first = self.hostile.calls["GetTask"] == 1
                state = "TASK_STATE_COMPLETED" if first else "TASK_STATE_WORKING"
                text = "first answer" if first else "second answer"
                return self._json(rpc_id, _task("t-1", state, text))

    def _json(self, rpc_id: str, result: dict[str, Any]) -> None:
        data = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _huge(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(HUGE_BYTES))
        self.end_headers()
        self.wfile.write(b'{"jsonrpc": "2.0", "id": "1", "result": {"id": "t-1", "x": "')
        sent = 0
        with contextlib.suppress(OSError):  # the client hangs up at its cap
            while sent < HUGE_BYTES and not self.hostile.stop.is_set():
                self.wfile.write(CHUNK)
                sent += len(CHUNK)


@contextlib.contextmanager
def serve_hostile(mode: str) -> Iterator[Hostile]:
    """The hostile agent on a free loopback port, in a thread."""
    hostile = Hostile(mode)
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Bound", (Handler,), {"hostile": hostile}))
    server.daemon_threads = True
    hostile.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hostile
    finally:
        hostile.stop.set()
        server.shutdown()
        server.server_close()
        time.sleep(0)
