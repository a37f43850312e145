"""Who may ask `fleet serve` what: the bearer token, the Host, and CSRF for every POST.

A POST (every action: submit, run, stop, reply, approve, deny, continue...) must come,
when it says where it comes from (`Origin`, `Sec-Fetch-Site`, which browsers always send),
from this service's own origin, and must prove it was not forged by another site: on a
service with a bearer token the token itself does (no browser adds `Authorization` on its
own, so a script sends the token alone); on a token-less (loopback) service it carries the
CSRF token in `X-Fleet-CSRF` (the page reads it from `GET /api/session`, which another
origin cannot read: no CORS header is ever sent). A custom header also makes any
cross-site fetch a preflight that this service never grants.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

import tornado.http1connection
import tornado.httputil
import tornado.web

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_BODY_BYTES = 64 * 1024
"""The largest request body taken (an action's JSON); bigger ones are refused unread."""
CSRF_HEADER = "X-Fleet-CSRF"
SAME_SITE_FETCH = frozenset({"same-origin", "none"})


class ApiError(tornado.web.HTTPError):
    """An HTTP error whose message is safe to show the client."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        """Status code and a one-line message; `field` names the body's field at fault."""
        super().__init__(status, reason=None)
        self.message = message
        self.field = field


def csrf_token(bearer: str | None) -> str:
    """The CSRF token: derived from the bearer token (every replica agrees), else random.

    Without a bearer token the service is loopback-only and one process: a random token
    per process is enough, and a restart only makes an open page fetch it again.
    """
    if bearer is None:
        return secrets.token_urlsafe(32)
    return hmac.new(bearer.encode(), b"fleet-serve-csrf", hashlib.sha256).hexdigest()


def check_request(request: tornado.httputil.HTTPServerRequest, token: str | None) -> None:
    """`ApiError` unless the request may be answered at all.

    With a token: `Authorization: Bearer <token>` on every API call. Without one (the
    service then listens on loopback only): the Host must be a loopback name, so a web page
    elsewhere cannot reach it by DNS rebinding. A POST from another origin is refused.
    """
    if token is not None and request.path.startswith("/api/"):
        sent = request.headers.get("Authorization", "")
        scheme, _, value = sent.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
            raise ApiError(401, "a bearer token is required (Authorization: Bearer ...)")
    if token is None and host_name(request.host) not in LOOPBACK_HOSTS:
        raise ApiError(403, "without a token only loopback host names are answered")
    if request.method == "POST":
        check_same_origin(request)


def check_same_origin(request: tornado.httputil.HTTPServerRequest) -> None:
    """`ApiError` 403 for a POST that says it comes from another origin or site."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise ApiError(403, "cross-origin POST refused")
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in SAME_SITE_FETCH:
        raise ApiError(403, f"cross-site POST refused (Sec-Fetch-Site: {fetch_site[:20]})")


def check_csrf(request: tornado.httputil.HTTPServerRequest, expected: str) -> None:
    """`ApiError` 403 unless the POST carries this service's CSRF token."""
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise ApiError(403, f"the {CSRF_HEADER} token is missing or wrong (GET /api/session)")


def check_body_size(request: tornado.httputil.HTTPServerRequest) -> None:
    """`ApiError` 413 when the declared body is over `MAX_BODY_BYTES`.

    A chunked body declares no length: the connection's cap is lowered to the same size so
    tornado stops reading it there.
    """
    declared = request.headers.get("Content-Length", "0")
    if not declared.isdigit() or int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    if isinstance(request.connection, tornado.http1connection.HTTP1Connection):
        request.connection.set_max_body_size(MAX_BODY_BYTES)


def host_name(host: str) -> str:
    """`127.0.0.1:8600` -> `127.0.0.1`, `[::1]:8600` -> `::1`."""
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
