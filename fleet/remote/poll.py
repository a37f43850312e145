"""Every worker's poll of the parked remote children (`poll_due`, run by its sweeper).

Each entry of the watch list that is due is taken by one poller (`RemoteWatch.due`), its
task's state read once (at most `wire.CALL_TIMEOUT_S`), and `run.apply` writes what it
means; the ids returned are the children whose task ended, for the host to send to a
worker (the run that finishes the child and settles its parent). A child that ended here
already (`fleet stop`, the tree's budget) has its remote task cancelled and leaves the list.
"""

from __future__ import annotations

import logging

from fleet.config.remote_agents import RemoteAgentConfig
from fleet.errors import FleetError, TraceNotFound
from fleet.lifecycle.remote import call_of
from fleet.models import now_ms
from fleet.remote import run
from fleet.remote.decide import AskPerson, Ended
from fleet.runtime import Runtime
from fleet.storage.remote_watch import REMOTE_WATCH, RemoteWatch

log = logging.getLogger(__name__)

POLLS_PER_SWEEP = 16
"""Most remote tasks one sweep asks about (each at most a few seconds)."""
CLAIM_MS = 60_000
"""A taken entry is due again after this if its poller died mid-poll."""


def poll_due(runtime: Runtime, limit: int = POLLS_PER_SWEEP) -> list[str]:
    """Poll the due entries; the children to send to a worker (their task ended)."""
    watch = runtime.store.capability(REMOTE_WATCH)
    ended = []
    for trace_id in watch.due(now_ms(), limit, CLAIM_MS):
        try:
            if poll_one(runtime, watch, trace_id):
                ended.append(trace_id)
        except FleetError as exc:  # one child's trouble never stops the others' polls
            log.warning("poll of remote child %r: %s", trace_id, exc)
    return ended


def poll_one(runtime: Runtime, watch: RemoteWatch, trace_id: str) -> bool:
    """Poll one child's task; True when the child is to be run (its task ended)."""
    try:
        trace = runtime.store.get_trace(trace_id)
    except TraceNotFound:
        watch.forget(trace_id)
        return False
    call = call_of(trace)
    if call is None or call.task_id is None:
        watch.forget(trace_id)
        return False
    again_ms = now_ms() + int(runtime.settings.remote_poll_s * 1000)
    agent: RemoteAgentConfig | None = None
    token: str | None = None
    try:
        agent, token = run.agent_of(runtime, call)
    except FleetError:
        pass  # gone from fleet.yaml: no cancel is possible, the child fails below
    if trace.is_terminal:  # stopped or cut while it waited: the remote task goes too
        if agent is not None:
            run.cancel_task(agent, token, call)
        watch.forget(trace_id)
        return False
    if trace.status != "waiting" or call.state != "sent":
        watch.watch(trace_id, again_ms)  # a run holds it, or a person: look again later
        return False
    if agent is None:  # left fleet.yaml (or lost its token) while it waited: a run fails it
        watch.forget(trace_id)
        run.apply(runtime, trace, run.gone(call))
        return True
    decision = run.observe(agent, token, call)
    if _ended_meanwhile(runtime, trace_id):  # a stop landed during the poll
        run.cancel_task(agent, token, call)
        watch.forget(trace_id)
        return False
    run.apply(runtime, trace, decision)
    if isinstance(decision, Ended | AskPerson):
        watch.forget(trace_id)
        return isinstance(decision, Ended)
    watch.watch(trace_id, again_ms)
    return False


def _ended_meanwhile(runtime: Runtime, trace_id: str) -> bool:
    try:
        return runtime.store.get_trace(trace_id).status != "waiting"
    except TraceNotFound:
        return True
