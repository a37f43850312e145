"""The values of the provider-batch call queue (`fleet.storage.batch_calls`), stored as JSON."""

from __future__ import annotations

from typing import Any, Literal

from fleet.models import Record

CallState = Literal["queued", "submitting", "submitted", "answered", "cancelled"]


class CallStatus(Record):
    """Where one call is: its state, attempt and the flush or batch that holds it."""

    state: CallState = "queued"
    attempt: int = 1
    flush_id: str = ""
    batch_id: str = ""


class PendingCall(Record):
    """One model call waiting on a provider batch: its trace turn and its request."""

    custom_id: str
    trace_id: str
    root_trace_id: str
    model_name: str
    body: dict[str, Any]
    """Provider-neutral: `messages`, `tools`, `temperature`, `max_output_tokens`."""
    queued_at_ms: int


class Flush(Record):
    """Calls of one model sent (or being sent) as one provider batch."""

    flush_id: str
    model_name: str
    custom_ids: list[str]
    wire_ids: list[str] = []
    at_ms: int
    batch_id: str = ""
