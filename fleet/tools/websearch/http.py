"""The one GET every search provider goes through: SSRF guard, no redirects, capped body.

The provider's host is resolved once by `fleet.tools.netguard` and the connection goes to
the address that was checked, as for `web_fetch`: a provider on loopback, a private
network or the metadata address needs FLEET_WEB_ALLOW. A search API does not redirect, so
a redirect is an error rather than a hop to follow. The body is decoded in steps and cut
at `MAX_RESPONSE_BYTES`: a larger answer is refused, never parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from fleet.errors import ToolError
from fleet.tools import netguard, webstream

if TYPE_CHECKING:
    import httpx

MAX_RESPONSE_BYTES = 1_000_000
"""A page of 20 results is ~50 KB; more than this is not a search answer."""
USER_AGENT = "agent-fleet/0.1 (web_search)"


@dataclass(frozen=True)
class Answer:
    """A provider's answer, read in full (or cut)."""

    status: int
    content_type: str
    body: bytes
    cut: bool
    retry_after_s: float | None


def get(
    url: str,
    headers: Mapping[str, str],
    allow: tuple[str, ...],
    timeout_s: float,
    *,
    what: str = "search provider",
    tool: str = "web_search",
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> Answer:
    """GET `url` through the SSRF guard within `timeout_s`.

    `what` names the server in errors, `tool` the caller in the guard's refusal; a body
    longer than `max_bytes` is cut (`Answer.cut`).

    Raises:
        ToolError: refused by the guard, timed out, a redirect, or a transport error. The
            message names the host only: the URL holds the query, the headers the key.
    """
    import httpx  # here: every registry lists this tool, few runs search (fleet run's start-up)

    from fleet.llm.transport import arm

    host = urlsplit(url).hostname or "?"
    with webstream.Deadline(timeout_s) as deadline:
        try:
            with httpx.Client(follow_redirects=False, trust_env=False) as client:
                arm(client)  # a stop of the run closes the request in flight (`fleet.loop.cut`)
                request = _pinned(client, url, headers, allow, deadline, tool)
                response = client.send(request, stream=True)
                try:
                    return _read(response, what, max_bytes)
                finally:
                    response.close()
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            if deadline.passed or isinstance(exc, httpx.TimeoutException):
                raise ToolError(f"{what} {host!r} timed out after {timeout_s:g}s") from None
            raise ToolError(f"{what} {host!r} failed: {type(exc).__name__}") from None


def _pinned(
    client: httpx.Client,
    url: str,
    headers: Mapping[str, str],
    allow: tuple[str, ...],
    deadline: webstream.Deadline,
    tool: str,
) -> httpx.Request:
    """The request sent to the checked address, the name in Host and SNI (as web_fetch)."""
    import httpx

    parts = urlsplit(url)
    host = parts.hostname or ""
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    target = netguard.resolve(host, port, allow, tool=tool)
    address = f"[{target.address}]" if ":" in target.address else target.address
    pinned = urlunsplit((scheme, f"{address}:{port}", parts.path or "/", parts.query, ""))
    return client.build_request(
        "GET",
        pinned,
        headers={
            **headers,
            "User-Agent": USER_AGENT,
            "Host": parts.netloc.rsplit("@", 1)[-1],
            "Accept-Encoding": webstream.ACCEPT_ENCODING,
        },
        timeout=httpx.Timeout(deadline.remaining_s()),
        extensions={"sni_hostname": host, "trace": deadline.trace},
    )


def _read(response: httpx.Response, what: str, max_bytes: int) -> Answer:
    if response.is_redirect:
        raise ToolError(
            f"{what} answered a redirect (HTTP {response.status_code}): give the URL it points to"
        )
    decoded = webstream.decode_chain(
        response.iter_raw(), response.headers.get("content-encoding", "")
    )
    body, cut = webstream.capped(decoded, max_bytes)
    return Answer(
        status=response.status_code,
        content_type=response.headers.get("content-type", "").lower(),
        body=body,
        cut=cut,
        retry_after_s=_retry_after(response.headers.get("retry-after")),
    )


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None  # an HTTP date: the default pause is near enough
    return seconds if seconds is not None and 0 <= seconds < 3600 else None
