"""A model turn that calls tools: stored first, its tools run, the trace after them.

The runner's `CallTools` step (`fleet.loop.runner`); the tools themselves run in
`fleet.loop.toolcalls`.
"""

from __future__ import annotations

from dataclasses import replace

from fleet import lifecycle
from fleet.history import SUB_AGENT_TOOLS
from fleet.llm.base import ToolCall
from fleet.loop.steps import OnApproval, OnChildren, OnPerson
from fleet.loop.toolcalls import execute_turn, plain_only
from fleet.loop.turns import GoOn, ReadAgain, Turn, advanced
from fleet.runtime import Runtime
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import Append


def tool_turn(
    runtime: Runtime, turn: Turn, calls: tuple[ToolCall, ...]
) -> GoOn | OnPerson | OnApproval | OnChildren:
    """Store the model turn, run its tools; the snapshot after them, if known without a read.

    What the run waits on (a person, an approval, sub-agents still running), if anything;
    `ReadAgain` when the trace must be read again.
    """
    store = runtime.store
    # The model turn is stored before its tools run: a crash heals them on resume. A
    # read-only turn of plain tools is stored with their results (`plain_only`).
    together = plain_only(runtime, turn.trace, calls)
    own = sum(isinstance(op, Append) for op in turn.write.ops)  # with any first messages
    stored = [] if together else store.apply(turn.write).messages
    own_write = turn.write if together else None
    tools = execute_turn(runtime, turn.trace, calls, own_write, pauses=turn.pauses)
    written = tools.written
    if together and written is not None:
        stored, rest = written.messages[:own], written.messages[own:]
        written = replace(written, messages=rest)
    if tools.wait is not None:
        return tools.wait
    if any(c.name in SUB_AGENT_TOOLS for c in calls):  # only spawns wait
        lifecycle.start(runtime, store.get_trace(turn.trace.trace_id))
        return ReadAgain()
    if written is None or stored[-1:] != turn.messages[-1:]:
        return ReadAgain()  # another write changed the trace (a goal): read it
    return advanced(TraceSnapshot(turn.trace, turn.messages, False), written)
