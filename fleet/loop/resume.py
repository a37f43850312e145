"""How a run opens its trace: a fresh one's first messages, a resumed one's open turn.

A fresh trace's system and task messages are numbered here and wait for its first model
turn's write. A resumed trace's open turn is collected from its children, or healed.

A run that starts on a trace whose last assistant turn has calls without results (a crash,
a lost collect, a redelivery) settles each: a person not answered yet waits again;
a call a person approved runs now; sub-agents that all ended are collected here; anything
else gets a synthetic result (for `agent`/`evaluate` naming the sub-trace, so the model can
`continue_from` it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, assert_never

from fleet import lifecycle
from fleet.children import settling
from fleet.conversation import approval
from fleet.conversation.human import still_waiting
from fleet.history import SUB_AGENT_TOOLS, healed_result, main_path, open_turn
from fleet.llm.base import ToolCall
from fleet.loop.context import first_messages
from fleet.loop.results import write_result
from fleet.loop.steps import OnApproval, OnChildren, OnPerson
from fleet.loop.toolcalls import run_plain
from fleet.loop.turns import GoOn, Held, ReadAgain, numbered
from fleet.models import Message, Trace
from fleet.runtime import Runtime
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import TraceWrite

Resumed = OnPerson | OnApproval | OnChildren
"""What a resumed trace still waits on: a person not answered yet, children still running."""


def opening(
    runtime: Runtime, snapshot: TraceSnapshot, trace: Trace, start: TraceWrite, held: Held
) -> GoOn | Resumed | Literal["stopped"]:
    """What the first turn starts from; what it waits on while a resumed trace must wait.

    A fresh trace's first messages, numbered as the store will number them, are written
    with its first model turn (`held.pending`): no write and no read before the call.
    A resumed trace with nothing to heal goes on from `begin_run`'s read (its collected
    results are in it); one whose open turn is healed here reads it again first.
    `stopped`: a resumed trace that must wait again was told to stop meanwhile, and ended
    so as it went back to `waiting` (`lifecycle.wait`).
    """
    path = main_path(snapshot.messages, trace.head_sequence)
    if not path:
        trace, first = numbered(trace, first_messages(runtime, trace))
        for message in first:
            start.append(message)
        held.pending = start
        messages = [*snapshot.messages, *first]
        return replace(snapshot, trace=trace, messages=messages)
    if not start.ops and open_turn(path) is None:
        return replace(snapshot, trace=trace)
    if start.ops:
        runtime.store.apply(start)
    if (waits := heal(runtime, trace, snapshot.messages)) is not None:
        if lifecycle.wait(runtime, trace).is_terminal:
            return "stopped"  # a stop landed since `begin_run` read the flag (`wait`)
        return waits
    return ReadAgain()


def heal(runtime: Runtime, trace: Trace, messages: list[Message]) -> Resumed | None:
    """Heal a resumed trace's open turn; what it still waits on, None once healed."""
    turn = open_turn(main_path(messages, trace.head_sequence))
    if turn is None:
        return None
    waits: Resumed | None = None
    for call in turn.missing:  # every call is settled, whatever the first waits on
        waits = _settle(runtime, trace, call) or waits
    return waits


def _settle(runtime: Runtime, trace: Trace, call: dict[str, Any]) -> Resumed | None:
    """Collect or heal one unanswered call; what it waits on, if anything."""
    call_id = str(call["id"])
    name = str(call["function"]["name"])
    if still_waiting(trace, call_id):  # a person has not answered yet: a redelivered run waits
        asked = trace.run.waiting_on or {}
        return OnApproval(call_id) if asked.get("kind") == approval.APPROVAL else OnPerson(call_id)
    if approval.approved(trace, call_id):
        _run_approved(runtime, trace, call)
        return None
    kids: list[str] = []
    if name in SUB_AGENT_TOOLS:
        kids = settling.call_children(runtime.store, trace.trace_id, call_id)
    if kids:
        # Their collect was lost (or is still to come): settle it here if they all ended.
        match settling.settle(runtime, trace.trace_id, call_id, kids):
            case settling.Settled() | settling.AlreadyCollected():
                return None
            case settling.Waiting() if runtime.dispatcher.children_survive_restart:
                return OnChildren((call_id,))
            case settling.Waiting():
                pass  # they died with this process: heal the call below
            case unreachable:
                assert_never(unreachable)
    sub_id = kids[0] if kids else None
    runtime.store.append_message(healed_result(trace.trace_id, call, sub_id))
    return None


def _run_approved(runtime: Runtime, trace: Trace, call: dict[str, Any]) -> None:
    """Run the call a person approved and write its result.

    The approval is taken off the trace before the tool runs: a crash while it runs
    leaves the call to be healed by the next run, never run a second time.
    """
    runtime.store.update_run(trace.trace_id, approved_call=None)
    function = call["function"]
    tool_call = ToolCall(str(call["id"]), str(function["name"]), str(function["arguments"]))
    result = run_plain(runtime, trace, tool_call)
    write = TraceWrite(trace.trace_id, trace.root_trace_id)
    write_result(runtime, write, tool_call, result)
    runtime.store.apply(write)
    runtime.hooks.tool_finished(trace, tool_call, result)
