"""An HTTP server on a free loopback port, answering from a daemon thread: the fakes' base."""

from __future__ import annotations

import ssl
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    """Serves `handler` on 127.0.0.1 (a free port) until `stop`."""

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None
    ) -> None:
        """Serve `handler`; over TLS with `tls` (a server context), else plain HTTP."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        serve = partial(self._server.serve_forever, poll_interval=0.01)
        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Stop answering, close the socket, wait for the serving thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
