"""The Celery backend of `fleet.Fleet`: enqueue roots, revoke subtrees by stamped headers."""

from __future__ import annotations

from fleet.models import Trace
from fleet.settings import Settings
from workers.app import app
from workers.dispatch import send


class CeleryBackend:
    """Sends `fleet.run_agent` for root traces."""

    def __init__(self, settings: Settings) -> None:
        """Point the app at the settings' broker and backend."""
        app.conf.broker_url = settings.broker_url
        app.conf.result_backend = settings.redis_url

    def enqueue(self, trace: Trace) -> None:
        """`fleet.run_agent(trace_id)` on the queue of the trace's mode."""
        send(trace)

    def revoke(self, trace_ids: list[str]) -> None:
        """Discard queued tasks stamped with any of these traces as parent or root."""
        control = app.control
        control.revoke_by_stamped_headers({"parent_trace_id": trace_ids}, timeout=1.0)
        control.revoke_by_stamped_headers({"root_trace_id": trace_ids}, timeout=1.0)


def make_backend(settings: Settings) -> CeleryBackend:
    """Entry point `fleet.backends: celery`."""
    return CeleryBackend(settings)
