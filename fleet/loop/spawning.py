"""A turn's `agent` and `evaluate` calls: the children they spawn, and handing them over.

A call is refused (sub-agents start no sub-agents, the tree's caps), answered from the
result cache, or creates its children; those are recorded in the outbox first when a task
queue runs them, and dispatched once the parent's wait is written (a stop that landed
meanwhile drops them: no child is created after a stop).
"""

from __future__ import annotations

import logging

from fleet import lifecycle
from fleet.children.cache import delegate_preset
from fleet.children.subagents import delegate_cache_key, spawn
from fleet.errors import ToolError
from fleet.goals import GoalTree
from fleet.limits.fanout import check_spawn
from fleet.llm.base import ToolCall
from fleet.models import Trace, now_ms
from fleet.runtime import Runtime, SpawnRequest
from fleet.storage import outbox
from fleet.storage.outage import warn_failed
from fleet.storage.writes import TraceWrite, WriteResult
from fleet.tools.base import ToolResult

log = logging.getLogger(__name__)


def sub_agents(
    runtime: Runtime,
    trace: Trace,
    call: ToolCall,
    write: TraceWrite | None = None,
    goals: GoalTree | None = None,
) -> SpawnRequest | ToolResult:
    """Children to dispatch, or the result at once (cached answer, refusal).

    `write`: the turn's write, which the children's entries join (`spawn`); `goals`: the
    trace's plan as it is now (None: read anew, a `goal` call of this turn changed it).
    """
    try:
        _check_may_spawn(runtime, trace, call)
        if (cached := _cached(runtime, trace, call)) is not None:
            return cached
        widest = runtime.preset(trace.preset).max_branches or runtime.settings.max_branches
        check_spawn(trace, call, max_branches=widest, budgets=runtime.gate.budgets)
        return _spawn(runtime, trace, call, write, goals)
    except ToolError as exc:
        return ToolResult(title=f"{call.name} refused", output=str(exc), is_error=True)


def _spawn(
    runtime: Runtime,
    trace: Trace,
    call: ToolCall,
    write: TraceWrite | None,
    goals: GoalTree | None,
) -> SpawnRequest:
    """Create the children, recorded in the outbox in that step when a task queue runs them.

    If this process dies (or the broker refuses the chord) between creating the children
    and handing them over, a sweeper finds the entry and dispatches them (`fleet.storage.outbox`).
    """
    if not runtime.dispatcher.children_survive_restart:
        return spawn(runtime, trace, call, write=write, goals=goals)
    entry = outbox.spawn_entry(trace.trace_id, call.id)
    due = now_ms() + runtime.settings.lease_ttl_ms
    try:
        return spawn(runtime, trace, call, write=write, goals=goals, outbox=(entry, due))
    except ToolError:
        runtime.store.outbox_done(entry)  # no child was created
        raise


def dispatch(
    runtime: Runtime,
    trace: Trace,
    spawns: list[tuple[ToolCall, SpawnRequest]],
    written: WriteResult | None = None,
) -> None:
    """Write the parent's wait on its new children, then hand them over (or drop them).

    The wait is written before dispatch: a fast chord may collect before we return.
    `written`: the turn's write, which carried the wait (`lifecycle.wait_in`) and read the
    stop flag. Stopped while this turn's model call ran: the trace and its new children
    end stopped.
    """
    stopped = lifecycle.wait(runtime, trace, written).is_terminal
    for call, request in spawns:
        if stopped:
            _drop(runtime, trace, request)
        else:
            _hand_over(runtime, trace, request)
            for child in request.children:
                runtime.hooks.child_spawned(trace, child)
        runtime.hooks.tool_finished(trace, call, None)


def _drop(runtime: Runtime, trace: Trace, request: SpawnRequest) -> None:
    """Children born stopped are not sent; their outbox entry, if any, is done."""
    if runtime.dispatcher.children_survive_restart:
        runtime.store.outbox_done(outbox.spawn_entry(trace.trace_id, request.tool_call_id))


def _hand_over(runtime: Runtime, trace: Trace, request: SpawnRequest) -> None:
    """Dispatch; on a task queue, a refused chord stays in the outbox for a sweeper."""
    if not runtime.dispatcher.children_survive_restart:
        runtime.dispatcher.dispatch(runtime, request)
        return
    try:
        runtime.dispatcher.dispatch(runtime, request)
    except Exception:  # the broker refused: the outbox entry stays, a sweeper sends them
        count = len(request.children)
        # a store or broker away (a restart, a failover) in one line; anything else with its
        # traceback
        warn_failed(
            log, "dispatch of %d children of %r failed; a sweeper will retry", count, trace.trace_id
        )
        return
    runtime.store.outbox_done(outbox.spawn_entry(trace.trace_id, request.tool_call_id))


def _cached(runtime: Runtime, trace: Trace, call: ToolCall) -> ToolResult | None:
    """A delegate call answered from the result cache of its preset, if any."""
    found = delegate_preset(call)
    if found is None or found[0] not in runtime.presets:
        return None
    key = delegate_cache_key(runtime, trace, found[0], found[1])
    hit = runtime.store.cache_get(key) if key else None
    if hit is None:
        return None
    return ToolResult(title="agent (cached)", output=hit, metadata={"cached": True})


def _check_may_spawn(runtime: Runtime, trace: Trace, call: ToolCall) -> None:
    """Sub-agents never start sub-agents, and the trace's permissions must allow the tool."""
    preset = runtime.permissions(trace)
    if trace.mode != "main" or not preset.allows(call.name):
        raise ToolError(
            f"tool {call.name!r} is not allowed for preset {preset.name!r} in a {trace.mode} "
            "trace (sub-agents cannot start sub-agents)"
        )
