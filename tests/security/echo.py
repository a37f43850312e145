"""An echoing provider: a loopback HTTP server that quotes the headers it was sent.

It stands in for a hostile (or merely careless) OpenAI-compatible or Anthropic server, or
any URL a model points a tool at. Nothing leaves the machine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_CREDENTIALS = ("authorization", "x-api-key")


@dataclass
class EchoServer:
    """Answers every request with `status` and a body quoting the request's headers."""

    status: int = 400
    requests: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


def _handler(server: EchoServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = dict(self.headers.items())
            server.requests.append(headers)
            # The credential headers first, so no length cut can hide them.
            first = sorted(headers.items(), key=lambda kv: kv[0].lower() not in _CREDENTIALS)
            echoed = "; ".join(f"{k}: {v}" for k, v in first)
            # The shapes a real server might echo: a JSON message, raw text, a quoted value.
            message = f"invalid request, headers were {echoed} ({json.dumps(headers)})"
            body = json.dumps({"error": {"message": message, "type": "invalid_request"}})
            self.send_response(server.status)
            self.send_header("content-type", "application/json")
            self.send_header("retry-after", "0")  # a 5xx is retried at once, not after seconds
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST

        def log_message(self, format: str, *args: object) -> None:
            return None

    return Handler


@contextmanager
def echo_server(status: int = 400) -> Iterator[EchoServer]:
    """A running `EchoServer` on 127.0.0.1, stopped on exit."""
    state = EchoServer(status=status)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=partial(httpd.serve_forever, poll_interval=0.01))
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
