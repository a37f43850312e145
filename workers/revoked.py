"""A fleet run discarded as revoked raises its trace's stop flag again.

Only `Fleet.stop` revokes fleet tasks: by the stamps of the stopped subtree's ids for the
root's turn (`workers.dispatch.stamps`), which every worker keeps in memory until it
restarts. A run of that turn that a worker discards therefore belongs to a trace told to
stop. Its flag is normally there already; it is not when a Redis SIGKILL took the stop's
last second of writes (append-only file, fsync every second) while the workers kept the
stamps: the trace is back `running` (or `waiting`) without its flag, every re-send of it is
discarded, and the owner check re-sent it until it failed as lost. Raising the flag again
here lets the owner check end it `stopped` (`fleet.owners.Stop`), as the stop meant.

A run of another turn (a stale task of a root continued since) raises nothing: the turn
stamped on the task no longer is the trace's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.conversation.continuation import stamp, turn_of
from fleet.errors import TraceNotFound
from fleet.runtime import Runtime

log = logging.getLogger(__name__)

RUN_TASKS = frozenset({"fleet.run_agent", "fleet.resume_agent"})
"""The tasks that run a trace (their first argument is its id)."""


def stop_revoked(
    runtime: Runtime, task: str, args: Sequence[Any], stamps: Mapping[str, Any]
) -> bool:
    """Raise the stop flag of the trace whose run `task` was discarded; True if raised.

    `stamps`: the discarded task's stamped headers (`root_trace_id` names the turn).
    """
    if task not in RUN_TASKS or not args:
        return False
    trace_id = str(args[0])
    try:
        trace = runtime.store.get_trace(trace_id)
    except TraceNotFound:  # expired, or lost with the rest of that second
        return False
    if trace.is_terminal or stamps.get("root_trace_id") != stamp(
        trace.root_trace_id, turn_of(trace)
    ):
        return False
    runtime.store.request_stop(trace_id)
    log.info("%s: its run was discarded as revoked; its stop flag is raised", trace_id)
    return True
