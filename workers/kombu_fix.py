"""A kombu 5.7 / Celery 5.7 crash on a lost Redis broker connection, worked around.

When the broker goes away while a worker holds unacknowledged messages, Celery's consumer
first `collect()`s the connection (dropping its client) and then closes it; closing the
channel restores the unacked messages through that client, which is gone: AttributeError,
"Unrecoverable error", and the worker exits instead of reconnecting (seen here on every
Redis restart with work in flight). With this, the close skips the restore and the worker
reconnects (a task finishing on its old channel skips its ack too). What those messages
carried is not lost: their traces' leases lapse and the sweeper re-enqueues them, and
waits that relied on a countdown are kept in the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kombu.transport.redis import QoS

log = logging.getLogger(__name__)

_installed = False


def install() -> None:
    """Make the Redis QoS survive a channel whose connection was already collected.

    `restore_unacked` (on close), `ack` and `reject` (a task that ran across the loss
    finishing on its old channel) then log instead of raising.
    """
    global _installed
    if _installed:
        return
    for name in ("restore_unacked", "ack", "reject"):
        setattr(QoS, name, _tolerant(name, getattr(QoS, name)))
    _installed = True


def _tolerant(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except AttributeError:  # the broken connection lost its client before this call
            log.warning(
                "broker connection lost: %s skipped (%d unacknowledged message(s) are left"
                " to the sweeper and the visibility timeout)",
                name,
                len(self._delivered),
            )
            return None

    return call
