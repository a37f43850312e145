"""A kombu 5.7 / Celery 5.7 crash on a lost Redis broker connection, worked around.

When the broker goes away while a worker holds unacknowledged messages, Celery's consumer
first `collect()`s the connection (dropping its client) and then closes it; closing the
channel restores the unacked messages through that client, which is gone: AttributeError,
"Unrecoverable error", and the worker exits instead of reconnecting (seen here on every
Redis restart with work in flight). With this, the close skips the restore and the worker
reconnects. What those messages carried is not lost: their traces' leases lapse and the
sweeper re-enqueues them, and waits that relied on a countdown are kept in the outbox.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport.redis import QoS

log = logging.getLogger(__name__)

_installed = False


def install() -> None:
    """Make `QoS.restore_unacked` survive a connection whose client is already gone."""
    global _installed
    if _installed:
        return
    original = QoS.restore_unacked

    def restore_unacked(self: Any, client: Any = None) -> Any:
        try:
            return original(self, client)
        except AttributeError:  # the broken connection lost its client before this close
            log.warning(
                "broker connection lost: %d unacknowledged message(s) left for recovery",
                len(self._delivered),
            )
            return None

    QoS.restore_unacked = restore_unacked  # type: ignore[method-assign]
    _installed = True
