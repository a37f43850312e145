"""The `web_fetch` tool: one GET over http(s) to the public internet, returned as plain text.

Internal addresses (loopback, private, link-local and cloud metadata, CGNAT, 0.0.0.0, and
IPv6 forms hiding them) are refused at every redirect hop unless FLEET_WEB_ALLOW names
them; see `fleet.tools.netguard`.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit, urlunsplit

from fleet.config.webfilter import DomainFilter
from fleet.errors import ToolError
from fleet.tools import netguard, webstream
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.workspace import truncate

if TYPE_CHECKING:
    import httpx

MAX_FETCH_BYTES = 2_000_000
"""The body is cut after this many bytes; the rest is never downloaded."""
USER_AGENT = "agent-fleet/0.1 (web_fetch)"
MAX_REDIRECTS = 5
_WHITESPACE = re.compile(r"\s+")
_TEXT_MARKERS = ("text/", "json", "xml", "javascript", "yaml", "csv")
_SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template", "svg"})
_BLOCK_TAGS = frozenset(
    {"p", "div", "br", "li", "tr", "section", "article", "header", "footer", "pre"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol", "blockquote", "title"}
)


@dataclass(frozen=True)
class _Download:
    status: int
    content_type: str
    encoding: str
    body: bytes
    cut: bool
    final_url: str


def web_fetch(ctx: ToolContext, url: str) -> ToolResult:
    """Fetch a web page and return its text; HTML is reduced to readable text.

    Args:
        ctx: The run's workspace and limits.
        url: An http:// or https:// address.
    """
    import httpx  # here: every registry lists this tool, few runs fetch (~100 ms saved)

    _check_scheme(url)
    timeout_s = min(ctx.web_timeout_s, ctx.tool_timeout_s)
    with webstream.Deadline(timeout_s) as deadline:
        try:
            page = _download(url, deadline, ctx.web_allow, ctx.web_filter)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            if deadline.passed or isinstance(exc, httpx.TimeoutException):
                raise ToolError(f"fetching {url!r} timed out after {timeout_s:g}s") from None
            raise ToolError(f"fetching {url!r} failed: {exc}") from exc
    if deadline.passed:  # a body read until close ends quietly when the deadline cuts it
        raise ToolError(f"fetching {url!r} timed out after {timeout_s:g}s")
    if page.content_type and not any(m in page.content_type for m in _TEXT_MARKERS):
        raise ToolError(f"{url!r} is {page.content_type!r}, not text")
    text = page.body.decode(page.encoding, errors="replace")
    if "html" in page.content_type:
        text = html_to_text(text)
    if page.cut:
        text += f"\n… [body cut at {MAX_FETCH_BYTES} bytes]"
    return ToolResult(
        title=f"GET {url} -> {page.status}",
        output=truncate(text, ctx.output_limit_chars),
        long_term_memory=f"fetched {url} (HTTP {page.status}, {len(text)} chars)",
        is_error=page.status >= 400,
        metadata={"status": page.status, "final_url": page.final_url, "cut": page.cut},
    )


def _download(
    url: str, deadline: webstream.Deadline, allow: tuple[str, ...], domains: DomainFilter
) -> _Download:
    """GET `url`, reading at most `MAX_FETCH_BYTES` (decoded) before `deadline`.

    Redirects are followed here, not by httpx, so every hop is resolved and checked, and
    each connection goes to the address that was checked (see `fleet.tools.netguard`).
    Every hop must also pass the domain filters (`fleet.config.webfilter`).
    """
    import httpx

    from fleet.llm.transport import arm  # with httpx: loaded by a fetch, not by a start

    # trust_env=False: an HTTP(S)_PROXY from the environment would connect elsewhere.
    with httpx.Client(follow_redirects=False, trust_env=False) as client:
        arm(client)  # a stop of the run closes the request in flight (`fleet.loop.cut`)
        for _ in range(MAX_REDIRECTS + 1):
            domains.check(url, "web_fetch")
            request = _pinned_request(client, url, allow, deadline)
            response = client.send(request, stream=True)
            try:
                location = response.headers.get("location")
                if response.is_redirect and location:
                    url = urljoin(url, location)
                    _check_scheme(url)
                    continue
                return _read(response, url)
            finally:
                response.close()
    raise ToolError(f"more than {MAX_REDIRECTS} redirects")


def _check_scheme(url: str) -> None:
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise ToolError(f"url {url!r} is not an http:// or https:// address")


def _pinned_request(
    client: httpx.Client, url: str, allow: tuple[str, ...], deadline: webstream.Deadline
) -> httpx.Request:
    """A request for `url` sent to its checked address, with the name in Host and SNI.

    The host is taken apart here, not by httpx: its URL parser and the resolver disagree
    on spellings like `0177.0.0.1`, and the resolver's reading is the one that connects.
    """
    import httpx

    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ToolError(f"url {url!r} has an invalid port") from exc
    if not host:
        raise ToolError(f"url {url!r} names no host")
    scheme = parts.scheme.lower()
    port = port or (443 if scheme == "https" else 80)
    target = netguard.resolve(host, port, allow)
    address = f"[{target.address}]" if ":" in target.address else target.address
    pinned = urlunsplit((scheme, f"{address}:{port}", parts.path or "/", parts.query, ""))
    host_header = parts.netloc.rsplit("@", 1)[-1]  # never forward user:password@
    return client.build_request(
        "GET",
        pinned,
        headers={
            "User-Agent": USER_AGENT,
            "Host": host_header,
            "Accept-Encoding": webstream.ACCEPT_ENCODING,
        },
        # each operation may take what is left; the deadline cuts whatever is in flight
        timeout=httpx.Timeout(deadline.remaining_s()),
        extensions={"sni_hostname": host, "trace": deadline.trace},
    )


def _read(response: httpx.Response, url: str) -> _Download:
    """The body, decoded step by step and cut at `MAX_FETCH_BYTES` after decoding.

    httpx's own decoders inflate each network chunk whole (a `gzip, gzip` bomb expands
    before any cap is checked), so the raw bytes are decoded by `fleet.tools.webstream`.
    """
    encoding = response.headers.get("content-encoding", "")
    decoded = webstream.decode_chain(response.iter_raw(), encoding)
    body, cut = webstream.capped(decoded, MAX_FETCH_BYTES)
    return _Download(
        status=response.status_code,
        content_type=response.headers.get("content-type", "").lower(),
        encoding=_codec(response.charset_encoding),
        body=body,
        cut=cut,
        final_url=url,
    )


def _codec(charset: str | None) -> str:
    """The declared charset if Python knows it, else UTF-8."""
    if charset:
        try:
            return codecs.lookup(charset).name
        except LookupError:
            pass
    return "utf-8"


class _TextExtractor(HTMLParser):
    """Collects visible text, with a line break at each block element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_TAGS:
            self._skipping += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED_TAGS:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:  # HTML treats any run of whitespace as one space
            self.parts.append(_WHITESPACE.sub(" ", data))


def html_to_text(html: str) -> str:
    """Visible text of an HTML page, crudely: no scripts or styles, one block per line."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (line.strip() for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)
