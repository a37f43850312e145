"""Retries for model HTTP calls: exponential backoff with full jitter, `retry-after` honoured.

What a retry may fix (429, 408, 409, 5xx, timeouts, dropped connections) is retried up to
`RetryPolicy.max_attempts` times and then raised as `TransientLLMError`; any other 4xx is
raised at once as `ConfigError` or `ModelBehaviorError` with a one-line message.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from fleet.errors import (
    ConfigError,
    FleetError,
    ModelBehaviorError,
    ProviderOverloaded,
    TransientLLMError,
)
from fleet.llm import cancel
from fleet.llm.ratelimit import OVERLOAD_STATUS, finite_s, rate_signal
from fleet.llm.timing import record_attempt, wall_ms
from fleet.security.redact import SHAPES_ONLY, Redactor

if TYPE_CHECKING:
    import httpx

RETRYABLE_STATUS = frozenset({408, 409, 429})
"""Retryable 4xx codes; every 5xx (Anthropic's 529 "overloaded" included) is retried too."""

CONFIG_STATUS = frozenset({401, 403, 404})
"""Codes that mean the key, base_url or model name is wrong, not the conversation."""


ERROR_DETAIL_MAX_CHARS = 200


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait; `sleep`, `random_fraction` and `clock` are test seams."""

    max_attempts: int = 4
    """Total tries, the first one included."""
    base_delay_s: float = 0.5
    """Backoff cap of the first retry; doubles on each further one."""
    max_delay_s: float = 30.0
    """No single wait is longer than this, whatever `retry-after` says."""
    sleep: Callable[[float], None] = cancel.pause
    """The backoff's wait: ends at once when the call is cancelled (`fleet.llm.cancel`)."""
    random_fraction: Callable[[], float] = random.random
    """Uniform in [0, 1): the jitter."""
    clock: Callable[[], float] = time.time
    """Wall-clock seconds since the epoch, for `retry-after` given as an HTTP date."""
    hand_back_overload: bool = False
    """Raise `ProviderOverloaded` at the first 429/503/529 instead of sleeping on it: on a
    fleet the limiter pauses the provider for every worker and the run is re-enqueued."""


DEFAULT_RETRY = RetryPolicy()


def backoff_s(attempt: int, policy: RetryPolicy) -> float:
    """Full-jitter delay before retry number `attempt + 1` (`attempt` counts from 0)."""
    cap_s = min(policy.max_delay_s, policy.base_delay_s * 2.0**attempt)
    return policy.random_fraction() * cap_s


def retry_after_s(headers: Mapping[str, str], now_s: float) -> float | None:
    """The server's requested wait, from `retry-after-ms` or `retry-after`, else None.

    `retry-after` may be seconds or an HTTP date; a date in the past means 0. A value that
    is not a finite number of seconds is skipped like an unreadable one.
    """
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = finite_s(float(value) * scale)
        except ValueError:
            seconds = None
        if seconds is not None:
            return seconds
        if name == "retry-after":
            try:
                return finite_s(parsedate_to_datetime(value).timestamp() - now_s)
            except (TypeError, ValueError):
                return None
    return None


def overload_wait_s(headers: Mapping[str, str], now_s: float) -> float | None:
    """How long a 429/503/529 asks everyone to wait, or None when it does not say.

    `retry-after-ms` or `retry-after` first; else the rate-limit headers' reset of what is
    exhausted (OpenAI `x-ratelimit-reset-*`, Anthropic `anthropic-ratelimit-*-reset`),
    until one unit is back.
    """
    asked_s = retry_after_s(headers, now_s)
    if asked_s is None:
        asked_s = rate_signal(headers, now_s).pause_s()
    return asked_s


def error_detail(response: httpx.Response, redactor: Redactor = SHAPES_ONLY) -> str:
    """The provider's error message on one short line (`error.message` of the JSON body).

    Redacted before it is cut: a server may echo the request's `Authorization` header or
    key anywhere in its body, and a cut must not leave half a key behind.
    """
    try:
        body = response.json()
        detail = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        detail = response.text
    detail = redactor(" ".join(detail.split()))
    if len(detail) > ERROR_DETAIL_MAX_CHARS:
        detail = detail[:ERROR_DETAIL_MAX_CHARS] + "..."
    return detail or "(empty body)"


def non_retryable_error(
    response: httpx.Response, provider: str, api_key_env: str, redactor: Redactor = SHAPES_ONLY
) -> FleetError:
    """The exception for a 4xx a retry cannot fix, its provider text redacted."""
    status = response.status_code
    if status in (401, 403):
        # The body is left out on purpose: OpenAI echoes part of a rejected key in it.
        where = f"check {api_key_env}" if api_key_env else "the provider needs an API key"
        return ConfigError(f"{provider} rejected the API key (HTTP {status}): {where}")
    detail = error_detail(response, redactor)
    if status in CONFIG_STATUS:
        return ConfigError(
            f"{provider} returned HTTP {status} (check base_url and model name): {detail}"
        )
    return ModelBehaviorError(f"{provider} rejected the request (HTTP {status}): {detail}")


def is_retryable_status(status: int) -> bool:
    """True for 408, 409, 429 and every 5xx."""
    return status in RETRYABLE_STATUS or status >= 500


def send_with_retry(
    send: Callable[[], httpx.Response],
    *,
    provider: str,
    api_key_env: str,
    policy: RetryPolicy = DEFAULT_RETRY,
    redactor: Redactor = SHAPES_ONLY,
) -> httpx.Response:
    """Call `send` until it gives a 2xx response, retrying what a retry may fix.

    Every provider text that goes into an error passes through `redactor` (the client's
    own key and the process's secrets) first.

    Raises:
        TransientLLMError: every attempt failed in a retryable way.
        ConfigError: 401, 403 or 404 (bad key, base_url or model).
        ModelBehaviorError: any other 4xx.
        CallCancelled: the call was cancelled (`fleet.llm.cancel`).
    """
    # httpx here, not at the top: a client that reads the model config sends nothing.
    import httpx

    failure = ""
    for attempt in range(policy.max_attempts):
        cancel.check()  # a cut between attempts: no further one
        started_ms = wall_ms()
        try:
            response = send()
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            cancel.check()  # the connection was shut on purpose: no retry
            failure = redactor(" ".join(f"{type(exc).__name__}: {exc}".split()))
            record_attempt(started_ms, failure)
            delay_s = backoff_s(attempt, policy)
        except httpx.HTTPError as exc:
            # Never the text: httpx quotes the offending header, API key included.
            raise ConfigError(
                f"{provider} request could not be sent ({type(exc).__name__}); "
                f"check the provider's base_url and {api_key_env or 'its API key'}"
            ) from None
        else:
            if response.is_success:
                record_attempt(started_ms)
                return response
            if not is_retryable_status(response.status_code):
                record_attempt(started_ms, f"HTTP {response.status_code}")
                raise non_retryable_error(response, provider, api_key_env, redactor)
            failure = f"HTTP {response.status_code}: {error_detail(response, redactor)}"
            record_attempt(started_ms, failure)
            asked_s = overload_wait_s(response.headers, policy.clock())
            if policy.hand_back_overload and response.status_code in OVERLOAD_STATUS:
                raise ProviderOverloaded(
                    f"{provider} is overloaded ({failure})",
                    status=response.status_code,
                    retry_after_s=asked_s,
                )
            delay_s = backoff_s(attempt, policy) if asked_s is None else asked_s
        if attempt + 1 < policy.max_attempts:
            policy.sleep(min(delay_s, policy.max_delay_s))
    raise TransientLLMError(
        f"{provider} request failed after {policy.max_attempts} attempts; last: {failure}"
    )
