"""The HTTP side both Batch API clients share: headers, retries, redaction, capped reads.

Everything a provider sends is read with a cap while it is read, never after: a JSON
answer (a batch's status, a listing) past `JSON_MAX_BYTES` is refused, an error body is
cut at `ERROR_MAX_BYTES`, and a results file is streamed (`stream`) for
`fleet.batchapi.lines` to read one capped line at a time. A connection that breaks mid-
file is a `TransientLLMError`: the poller logs it and reads the batch again next poll.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fleet.batchapi.lines import strict_json
from fleet.errors import ModelBehaviorError, TransientLLMError
from fleet.llm.base import check_model_requests_allowed
from fleet.llm.config import ModelTarget
from fleet.llm.retry import DEFAULT_RETRY, send_with_retry
from fleet.security.redact import Redactor

if TYPE_CHECKING:  # httpx is imported where a client is built (see providers)
    import httpx

HTTP_TIMEOUT_S = 120.0
JSON_MAX_BYTES = 8 * 1024 * 1024
"""A batch's status or a page of the batch listing is a few KiB."""
ERROR_MAX_BYTES = 64 * 1024
CHUNK_BYTES = 256 * 1024
_BODY_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


class BatchHttp:
    """One provider's HTTP client for its Batch API."""

    def __init__(
        self, target: ModelTarget, key: str, headers: dict[str, str], env: Mapping[str, str]
    ) -> None:
        """Send `headers` (the key's among them) to `target`; `env`'s secrets are redacted."""
        self.target = target
        self._headers = headers
        self._redactor = Redactor.from_env(env).with_values([key])
        import httpx  # see the TYPE_CHECKING block

        self._http = httpx.Client(timeout=HTTP_TIMEOUT_S)

    def send(self, method: str, url: str, **kwargs: Any) -> None:
        """A request whose answer is not read (a cancel); retried as a live call is."""
        with self.stream(method, url, **kwargs):
            pass

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **kwargs: Any) -> Iterator[Iterator[bytes]]:
        """The 2xx answer's body as chunks, read as they are consumed; closed on exit."""
        import httpx

        check_model_requests_allowed(self.target.kind)

        def once() -> httpx.Response:
            request = self._http.build_request(method, url, headers=self._headers, **kwargs)
            response = self._http.send(request, stream=True)
            if response.is_success:
                return response
            try:  # an error body is quoted in one line: read at most a little of it
                body = _capped(response.iter_bytes(CHUNK_BYTES), ERROR_MAX_BYTES, cut=True)
            finally:
                response.close()
            # The body is decoded already: its encoding and length headers no longer apply.
            kept = {k: v for k, v in response.headers.items() if k.lower() not in _BODY_HEADERS}
            return httpx.Response(response.status_code, headers=kept, content=body, request=request)

        response = send_with_retry(
            once,
            provider=self.target.provider,
            api_key_env=self.target.api_key_env,
            policy=DEFAULT_RETRY,
            redactor=self._redactor,
        )
        try:
            yield _reading(response.iter_bytes(CHUNK_BYTES), self.target.provider)
        finally:
            response.close()

    def json(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        """The answer as a JSON object, read up to `JSON_MAX_BYTES`; else `ModelBehaviorError`."""
        provider = self.target.provider
        with self.stream(method, url, **kwargs) as chunks:
            raw = _capped(chunks, JSON_MAX_BYTES, cut=False)
        if raw is None:
            raise ModelBehaviorError(f"{provider} sent more than {JSON_MAX_BYTES} bytes from {url}")
        try:
            data = strict_json(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ModelBehaviorError(f"{provider} sent no JSON object from {url}")
        return data

    def close(self) -> None:
        """Close the connections."""
        self._http.close()


def _capped(chunks: Iterator[bytes], max_bytes: int, *, cut: bool) -> bytes | None:
    """At most `max_bytes` of the chunks; past it the first `max_bytes` (`cut`) or None."""
    read = bytearray()
    for chunk in chunks:
        read += chunk
        if len(read) > max_bytes:
            return bytes(read[:max_bytes]) if cut else None
    return bytes(read)


def _reading(chunks: Iterator[bytes], provider: str) -> Iterator[bytes]:
    """The chunks; a connection broken mid-body is a `TransientLLMError` (read again later)."""
    import httpx

    try:
        yield from chunks
    except httpx.HTTPError as exc:
        raise TransientLLMError(
            f"{provider} broke off a batch answer ({type(exc).__name__})"
        ) from None
