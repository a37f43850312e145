"""Remote sub-agents (fleet.remote, fleet.storage.remote_watch): their Redis key.

Importable from `fleet.storage.keys` like every other key; a function because its name
depends on the layout, set at start-up.
"""

from __future__ import annotations

from fleet.storage.keys.layout import LAYOUT, PREFIX


def remote_watch() -> str:
    """Sorted set: trace id -> when a poller next asks its remote task's state (ms).

    A member is a remote child parked on its A2A task (`waiting`, no slot): added when its
    message was sent, re-scored by every follow that claims it (a stream window, a poll),
    removed when the task ended (or its trace did). No TTL: an entry whose trace is gone
    is dropped by the next follow.
    One key, so one slot in the cluster layout too (`{remote}`).
    """
    return f"{PREFIX}:{'{remote}' if LAYOUT['cluster'] else 'remote'}:watch"
