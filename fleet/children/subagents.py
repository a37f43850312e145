"""The `agent` and `evaluate` tools: turning a call into child traces for a dispatcher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet import ids, lifecycle
from fleet.batchapi.route import routed
from fleet.children.cache import CacheScope, cache_key
from fleet.children.reopen import reopen
from fleet.children.schemas import AGENT_SCHEMA as AGENT_SCHEMA
from fleet.children.schemas import EVALUATE_SCHEMA as EVALUATE_SCHEMA
from fleet.children.warming import warms
from fleet.conversation.continuation import turn_of
from fleet.errors import ToolError
from fleet.goals import GoalTree
from fleet.llm.base import ToolCall
from fleet.memory.config import MEMORY_TOOLS
from fleet.models import DomainLayer, Mode, ToolCeiling, Trace
from fleet.presets.preset import AgentPreset
from fleet.remote.spawn import (
    check_may_call,
    new_call,
    offered_schema,
)
from fleet.runstate import RunState
from fleet.runtime import Runtime, SpawnRequest
from fleet.storage.writes import TraceWrite


def sub_agent_schemas(runtime: Runtime, trace: Trace, preset: AgentPreset) -> list[dict[str, Any]]:
    """`agent` and `evaluate` as a main trace with these permissions is offered them.

    `agent`'s remote agents are those the trace may call (`fleet.remote.spawn`).
    """
    offered = (EVALUATE_SCHEMA,) if preset.read_only else (AGENT_SCHEMA, EVALUATE_SCHEMA)
    allowed = [s for s in offered if preset.allows(s["function"]["name"])]
    return [offered_schema(runtime, trace, s) if s is AGENT_SCHEMA else s for s in allowed]


def spawn(
    runtime: Runtime,
    parent: Trace,
    call: ToolCall,
    *,
    write: TraceWrite | None = None,
    goals: GoalTree | None = None,
    outbox: tuple[str, int] | None = None,
) -> SpawnRequest:
    """Create (or reopen) the child traces of an `agent`/`evaluate` call.

    `write`: the parent's write of this turn, not applied yet: the children's entries (and
    the plan linking them) join it, to be applied with it; without one they are applied here.
    `goals`: the parent's plan as the caller knows it is now; None: read anew.
    `outbox`: the spawn's outbox entry and due ms, put in the step that creates the children.

    Raises:
        ToolError: Bad arguments; the message goes back to the model.
    """
    try:
        args = call.parsed_arguments()
    except ValueError as exc:
        raise ToolError(f"{call.name}: arguments are not a JSON object ({exc})") from None
    if args.get("continue_from"):
        if outbox is not None:
            runtime.store.outbox_put(*outbox)
        children = [reopen(runtime, parent, call, args)]
    elif call.name == "evaluate":
        children = [_evaluate_child(runtime, parent, call.id, args, outbox)]
    else:
        children = _agent_children(runtime, parent, call.id, args, outbox)
    entries = write or TraceWrite(parent.trace_id, parent.root_trace_id)  # one step
    for child in children:
        lifecycle.announce(runtime, parent, child, entries)
    if (linked := _linked_goals(runtime, parent, call, args, children, goals)) is not None:
        entries.update(goals=linked)
    if write is None:
        runtime.store.apply(entries)
    return SpawnRequest(
        parent_trace_id=parent.trace_id,
        root_trace_id=parent.root_trace_id,
        tool_call_id=call.id,
        tool_name=call.name,
        mode=children[0].mode,
        children=tuple(children),
        scheduled=parent.run.scheduled if parent.trace_id == parent.root_trace_id else None,
    )


def _linked_goals(
    runtime: Runtime,
    parent: Trace,
    call: ToolCall,
    args: dict[str, Any],
    children: list[Trace],
    known: GoalTree | None,
) -> GoalTree | None:
    """The parent's plan with these children linked to their goal; None if there is none.

    The goal is evaluate's `target_goal_id`, else the focused one. The plan is read
    again unless `known` (a copy is linked): a `goal` call earlier in the same turn may
    have changed it.
    """
    if known is not None and not known.goals:
        return None  # no plan: nothing to link, and nothing to copy
    goals = (
        known.model_copy(deep=True)
        if known is not None
        else runtime.store.get_trace(parent.trace_id).goals
    )
    target = args.get("target_goal_id") if call.name == "evaluate" else None
    goal_id = str(target or goals.focus_id or "")
    if not goal_id or goal_id not in {g.id for g in goals.goals}:
        return None
    goals.link(goal_id, [c.trace_id for c in children])
    return goals


def _agent_children(
    runtime: Runtime,
    parent: Trace,
    call_id: str,
    args: dict[str, Any],
    outbox: tuple[str, int] | None,
) -> list[Trace]:
    task = args.get("task")
    messages = args.get("messages")
    common = {"skills": list(args.get("skills") or []), "extra": args.get("context")}
    common["outbox"] = outbox
    common["ceiling"] = _ceiling_fields(runtime, parent)
    if args.get("agent") is not None or args.get("agent_url") is not None:
        return _remote_children(runtime, parent, call_id, args, common)
    if isinstance(task, str) and task.strip():
        preset = str(args.get("agent_type") or "default")
        _check_preset(runtime, parent, preset)
        chosen = runtime.preset(preset)
        if key := delegate_cache_key(runtime, parent, preset, args):
            common["cache"] = {"cache_key": key, "cache_ttl_s": chosen.cache_ttl_s}
        spec = _ChildSpec("delegate", preset, task, None, messages)
        return [_child(runtime, parent, call_id, spec, common)]
    if isinstance(task, list) and task and all(isinstance(t, str) and t for t in task):
        # An explore branch is read-only by its mode (`READ_ONLY_MODES`), whatever preset
        # it runs: `agent_type: analyst` gives the branches web_search, never a write.
        branch_preset = str(args.get("agent_type") or "explore")
        _check_preset(runtime, parent, branch_preset)
        common["warm"] = warms(runtime.preset(parent.preset), runtime.config.warm_explore)
        per_branch = _branch_messages(messages, len(task))
        specs = [
            _ChildSpec("explore", branch_preset, t, i, messages)
            for i, (t, messages) in enumerate(zip(task, per_branch, strict=True), start=1)
        ]
        return _children(runtime, parent, call_id, specs, common)
    raise ToolError("agent: `task` must be a non-empty string or a list of non-empty strings")


def _remote_children(
    runtime: Runtime, parent: Trace, call_id: str, args: dict[str, Any], common: dict[str, Any]
) -> list[Trace]:
    """Children on a remote agent: one for a task, one per item (read-only agents only)."""
    if args.get("agent_url") is not None:
        raise ToolError("agent: `agent_url` is refused: remote agents are named in fleet.yaml")
    task, messages = args.get("task"), args.get("messages")
    if isinstance(task, str) and task.strip():
        common["remote"] = check_may_call(runtime, parent, args.get("agent"), read_only=False)
        return [
            _child(
                runtime,
                parent,
                call_id,
                _ChildSpec("remote", "default", task, None, messages),
                common,
            )
        ]
    if isinstance(task, list) and task and all(isinstance(t, str) and t for t in task):
        common["remote"] = check_may_call(runtime, parent, args.get("agent"), read_only=True)
        per_branch = _branch_messages(messages, len(task))
        specs = [
            _ChildSpec("remote", "default", t, i, m)
            for i, (t, m) in enumerate(zip(task, per_branch, strict=True), start=1)
        ]
        return _children(runtime, parent, call_id, specs, common)
    raise ToolError("agent: `task` must be a non-empty string or a list of non-empty strings")


def _check_preset(runtime: Runtime, parent: Trace, preset: str) -> None:
    if preset not in runtime.presets:
        known = ", ".join(sorted(runtime.presets))
        raise ToolError(f"agent: unknown agent_type {preset!r} (known: {known})")
    if runtime.permissions(parent).read_only and not runtime.preset(preset).read_only:
        raise ToolError(
            f"agent: this trace is read-only and may start only read-only sub-agents;"
            f" preset {preset!r} can write"
        )


def child_ceiling(runtime: Runtime, parent: Trace) -> ToolCeiling:
    """What a child of `parent` may do at most: everything the parent may, nothing more."""
    allowed = runtime.permissions(parent)
    tools = None if allowed.allowed_tools is None else sorted(allowed.allowed_tools)
    mcp = None if allowed.mcp_servers is None else sorted(allowed.mcp_servers)
    web: list[DomainLayer] = []
    for rules in runtime.web_filter(parent).layers[1:]:  # [0] is fleet.yaml's, read anew
        layer = DomainLayer(
            allow=None if rules.allow is None else list(rules.allow), deny=list(rules.deny)
        )
        if layer not in web:
            web.append(layer)
    # Memory tools the parent may not call: a child (a delegated `recorder`) gets none of them.
    memory_denied = MEMORY_TOOLS - allowed.memory.tools()
    return ToolCeiling(
        allowed=tools,
        denied=sorted(allowed.denied_tools | memory_denied),
        read_only=allowed.read_only,
        mcp=mcp,
        web=web,
    )


def child_model(runtime: Runtime, parent: Trace, preset: str) -> str | None:
    """The child's model: its preset's `model:`, fleet.yaml's override for it, the parent's."""
    chosen = runtime.preset(preset)
    return chosen.model or runtime.config.model_overrides.get(preset) or parent.model


def delegate_cache_key(
    runtime: Runtime, parent: Trace, preset: str, args: dict[str, Any]
) -> str | None:
    """The cache key of a delegate call from `parent`, or None if its preset does not cache.

    Everything that changes the answer is in it: the workspace, the child's model and
    tool ceiling, the preset's whole content and the call's chosen arguments.
    """
    return cache_key(
        runtime.preset(preset),
        args,
        CacheScope(
            workspace=parent.workspace or str(runtime.settings.workspace),
            model=child_model(runtime, parent, preset) or "",
            ceiling=child_ceiling(runtime, parent).model_dump_json(),
        ),
    )


def _branch_messages(messages: Any, branches: int) -> list[Any]:
    """1-D messages are shared by every branch; 2-D give one list per branch."""
    if not messages:
        return [None] * branches
    if not isinstance(messages, list):
        raise ToolError("agent: `messages` must be a list")
    if all(isinstance(m, list) for m in messages):
        if len(messages) != branches:
            raise ToolError(f"agent: {len(messages)} message lists for {branches} tasks")
        return list(messages)
    return [messages] * branches


def _evaluate_child(
    runtime: Runtime,
    parent: Trace,
    call_id: str,
    args: dict[str, Any],
    outbox: tuple[str, int] | None,
) -> Trace:
    goal_id = args.get("target_goal_id") or parent.goals.focus_id
    goal = parent.goals.get(str(goal_id)).description if goal_id else parent.task
    task = (
        f"Evaluate whether this goal has been met.\n\nGoal: {goal}\n\n"
        "Inspect the workspace and the messages given. Answer with a line "
        "`VERDICT: pass` or `VERDICT: fail`, then concrete suggestions."
    )
    common: dict[str, Any] = {"skills": [], "extra": args.get("context"), "outbox": outbox}
    common["ceiling"] = _ceiling_fields(runtime, parent)
    spec = _ChildSpec("evaluate", "evaluate", task, None, args.get("messages"))
    return _child(runtime, parent, call_id, spec, common)


@dataclass(frozen=True)
class _ChildSpec:
    """What differs between the children of one call."""

    mode: Mode
    preset: str
    task: str
    index: int | None
    messages: Any


def _child(
    runtime: Runtime,
    parent: Trace,
    call_id: str,
    spec: _ChildSpec,
    common: dict[str, Any],
    first_attempt: int = 1,
) -> Trace:
    for attempt in range(first_attempt, 100):
        trace = _child_trace(runtime, parent, call_id, spec, common, attempt)
        # The outbox entry with the first attempt (a sibling's id taken: put already).
        if runtime.store.create_traces([trace], common.get("outbox"))[0]:
            return trace
        # a sibling (or a retry of this call) took the id: next attempt
    raise ToolError(f"{spec.mode}: could not allocate a sub-trace id")


def _children(
    runtime: Runtime,
    parent: Trace,
    call_id: str,
    specs: list[_ChildSpec],
    common: dict[str, Any],
) -> list[Trace]:
    """Create the children in one step; an id already taken tries the next attempt number."""
    traces = [_child_trace(runtime, parent, call_id, spec, common, 1) for spec in specs]
    created = runtime.store.create_traces(traces, common.get("outbox"))
    return [
        trace if ok else _child(runtime, parent, call_id, spec, common, first_attempt=2)
        for trace, ok, spec in zip(traces, created, specs, strict=True)
    ]


def _child_trace(
    runtime: Runtime,
    parent: Trace,
    call_id: str,
    spec: _ChildSpec,
    common: dict[str, Any],
    attempt: int,
) -> Trace:
    mode, preset, index = spec.mode, spec.preset, spec.index
    name = f"{mode}-{index:03d}" if index is not None else mode
    if mode == "delegate" and preset != "default":
        name = preset
    if mode == "remote":  # the remote agent's name, numbered in a list
        name = common["remote"] + (f"-{index:03d}" if index is not None else "")
    context: dict[str, Any] = {}
    if spec.messages:
        context["messages"] = _check_messages(spec.messages)
    if common.get("extra"):
        context["extra"] = common["extra"]
    model = child_model(runtime, parent, preset)
    return Trace(
        trace_id=ids.child_id(parent.trace_id, mode, index, attempt),
        root_trace_id=parent.root_trace_id,
        parent_trace_id=parent.trace_id,
        mode=mode,
        task=spec.task,  # masked by toolcalls._persisted
        name=name,
        preset=preset,
        model=model,
        workspace=parent.workspace,
        parent_tool_call_id=call_id,
        context=context,
        skills=common.get("skills") or [],
        run=_run_state(runtime, parent, call_id, common, index),
        ceiling=common["ceiling"],  # fields, validated into each child's own ToolCeiling
        memory=list(parent.memory),  # the submitter's binding, never the model's
    )


def _ceiling_fields(runtime: Runtime, parent: Trace) -> dict[str, Any]:
    """`child_ceiling` as the fields every child of one call is given, worked out once.

    A dict, not the model: each child validates its own `ToolCeiling` (and lists) from it,
    so no two children share a mutable ceiling.
    """
    return child_ceiling(runtime, parent).model_dump()


def _check_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        raise ToolError("`messages` items must be objects with a string `content`")
    return [{"role": str(m.get("role", "user")), "content": m["content"]} for m in messages]


def _run_state(
    runtime: Runtime, parent: Trace, call_id: str, common: dict[str, Any], index: int | None
) -> RunState:
    """A new child's run state: cache key, tracing context, turn, cache warming (`warming`).

    A continued root's tasks are stamped with its turn; a batch tree's sub-agents call their
    models through batches too; a remote child gets its call, nothing sent yet.
    """
    cache = common.get("cache") or {}
    return RunState(
        cache_key=cache.get("cache_key"),
        cache_ttl_s=cache.get("cache_ttl_s"),
        warm_after_first=bool(common.get("warm") and index is not None and index > 1),
        otel=runtime.hooks.child_context(parent, call_id) or None,
        turn=turn_of(parent),
        batch_api=routed(parent),
        remote_call=new_call(common.get("remote")),
    )
