"""The tornado application of `fleet serve`: the JSON API, the SSE event stream, the page.

Store calls block (redis-py), so every one runs in a thread pool, never on the event loop;
event streams get their own pool so that open pages cannot starve API requests.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
import tornado.httpserver
import tornado.web
from tornado.iostream import StreamClosedError

from fleet.errors import BrokerUnavailable, ConversationError, InvalidTraceId, TraceNotFound
from fleet.storage.store import TraceStore
from fleetops.serve import listing, queries
from fleetops.serve.guard import (
    MAX_BODY_BYTES,
    ApiError,
    check_body_size,
    check_csrf,
    check_request,
    csrf_token,
)
from fleetops.serve.listing import BadRequest
from fleetops.serve.page_actions import ACTIONS, Actions, parse_body

__all__ = [
    "MAX_BODY_BYTES",
    "SERVER_LIMITS",
    "ApiError",
    "ServeConfig",
    "make_app",
    "serve_forever",
]

log = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).with_name("static")
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
T = TypeVar("T")
STATIC_FILES = r"(?:app|tree|timeline|conversation|front|actions|plan|util|md)\.js|app\.css"
SERVER_LIMITS: dict[str, Any] = {
    "max_body_size": MAX_BODY_BYTES,
    "max_buffer_size": 4 * MAX_BODY_BYTES,
    "max_header_size": 16 * 1024,
    "body_timeout": 10.0,
    "idle_connection_timeout": 60.0,
}
"""Keyword arguments of `tornado.httpserver.HTTPServer`: the second line behind the checks
every handler makes in `prepare` (tornado's defaults buffer up to 100 MB per request)."""


@dataclass(frozen=True)
class ServeConfig:
    """What the service needs: the store, how to stop a tree, and who may ask."""

    store: TraceStore
    actions: Actions
    """Stop, reply, approve, deny, continue: the fleet client (`fleet.client.Fleet`)."""
    token: str | None = None
    """When set, every API request must carry `Authorization: Bearer <token>` (and a POST
    needs no CSRF token: scripts send the bearer token alone)."""
    csrf: str = field(default="")
    """The token every POST of a token-less service carries in `X-Fleet-CSRF` (the page
    sends it always; derived from `token` when empty)."""
    max_streams: int = 32
    """Open event streams at once; one more gets 503."""
    stream_block_ms: int = 2000
    """How long one read of the event stream waits before a keep-alive comment; also how
    long a stop may wait on a stream's blocked read."""
    routes: tuple[Callable[[dict[str, Any]], list[Any]], ...] = ()
    """More endpoints: each gets the handlers' keyword arguments and returns its rules
    (`fleetops.serve.api_experiences`, `api_approvals`: they need the fleet client)."""

    def __post_init__(self) -> None:
        if not self.csrf:
            object.__setattr__(self, "csrf", csrf_token(self.token))


@tornado.web.stream_request_body
class _Base(tornado.web.RequestHandler):
    """Auth, JSON errors and store calls off the event loop.

    Streamed request bodies: tornado then calls `prepare` once the headers are in and
    before it reads a byte of the body, so a request without its token, or announcing more
    than `MAX_BODY_BYTES`, is answered (and its connection closed) with the body unread.
    """

    config: ServeConfig
    pool: ThreadPoolExecutor
    refused_unread = False
    """Refused in `prepare`, before the body (if any) was read."""
    body_bytes: bytearray

    def initialize(self, config: ServeConfig, pool: ThreadPoolExecutor) -> None:
        self.config = config
        self.pool = pool
        self.body_bytes = bytearray()

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "no-referrer")

    def prepare(self) -> None:
        """Refuse before any work: bad token, foreign Host, cross-site POST, no CSRF, big body."""
        try:
            check_request(self.request, self.config.token)
            check_body_size(self.request)
            # With a bearer token every API request carried it (check_request): a browser
            # never adds one on its own, so no other site can forge the POST. The page's
            # calls on a token-less (loopback) service carry the CSRF token instead.
            if self.request.method == "POST" and self.config.token is None:
                check_csrf(self.request, self.config.csrf)
        except ApiError:
            self.refused_unread = True
            raise

    def data_received(self, chunk: bytes) -> None:
        """Keep the (capped: `check_body_size`) body; only actions read one."""
        self.body_bytes.extend(chunk)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        message = error.message if isinstance(error, ApiError) else self._reason
        if self.refused_unread:  # tornado closes a connection whose body it did not read;
            self.set_header("Connection", "close")  # say so, or a client reuses it
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="fleet"')
        self.set_header("Content-Type", "application/json")
        field = error.field if isinstance(error, ApiError) else None
        self.finish(json.dumps({"error": message} | ({"field": field} if field else {})))

    async def call(
        self, fn: Callable[..., T], *args: Any, pool: ThreadPoolExecutor | None = None
    ) -> T:
        """Run a blocking store call in a thread; map expected errors to 400/404."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(pool or self.pool, fn, *args)
        except (BadRequest, InvalidTraceId) as exc:
            raise ApiError(400, str(exc)) from None
        except TraceNotFound as exc:
            raise ApiError(404, str(exc)) from None
        except ConversationError as exc:  # answered already, not waiting, not finished
            raise ApiError(409, str(exc)) from None
        except BrokerUnavailable:
            raise ApiError(503, "the broker is unreachable: nothing was sent") from None
        except redis.exceptions.RedisError as exc:  # no URL in it: it may hold a password
            log.warning("trace store unreachable: %s", type(exc).__name__)
            raise ApiError(503, "the trace store (Redis) is unreachable") from None

    def reply(self, value: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(value, ensure_ascii=False))

    def message_mode(self) -> str:
        """The `mode=` query argument of a messages request (`all` when absent)."""
        try:
            return queries.check_mode(self.get_query_argument("mode", "all"))
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None

    def trace_id(self, raw: str) -> str:
        try:
            return listing.check_trace_id(raw)
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None


class TracesHandler(_Base):
    """`GET /api/traces?status=&root=&waiting=&model=&preset=&q=&roots=&cursor=&limit=`."""

    async def get(self) -> None:
        query = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        try:
            parsed = listing.TraceFilter.parse(query)
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None
        self.reply(await self.call(listing.list_traces, self.config.store, parsed))


class TraceHandler(_Base):
    """`GET /api/traces/{id}`: the trace, its children and its collaborators."""

    async def get(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        self.reply(await self.call(queries.trace_detail, self.config.store, trace_id))


class MessagesHandler(_Base):
    """`GET /api/traces/{id}/messages?mode=all|main_path`."""

    async def get(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        mode = self.message_mode()
        self.reply(await self.call(queries.trace_messages, self.config.store, trace_id, mode))


class TraceActionHandler(_Base):
    """`POST /api/traces/{id}/{stop|reply|continue}` with a JSON body.

    Approve and deny are `api_approvals`' routes (`ServeConfig.routes`).
    """

    async def post(self, raw_id: str, action: str) -> None:
        trace_id = self.trace_id(raw_id)
        try:
            body = parse_body(action, bytes(self.body_bytes))
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None
        await self.call(self.config.store.get_trace, trace_id)  # 404 before doing anything
        run = functools.partial(ACTIONS[action].run, self.config.actions, trace_id, body)
        self.reply(await self.call(run))


class SessionHandler(_Base):
    """`GET /api/session`: the CSRF token a page sends with each action (same origin only)."""

    def get(self) -> None:
        self.reply({"csrf": self.config.csrf, "token_required": self.config.token is not None})


class EventsHandler(_Base):
    """`GET /api/traces/{id}/events`: the tree's event stream as Server-Sent Events.

    Each event goes out with `id: <stream entry id>`; a client that reconnects with
    `Last-Event-ID` (EventSource does) gets every entry after that one, none lost.
    """

    streams: ThreadPoolExecutor
    closed = False

    def initialize(  # type: ignore[override]
        self, config: ServeConfig, pool: ThreadPoolExecutor, streams: ThreadPoolExecutor
    ) -> None:
        super().initialize(config, pool)
        self.streams = streams

    def on_connection_close(self) -> None:
        self.closed = True

    async def get(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        cursor = self.request.headers.get("Last-Event-ID") or self.get_query_argument("after", "0")
        try:
            cursor = queries.check_event_id(cursor.strip())
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None
        trace = await self.call(self.config.store.get_trace, trace_id)
        if not self.application.settings["stream_slots"].acquire(blocking=False):
            raise ApiError(503, f"{self.config.max_streams} event streams are open already")
        try:
            await self._stream(trace.root_trace_id, cursor)
        finally:
            self.application.settings["stream_slots"].release()

    async def _stream(self, root: str, cursor: str) -> None:
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")  # proxies must pass each event at once
        self.write("retry: 1000\n\n")
        read = functools.partial(
            self.config.store.read_events, block_ms=self.config.stream_block_ms
        )
        while not self.closed:
            batch = await self.call(read, root, cursor, pool=self.streams)
            for entry_id, event in batch:
                self.write(
                    f"id: {entry_id}\nevent: {event.kind}\ndata: {event.model_dump_json()}\n\n"
                )
                cursor = entry_id
            if not batch:
                self.write(": keep-alive\n\n")
            try:
                await self.flush()
            except StreamClosedError:
                return


class HealthHandler(_Base):
    """`GET /healthz`: the process answers (probes; no data, so no token)."""

    def get(self) -> None:
        self.reply({"ok": True})


class PageHandler(_Base):
    """`/`: the live page (static; it reads everything through the API)."""

    def get(self) -> None:
        self.set_header("Content-Security-Policy", PAGE_CSP)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish((STATIC_DIR / "index.html").read_bytes())


class StaticHandler(tornado.web.StaticFileHandler):
    """The page's script and style, with the same headers as the page."""

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", PAGE_CSP)


def make_app(config: ServeConfig) -> tornado.web.Application:
    """The routes; ids are checked by the handlers so a bad one gets a 400 that says why."""
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="serve-api")
    streams = ThreadPoolExecutor(max_workers=config.max_streams, thread_name_prefix="serve-sse")
    base = {"config": config, "pool": pool}
    return tornado.web.Application(
        [
            # More endpoints first: one may add a method to a path below (a POST of messages).
            *(rule for extra in config.routes for rule in extra(base)),
            (r"/", PageHandler, base),
            (r"/healthz", HealthHandler, base),
            (rf"/static/({STATIC_FILES})", StaticHandler, {"path": str(STATIC_DIR)}),
            (r"/api/session", SessionHandler, base),
            (r"/api/traces", TracesHandler, base),
            (r"/api/traces/([^/]+)", TraceHandler, base),
            (r"/api/traces/([^/]+)/messages", MessagesHandler, base),
            (r"/api/traces/([^/]+)/events", EventsHandler, {**base, "streams": streams}),
            (rf"/api/traces/([^/]+)/({'|'.join(ACTIONS)})", TraceActionHandler, base),
        ],
        stream_slots=threading.BoundedSemaphore(config.max_streams),
        pools=(pool, streams),
        xheaders=False,
    )


def serve_forever(
    config: ServeConfig, address: str, port: int, ready: Callable[[str], None]
) -> None:
    """Listen until SIGINT/SIGTERM; `ready` gets the page's URL once the socket is bound."""

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping.set)
        app = make_app(config)
        server = tornado.httpserver.HTTPServer(app, **SERVER_LIMITS)
        server.listen(port, address)
        shown = f"[{address}]" if ":" in address else address
        ready(f"http://{shown or '0.0.0.0'}:{port}/")
        await stopping.wait()
        server.stop()
        for pool in app.settings["pools"]:  # a blocked stream read ends within its block_ms
            pool.shutdown(wait=False, cancel_futures=True)

    asyncio.run(main())
