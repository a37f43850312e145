"""The Celery backend of `fleet.Fleet`: enqueue roots, revoke subtrees by stamped headers."""

from __future__ import annotations

from kombu.exceptions import OperationalError

from fleet.errors import BrokerUnavailable
from fleet.limits.trees import Priority
from fleet.models import Mode, Trace
from fleet.settings import Settings
from fleet.storage.backends.redis.connect import redact_url
from fleet.storage.root_message import Command, RootMessage
from workers.app import QUEUE_BY_MODE, create_app
from workers.dispatch import send_answered
from workers.patches.switches import enabled
from workers.root_message import recorded


class CeleryBackend:
    """Sends `fleet.run_agent` for root traces."""

    def __init__(self, settings: Settings) -> None:
        """A client app of its own on the settings' broker (the worker's app stays as it is)."""
        self.app = create_app(settings, set_as_current=False)
        self._with_root = (
            settings.broker_url == settings.redis_url
            and settings.redis_url.split(":", 1)[0] in ("redis", "rediss", "unix")
            and not settings.redis_cluster
            and settings.redis_sentinel_master is None
            and enabled("root-message")
        )

    def root_message(self, priority: Priority = "interactive") -> RootMessage | None:
        """A root's message for the script that queues it, when the broker is the store.

        None elsewhere: `enqueue` sends it after the root was queued.
        """
        if not self._with_root:
            return None

        def commands(trace: Trace) -> tuple[Command, ...] | None:
            try:
                return recorded(
                    self.app, lambda: send_answered(trace, via=self.app, priority=priority)
                )
            except OperationalError:  # kombu could not declare: `enqueue` says it, after
                return None

        return RootMessage(commands)

    def enqueue(self, trace: Trace, priority: Priority = "interactive") -> None:
        """`fleet.run_agent(trace_id)` on the queue of the trace's mode, at its priority.

        Raises:
            BrokerUnavailable: kombu gave up reaching the broker (after its publish retries).
        """
        try:
            send_answered(trace, via=self.app, priority=priority)
        except OperationalError as exc:
            url = redact_url(self.app.conf.broker_url)
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise BrokerUnavailable(f"cannot reach the broker at {url!r}: {reason}") from None

    def revoke(self, stamps: list[str]) -> None:
        """Discard queued tasks stamped with any of these values as parent or root."""
        control = self.app.control
        control.revoke_by_stamped_headers({"parent_trace_id": stamps}, timeout=1.0)
        control.revoke_by_stamped_headers({"root_trace_id": stamps}, timeout=1.0)

    def queue(self, mode: Mode) -> str:
        """`fleet.{mode}`."""
        return QUEUE_BY_MODE[mode]


def make_backend(settings: Settings) -> CeleryBackend:
    """Entry point `fleet.backends: celery`."""
    return CeleryBackend(settings)
