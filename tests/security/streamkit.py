"""Hostile peers for the bounded-stream attacks: a gzip bomb, a slow-header server, a big POST."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BOMB_BYTES = 512 * 1024 * 1024
"""What the bomb expands to."""
SMALL_PAGE = b"<p>harmless page</p>" * 50


def gzip_bomb() -> bytes:
    """`Content-Encoding: gzip, gzip` of `BOMB_BYTES` zeros: under 1 KB on the wire."""
    zeros = gzip.compress(bytes(BOMB_BYTES), 9)
    return gzip.compress(zeros, 9)


@contextmanager
def bomb_server() -> Iterator[str]:
    """Serves `/bomb` (the gzip bomb) and `/page` (a small gzip page); yields its base URL."""
    bomb, page = gzip_bomb(), gzip.compress(SMALL_PAGE)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, encoding = (bomb, "gzip, gzip") if self.path == "/bomb" else (page, "gzip")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class SlowServer:
    """A server that sends its response headers one byte every `interval_s`."""

    url: str
    interval_s: float
    accepted_at: float | None = None
    closed_at: float | None = None
    """When the client's FIN (or reset) arrived, on the server's clock."""
    done: threading.Event = field(default_factory=threading.Event)


@contextmanager
def slow_header_server(interval_s: float, max_s: float) -> Iterator[SlowServer]:
    """One connection: reads the request, then trickles headers until the client leaves."""
    listener = socket.create_server(("127.0.0.1", 0))
    slow = SlowServer(f"http://127.0.0.1:{listener.getsockname()[1]}/slow", interval_s)
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Pad: " + b"a" * 10_000

    def serve() -> None:
        conn, _ = listener.accept()
        slow.accepted_at = time.monotonic()
        conn.settimeout(interval_s)
        try:
            conn.recv(65536)  # the request
            for byte in headers:
                if time.monotonic() - slow.accepted_at > max_s:
                    return
                conn.sendall(bytes([byte]))
                try:
                    if conn.recv(1) == b"":  # FIN: the client closed its side
                        slow.closed_at = time.monotonic()
                        return
                except TimeoutError:
                    continue
        except OSError:  # reset: the client closed with our bytes unread
            slow.closed_at = time.monotonic()
        finally:
            conn.close()
            slow.done.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield slow
    finally:
        listener.close()
        thread.join(max_s + 5)


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


def reset_peak_rss(pid: int) -> None:
    """Start the peak over from the current RSS (Linux: `echo 5 > clear_refs`)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
