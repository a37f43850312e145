"""A store or broker that is away for a moment, logged in one line, not as a traceback.

A worker's background loops (lease heartbeat, sweeper, counters) retry on their next beat
when Redis restarts, fails over or a Cluster master is replaced; the operator needs one
line saying so, not forty lines of redis-py's frames per loop per second of the outage
(the chaos harness counts tracebacks in worker logs: each must be a defect). Any other
exception keeps its traceback.

The classes are matched by name along the exception's MRO, so this module needs no Redis
or broker client (the layer rule): redis-py's `ConnectionError` (and `MasterNotFoundError`,
`BusyLoadingError` under it), `TimeoutError`, `ClusterDownError`, `TryAgainError`,
`ReadOnlyError` (a write that reached a master just demoted), kombu's `OperationalError`,
every `OSError` (a refused or reset socket), and a Cluster client's `ClusterError` "TTL
exhausted" (its redirections used up while slots move).
"""

from __future__ import annotations

import logging
import sys

OUTAGE_NAMES = frozenset(
    {
        "ConnectionError",
        "TimeoutError",
        "ClusterDownError",
        "TryAgainError",
        "ReadOnlyError",
        "OperationalError",
    }
)
MAX_CHARS = 200


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the store or broker is away (the next try may succeed)."""
    if type(exc).__name__ == "ClusterError" and str(exc).startswith("TTL exhausted"):
        return True  # redirections used up while Cluster slots move
    return isinstance(exc, OSError) or any(c.__name__ in OUTAGE_NAMES for c in type(exc).__mro__)


def warn_failed(log: logging.Logger, message: str, *args: object) -> None:
    """Log the exception being handled: one line for an outage, else with its traceback."""
    warn_of(log, sys.exc_info()[1], message, *args)


def warn_of(log: logging.Logger, exc: BaseException | None, message: str, *args: object) -> None:
    """Log `exc` (one a task or future ended with): one line for an outage, else in full."""
    if exc is not None and is_outage(exc):
        text = " ".join(str(exc).split())[:MAX_CHARS]
        log.warning(message + " (store or broker away: %s: %s)", *args, type(exc).__name__, text)
    else:
        log.warning(message, *args, exc_info=exc)
