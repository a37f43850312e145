"""One assistant turn's tool calls: plain tools, the goal tool, and sub-agents."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from weakref import WeakKeyDictionary

from fleet import lifecycle
from fleet.children import settling
from fleet.children.subagents import sub_agent_schemas
from fleet.config.mcp_names import PREFIX as MCP_PREFIX
from fleet.config.mcp_names import server_of
from fleet.conversation import approval
from fleet.conversation import messages as inbox
from fleet.conversation.between import SEND_MESSAGE, SEND_MESSAGE_SCHEMA, may_send, send_message
from fleet.conversation.human import ASK_HUMAN, ASK_HUMAN_SCHEMA, ask, may_ask, question_of
from fleet.errors import HookBlocked, ToolError
from fleet.goals import GOAL_TOOL_SCHEMA, apply_goal_action
from fleet.history import SUB_AGENT_TOOLS
from fleet.lifecycle.recorder import note_tool_failure
from fleet.llm.base import ToolCall
from fleet.llm.timing import wall_ms
from fleet.loop import memory_calls
from fleet.loop.cut import stoppable
from fleet.loop.results import write_result
from fleet.loop.spawning import dispatch, sub_agents
from fleet.loop.steps import OnApproval, OnChildren, OnPerson
from fleet.memory.config import MEMORY_TOOLS
from fleet.models import Trace
from fleet.runtime import Runtime, SpawnRequest
from fleet.storage.writes import Append, InboxSeen, TraceWrite, WriteResult
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.registry import ToolRegistry

_GOAL = {
    "type": "function",
    "function": {
        "name": "goal",
        "description": "Manage your plan: add, focus, done, abandon or show goals.",
        "parameters": GOAL_TOOL_SCHEMA,
    },
}


log = logging.getLogger(__name__)

_SCHEMAS: WeakKeyDictionary[ToolRegistry, dict[tuple[Any, ...], list[dict[str, Any]]]]
_SCHEMAS = WeakKeyDictionary()


@dataclass(frozen=True)
class ToolTurn:
    """How one assistant turn's tool calls ended."""

    wait: OnPerson | OnApproval | OnChildren | None
    """What the run ends waiting on (a person, an approval, sub-agents still running); None:
    it goes on."""
    written: WriteResult | None
    """The results as written in one step (with the stop flag), when they are the only
    change to the trace; None when something else changed it too (a spawn, a goal), so
    the runner reads it again."""


@dataclass(frozen=True)
class Offered:
    """The tools a trace's model is offered, as a run builds them once (`offered`).

    Only `check_messages` may change between turns: offered once mail came, unless the
    preset offers it always or denies it (then `plain` is `mailed`).
    """

    plain: tuple[dict[str, Any], ...]
    """The schemas while the trace's inbox is empty."""
    mailed: tuple[dict[str, Any], ...]
    """The schemas once a message came (entries are never removed)."""
    generation: int
    """The registry's generation they were built at (an MCP server's tools change in place)."""


def offered(runtime: Runtime, trace: Trace) -> Offered:
    """The tools this trace's model is offered: what its preset and mode allow.

    The registry's schemas are deep-copied once per registry and tool set, not per run;
    the dicts are shared between turns and threads, so callers must not change them.
    """
    preset = runtime.permissions(trace)
    runtime.sync_mcp_tools(preset.mcp_servers)  # waits for no listing of a server it can't use
    generation = runtime.tools.generation
    names = tuple(runtime.tools.names_for(preset))
    if not runtime.settings.allow_shell:
        names = tuple(n for n in names if n != "bash")
    cached = _SCHEMAS.setdefault(runtime.tools, {})
    key = (generation, *names)
    if key not in cached:
        if len(cached) >= 256:  # older generations are never asked again
            cached.clear()
        cached[key] = runtime.tools.schemas(names)
    schemas = list(cached[key])
    if preset.allows("goal"):
        schemas.append(_GOAL)
    schemas += [memory_calls.SCHEMAS[name] for name in memory_calls.offered(preset, trace)]
    if trace.mode == "main":
        # `agent` delegates to writing presets by default: a read-only trace is not offered
        # it (and `spawn` refuses a writing child if the model calls it anyway).
        schemas += sub_agent_schemas(runtime, trace, preset)
    if may_ask(preset, trace):
        schemas.append(ASK_HUMAN_SCHEMA)
    last = [SEND_MESSAGE_SCHEMA] if may_send(runtime, trace) else []
    plain = (*schemas, *last)
    mailed = (*schemas, inbox.CHECK_MESSAGES_SCHEMA, *last)
    match inbox.mail_offer(runtime, trace):
        case "always":
            return Offered(mailed, mailed, generation)
        case "never":
            return Offered(plain, plain, generation)
        case "if_mail":
            return Offered(plain, mailed, generation)


def tool_schemas(
    runtime: Runtime, trace: Trace, seen: InboxSeen | None = None
) -> list[dict[str, Any]]:
    """The tools this trace's model is offered now (`offered`, and whether mail came).

    `seen`: the inbox as the run's last round trip read it (None: it is counted here).
    """
    found = offered(runtime, trace)
    mailed = found.plain is not found.mailed and inbox.got_mail(runtime, trace, seen)
    return list(found.mailed if mailed else found.plain)


def execute_turn(
    runtime: Runtime,
    trace: Trace,
    calls: tuple[ToolCall, ...],
    turn: TraceWrite | None = None,
    *,
    pauses: Sequence[str] = (),
) -> ToolTurn:
    """Run the calls in order, write their results in one step; sub-agents go last.

    A question to a person (`ask_human`), or a call that waits for approval, is put after
    every other result is written (one per turn). An operator's hook may block any call.
    `turn`: the model turn's own write, not applied yet; the results join it (one step).
    `pauses`: provider pause keys the results' write reads for the next model call.

    Returns:
        Whether the run waits on sub-agents or a person, and what was written.
    """
    spawns: list[tuple[ToolCall, SpawnRequest]] = []
    results = (turn or TraceWrite(trace.trace_id, trace.root_trace_id)).read_pauses(pauses)
    results.read_inbox()  # for the next call's `## Messages` and tools, with no read of its own
    person: tuple[ToolCall, str | None] | None = None  # a question, or an approval (None)
    for at, call in enumerate(calls):
        started_ms = wall_ms()  # its span: to the result's message (written at its end)
        planned = any(c.name == "goal" for c in calls[:at])  # the plan changed: read it
        outcome = _one_call(runtime, trace, call, results, first=person is None, planned=planned)
        if isinstance(outcome, SpawnRequest):
            spawns.append((call, outcome))
        elif isinstance(outcome, ToolResult):
            write_result(runtime, results, call, outcome, started_at_ms=started_ms)
            runtime.hooks.tool_finished(trace, call, outcome)
            if outcome.is_error and outcome.title.endswith(" failed") and trace.memory:
                note_tool_failure(runtime, trace, call.name, outcome.output)
        else:
            person = (call, outcome.question)
    if spawns and person is None:  # the wait on them goes with the turn, stop flag read
        lifecycle.wait_in(trace, results)
    written = runtime.store.apply(results) if results.ops else None
    waits = _wait_on_person(runtime, trace, *person) if person is not None else None
    runtime.hooks.turn_ended(trace, trace.iteration)
    if not spawns:
        changed = any(call.name == "goal" for call in calls)  # the goal tool wrote the trace
        return ToolTurn(waits, None if changed or waits else written)
    dispatch(runtime, trace, spawns, written if person is None else None)
    if settling.turn_complete(runtime.store, trace.trace_id):
        return ToolTurn(waits, None)
    return ToolTurn(waits or OnChildren(tuple(call.id for call, _ in spawns)), None)


@dataclass(frozen=True)
class _Person:
    """The call waits on a person once the turn's other results are written."""

    question: str | None
    """The `ask_human` question; None for a call that waits for approval."""


def _one_call(
    runtime: Runtime,
    trace: Trace,
    call: ToolCall,
    results: TraceWrite,
    *,
    first: bool,
    planned: bool = False,
) -> ToolResult | SpawnRequest | _Person:
    """One call of the turn: its result, children to dispatch, or a wait on a person.

    `results`: the turn's results so far (a second `check_messages` reads on from them; a
    spawn's entries join them). `planned`: a `goal` call earlier in the turn wrote the plan.
    """
    try:
        runtime.hooks.tool_started(trace, call)
    except HookBlocked as exc:
        text = f"blocked by the operator's policy: {exc.reason}"
        return ToolResult(title=f"{call.name} blocked", output=text, is_error=True)
    if call.name == inbox.CHECK_MESSAGES:
        pending = [op.message for op in results.ops if isinstance(op, Append)]
        return inbox.check_messages(runtime, trace, runtime.store.messages(trace.trace_id), pending)
    if call.name == SEND_MESSAGE:
        return send_message(runtime, trace, _persisted(runtime, call))
    if call.name == ASK_HUMAN:
        asked = _question(runtime, trace, _persisted(runtime, call), first=first)
        return _Person(asked) if isinstance(asked, str) else asked
    if call.name in SUB_AGENT_TOOLS:
        goals = None if planned else trace.goals
        return sub_agents(runtime, trace, _persisted(runtime, call), results, goals)
    if call.name == "goal":
        return _goal(runtime, trace, _persisted(runtime, call))
    if call.name in MEMORY_TOOLS:  # the tree's bound namespaces, never one the model names
        return memory_calls.run(runtime, trace, call)
    if approval.required(runtime, trace, call):
        children_wait = runtime.dispatcher.children_survive_restart
        refused = approval.refusal(call, trace, first=first, children_wait=children_wait)
        return refused or _Person(None)
    return run_plain(runtime, trace, call)


def _wait_on_person(
    runtime: Runtime, trace: Trace, call: ToolCall, question: str | None
) -> OnPerson | OnApproval:
    waits: OnPerson | OnApproval
    if question is None:
        approval.request(runtime, trace, call)
        waits = OnApproval(call.id)
    else:
        ask(runtime, trace, call.id, question)
        waits = OnPerson(call.id)
    runtime.hooks.tool_finished(trace, call, None)
    return waits


def plain_only(runtime: Runtime, trace: Trace, calls: tuple[ToolCall, ...]) -> bool:
    """Whether a model turn may be stored with its tools' results, in one step.

    For a read-only trace whose calls are all plain tools: a crash while they run loses
    the model turn too, and the run calls the model again, which changes nothing outside.
    A turn that may write, spawn, plan or ask is stored before its tools run, so that a
    crash leaves its calls to be healed on resume instead.
    """
    special = SUB_AGENT_TOOLS | {ASK_HUMAN, "goal", SEND_MESSAGE}  # a send is not undone
    return runtime.permissions(trace).read_only and not any(c.name in special for c in calls)


def _question(runtime: Runtime, trace: Trace, call: ToolCall, *, first: bool) -> str | ToolResult:
    """The question to put to a person, or a refusal (one question per turn)."""
    if not first:
        return ToolResult(title="ask_human refused", output="one question per turn", is_error=True)
    return question_of(runtime, trace, call)


def _persisted(runtime: Runtime, call: ToolCall) -> ToolCall:
    """The call with the worker's secrets masked in its arguments.

    For the calls whose arguments are stored rather than run: a child's task, messages
    and context, a goal's description. The model wrote them; what it learnt of our
    secrets is not kept.
    """
    arguments = runtime.redactor.values_only(call.arguments)
    return call if arguments == call.arguments else replace(call, arguments=arguments)


def _goal(runtime: Runtime, trace: Trace, call: ToolCall) -> ToolResult:
    if not runtime.permissions(trace).allows("goal"):
        return ToolResult(title="goal refused", output="tool 'goal' is not allowed", is_error=True)
    tree = trace.goals.model_copy(deep=True)
    try:
        output = apply_goal_action(tree, call.parsed_arguments())
    except (ToolError, ValueError) as exc:
        return ToolResult(title="goal error", output=str(exc), is_error=True)
    runtime.store.update_trace(trace.trace_id, goals=tree)
    done = {g.id for g in trace.goals.goals if g.status == "done"}
    for goal in tree.goals:
        if goal.status == "done" and goal.id not in done:
            runtime.hooks.goal_completed(trace, goal)
    return ToolResult(title="goal", output=output)


def run_plain(runtime: Runtime, trace: Trace, call: ToolCall) -> ToolResult:
    """Run a plain tool where it runs: in the trace's workspace, within its permissions."""
    settings = runtime.settings
    ctx = ToolContext(
        workspace=runtime.workspace_of(trace),  # ConfigError outside the roots: trace fails
        trace_id=trace.trace_id,
        root_trace_id=trace.root_trace_id,
        preset=trace.preset,
        allow_shell=settings.allow_shell,
        skills_dirs=tuple(p for p in (settings.skills_dir,) if p is not None),
        shell_env=settings.shell_env,
        shell_limits=settings.shell_limits,
        web_allow=settings.web_allow,
        tool_timeout_s=settings.tool_timeout_s,
        private_dirs=settings.private_dirs,
        web_filter=runtime.web_filter(trace),
        search=runtime.search,
        search_cache=runtime.search_cache(trace),
    )
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        return ToolResult(title=f"{call.name} error", output=f"bad arguments: {exc}", is_error=True)
    if call.name.startswith(MCP_PREFIX) and call.name not in runtime.tools.names():
        runtime.sync_mcp_tools(need=server_of(call.name))  # a resumed trace calls it unlisted
    allowed = runtime.permissions(trace)  # a stop cuts the tool (`fleet.loop.cut`)
    return stoppable(
        runtime, trace.trace_id, lambda: runtime.tools.execute(call.name, arguments, ctx, allowed)
    )
