"""One assistant turn's tool calls: plain tools, the goal tool, and sub-agents."""

from __future__ import annotations

from typing import Any

from fleet import lifecycle
from fleet.cache import cache_key, delegate_preset
from fleet.errors import ToolError
from fleet.fanout import check_spawn
from fleet.goals import GOAL_TOOL_SCHEMA, apply_goal_action
from fleet.history import SUB_AGENT_TOOLS
from fleet.llm.base import ToolCall
from fleet.models import Event, Message, Trace
from fleet.runtime import Runtime
from fleet.subagents import AGENT_SCHEMA, EVALUATE_SCHEMA, SpawnRequest, spawn
from fleet.tools.base import ToolContext, ToolResult

_GOAL = {
    "type": "function",
    "function": {
        "name": "goal",
        "description": "Manage your plan: add, focus, done, abandon or show goals.",
        "parameters": GOAL_TOOL_SCHEMA,
    },
}


def tool_schemas(runtime: Runtime, trace: Trace) -> list[dict[str, Any]]:
    """The tools this trace's model is offered: what its preset and mode allow."""
    preset = runtime.preset(trace.preset)
    names = runtime.tools.names_for(preset)
    if not runtime.settings.allow_shell:
        names = [n for n in names if n != "bash"]
    schemas = runtime.tools.schemas(names)
    if preset.allows("goal"):
        schemas.append(_GOAL)
    if trace.mode == "main":
        schemas += [
            s for s in (AGENT_SCHEMA, EVALUATE_SCHEMA) if preset.allows(s["function"]["name"])
        ]
    return schemas


def execute_turn(runtime: Runtime, trace: Trace, calls: tuple[ToolCall, ...]) -> bool:
    """Run the calls in order; sub-agents go to the dispatcher last.

    Returns:
        True when every call has its result (the loop goes on), False while waiting.
    """
    spawns: list[SpawnRequest] = []
    for call in calls:
        if call.name in SUB_AGENT_TOOLS:
            try:
                _check_may_spawn(runtime, trace, call)
                if (cached := _cached(runtime, call)) is None:
                    check_spawn(runtime, trace, call)
                    spawns.append(spawn(runtime, trace, call))
                    continue
                result = cached
            except ToolError as exc:
                result = ToolResult(title=f"{call.name} refused", output=str(exc), is_error=True)
        elif call.name == "goal":
            result = _goal(runtime, trace, call)
        else:
            result = _plain(runtime, trace, call)
        _write(runtime, trace, call, result)
    if not spawns:
        return True  # every call above wrote its result
    _dispatch(runtime, trace, spawns)
    return lifecycle.turn_complete(runtime.store, trace.trace_id)


def _dispatch(runtime: Runtime, trace: Trace, spawns: list[SpawnRequest]) -> None:
    # Waiting is written before dispatch: a fast chord may collect before we return.
    # Stopped while this turn's model call ran: the new children start stopped.
    lifecycle.wait(runtime, trace, [c for request in spawns for c in request.child_ids])
    for request in spawns:
        runtime.dispatcher.dispatch(runtime, request)


def _cached(runtime: Runtime, call: ToolCall) -> ToolResult | None:
    """A delegate call answered from the result cache of its preset, if any."""
    found = delegate_preset(call)
    if found is None or found[0] not in runtime.presets:
        return None
    key = cache_key(runtime.preset(found[0]), found[1])
    hit = runtime.store.cache_get(key) if key else None
    if hit is None:
        return None
    return ToolResult(title="agent (cached)", output=hit, metadata={"cached": True})


def _check_may_spawn(runtime: Runtime, trace: Trace, call: ToolCall) -> None:
    """Sub-agents never start sub-agents, and the preset must allow the tool."""
    preset = runtime.preset(trace.preset)
    if trace.mode != "main" or not preset.allows(call.name):
        raise ToolError(
            f"tool {call.name!r} is not allowed for preset {preset.name!r} in a {trace.mode} "
            "trace (sub-agents cannot start sub-agents)"
        )


def _goal(runtime: Runtime, trace: Trace, call: ToolCall) -> ToolResult:
    if not runtime.preset(trace.preset).allows("goal"):
        return ToolResult(title="goal refused", output="tool 'goal' is not allowed", is_error=True)
    tree = trace.goals.model_copy(deep=True)
    try:
        output = apply_goal_action(tree, call.parsed_arguments())
    except (ToolError, ValueError) as exc:
        return ToolResult(title="goal error", output=str(exc), is_error=True)
    runtime.store.update_trace(trace.trace_id, goals=tree)
    return ToolResult(title="goal", output=output)


def _plain(runtime: Runtime, trace: Trace, call: ToolCall) -> ToolResult:
    settings = runtime.settings
    ctx = ToolContext(
        workspace=runtime.workspace_of(trace),  # ConfigError outside the roots: trace fails
        trace_id=trace.trace_id,
        preset=trace.preset,
        allow_shell=settings.allow_shell,
        skills_dirs=tuple(p for p in (settings.skills_dir,) if p is not None),
        shell_env=settings.shell_env,
        web_allow=settings.web_allow,
        tool_timeout_s=settings.tool_timeout_s,
    )
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        return ToolResult(title=f"{call.name} error", output=f"bad arguments: {exc}", is_error=True)
    result = runtime.tools.execute(call.name, arguments, ctx, runtime.preset(trace.preset))
    runtime.hooks.tool_finished(trace, call.name, result)
    return result


def _write(runtime: Runtime, trace: Trace, call: ToolCall, result: ToolResult) -> None:
    event = Event(
        kind="message",
        trace_id=trace.trace_id,
        data={"role": "tool", "tool": call.name, "is_error": result.is_error},
    )
    runtime.store.record_turn(
        trace.root_trace_id,
        Message(
            trace_id=trace.trace_id,
            role="tool",
            tool_call_id=call.id,
            name=call.name,
            content=result.output,
            long_term_memory=result.long_term_memory,
            metadata={"title": result.title, "is_error": result.is_error},
        ),
        event,
    )
