"""When a model call ran: its start and end, and each HTTP attempt of it (retries included).

A model call is a span for the trace page and `fleet trace show`: started, ended, and the
attempts `send_with_retry` made (a 500 then an answer reads as two attempts). The attempts
are recorded per call, not per client (one client serves every run of a worker, in
threads): `recording_attempts()` opens a list in this context, which the call's thread
shares (`fleet.loop.cut.cuttable` runs the call in a copy of the context).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fleet.models import Message

MAX_ATTEMPT_ERROR_CHARS = 200
CALL_SPAN_KEY = "call_span"
"""The key of an assistant message's metadata that holds its call's `CallTiming`."""


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt of a model call."""

    started_at_ms: int
    ended_at_ms: int
    error: str = ""
    """Why it failed (already redacted, one line); '' for the attempt that answered."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept on the message (or the `queued` event of a failed call)."""
        out: dict[str, Any] = {"started_at_ms": self.started_at_ms, "ended_at_ms": self.ended_at_ms}
        if self.error:
            out["error"] = self.error[:MAX_ATTEMPT_ERROR_CHARS]
        return out


@dataclass(frozen=True)
class CallTiming:
    """A model call's span: from the request to the answer, and its attempts."""

    started_at_ms: int
    ended_at_ms: int
    attempts: tuple[Attempt, ...] = ()
    """Empty for a client without HTTP retries (the scripted model): one attempt."""

    def as_dict(self) -> dict[str, Any]:
        """What an assistant message's metadata keeps under `call`."""
        return {
            "started_at_ms": self.started_at_ms,
            "ended_at_ms": self.ended_at_ms,
            "duration_ms": self.ended_at_ms - self.started_at_ms,
            "attempts": [a.as_dict() for a in self.attempts],
        }


_attempts: contextvars.ContextVar[list[Attempt] | None] = contextvars.ContextVar(
    "fleet_llm_attempts", default=None
)


@contextmanager
def recording_attempts(into: list[Attempt] | None = None) -> Iterator[list[Attempt]]:
    """Collect the attempts of the call made in this context and its copies into `into`."""
    attempts = [] if into is None else into
    token = _attempts.set(attempts)
    try:
        yield attempts
    finally:
        _attempts.reset(token)


def record_attempt(started_at_ms: int, error: str = "") -> None:
    """Note an attempt that ends now, if a call is being recorded here."""
    attempts = _attempts.get()
    if attempts is not None:
        attempts.append(Attempt(started_at_ms, wall_ms(), error))


def wall_ms() -> int:
    """Milliseconds since the epoch (spans are shown against the events' clock)."""
    return int(time.time() * 1000)


def span_of(message: Message) -> dict[str, Any]:
    """An assistant message's call span as its `message` event carries it.

    {} for a message without a recorded call (a batch's answer, a fan-out's planned turn).
    """
    span = message.metadata.get(CALL_SPAN_KEY)
    if not isinstance(span, dict):
        return {}
    return {
        "started_at_ms": span["started_at_ms"],
        "prompt_tokens": message.prompt_tokens,
        "completion_tokens": message.completion_tokens,
        "cost_usd": message.cost_usd,
        "attempts": len(span["attempts"]) or 1,
    }
