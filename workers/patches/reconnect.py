"""A worker's consumer reconnects to a lost broker every second or two, not ever more slowly.

The `consumer-reconnect` patch (`workers.patches.switches`), written and tested against
Celery 5.7.0 and kombu 5.7.0. It wraps `celery.worker.consumer.consumer.Consumer
.ensure_connected(conn)`, which calls `conn.ensure_connection(errback, max_retries,
callback=...)` without intervals, so kombu's `Connection._ensure_connection` defaults
apply: a first try, then tries `interval_start=2` s later, each `interval_step=2` s
further apart, up to `interval_max=30` s (2, 4, 6, ... 30: the consumer's only tries in
the first minute are at 0, 2, 6, 12, 20, 30, 42 and 56 s). Celery offers no setting for
them, and kombu's transport options (`interval_*`) reach only `Connection.ensure` and
`default_channel`, not this call. tests/test_celery_patches.py asserts both on Celery.

Why it matters: when a Sentinel-managed master dies, every try fails until the sentinels
promote the replica (~2 s; ~12 s after a failed election, longer again on a loaded machine,
each failed election costing 2 x `failover-timeout`), and the consumer then waits for its
next try: up to 30 s after the new master is there, during which the worker takes no
task (measured here: promoted at 12.6 s, one worker's next try at 20 s; promoted a little
later, the wait is 8 s, then 10, 12...). With the patch the tries go 1 s apart at most
`RECONNECT_MAX_S` (2 s), so a worker takes tasks again within ~2 s of the promotion; each
try that fails costs a connection refused or a sentinel's answer (`No master found`), so
trying every 2 s costs nothing worth saving. Off, kombu's schedule, as upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from celery.worker.consumer.consumer import Consumer

from workers.patches.switches import Undo, replace

RECONNECT_START_S = 1.0
"""The wait before the consumer's second try to reach a lost broker."""
RECONNECT_STEP_S = 1.0
RECONNECT_MAX_S = 2.0
"""The longest wait between two tries: the delay after the broker is back, at most."""


def install_reconnect() -> list[Undo]:
    """`consumer-reconnect`: the consumer's reconnection tries at most RECONNECT_MAX_S apart."""
    return [replace(Consumer, "ensure_connected", _paced(Consumer.ensure_connected))]


def _paced(upstream: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def ensure_connected(self: Any, conn: Any) -> Any:
        """Celery's, with kombu's retry schedule for this connection made short."""
        conn.ensure_connection = partial(
            type(conn).ensure_connection,
            conn,
            interval_start=RECONNECT_START_S,
            interval_step=RECONNECT_STEP_S,
            interval_max=RECONNECT_MAX_S,
        )
        return upstream(self, conn)

    return ensure_connected


INSTALLS = {"consumer-reconnect": install_reconnect}
"""The patch by its switch name, for `workers.patches.GLOBAL_INSTALLS`."""
