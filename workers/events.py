"""The app's event dispatcher: every event this process sends has its text fields redacted.

Every event (task-sent, received, started, failed with its exception and traceback,
succeeded with its result) is redacted before it leaves, whoever built it: the last layer
behind `workers.naming`. Redaction is not a patch and has no switch; the dispatcher it
extends batches a worker's task events (`workers.patches.events`, `event-batching`).
"""

from __future__ import annotations

from typing import Any

from celery.app.events import Events

from fleet.settings import process_redactor
from workers.patches.events import BatchingDispatcher

_SEND_OPTIONS = ("blind", "utcoffset", "retry", "retry_policy", "Event")


def redact_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """An event's fields with every text value redacted (ids and numbers pass unchanged)."""
    redactor = process_redactor()
    return {k: redactor(v) if isinstance(v, str) else v for k, v in fields.items()}


class RedactingDispatcher(BatchingDispatcher):
    """Celery's event dispatcher: fields redacted (and a worker's task events batched)."""

    def send(self, type: str, *args: Any, **fields: Any) -> Any:
        """See `EventDispatcher.send`."""
        options = {k: fields.pop(k) for k in _SEND_OPTIONS if k in fields}
        return super().send(type, *args, **options, **redact_fields(fields))

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **kwargs: Any) -> Any:
        """See `EventDispatcher.publish` (every sender's `task-sent` goes this way)."""
        return super().publish(type, redact_fields(fields), producer, **kwargs)


class RedactingEvents(Events):  # type: ignore[misc]
    """`app.events` whose dispatchers are `RedactingDispatcher`s."""

    dispatcher_cls = "workers.events:RedactingDispatcher"
