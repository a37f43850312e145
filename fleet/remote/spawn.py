"""Which remote agents a trace may call, and finding a remote child by its `agent://` id.

A model names an agent by its fleet.yaml key, never by a URL: a name the operator did not
declare, one the trace's preset leaves out (`remote_agents: [names]`), or one not marked
`read_only` for a read-only trace (or an explore branch) is refused with the list of
those it may call.
"""

from __future__ import annotations

from typing import Any

from fleet.errors import ToolError
from fleet.lifecycle.remote import REMOTE_ENTRY_PREFIX, RemoteCall, call_of
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.storage.store import TraceRecords


def may_call(runtime: Runtime, trace: Trace, name: str, *, read_only: bool) -> bool:
    """Whether `trace` may start a child on remote agent `name` (`read_only`: the child is)."""
    agent = runtime.config.remote_agents.get(name)
    if agent is None:
        return False
    preset = runtime.permissions(trace)
    if preset.remote_agents is not None and name not in preset.remote_agents:
        return False
    return agent.read_only or not (read_only or preset.read_only)


def check_may_call(runtime: Runtime, trace: Trace, name: object, *, read_only: bool) -> str:
    """`name` if `trace` may call it, else a `ToolError` naming those it may call."""
    if isinstance(name, str) and may_call(runtime, trace, name, read_only=read_only):
        return name
    agents = runtime.config.remote_agents
    allowed = [n for n in sorted(agents) if may_call(runtime, trace, n, read_only=read_only)]
    shown = str(name)[:60]
    raise ToolError(
        f"agent: no remote agent {shown!r} this trace may call (it may call:"
        f" {', '.join(allowed) or 'none'}); remote agents are named, never given by URL"
    )


def new_call(name: str | None) -> RemoteCall | None:
    """A new child's `run.remote_call` on agent `name` (None: not a remote child)."""
    return RemoteCall(agent=name) if name else None


def find_remote_child(store: TraceRecords, parent: Trace, remote_id: str) -> str | None:
    """The id of `parent`'s remote child whose task (now or earlier) is `remote_id`."""
    if not remote_id.startswith(REMOTE_ENTRY_PREFIX):
        return None
    for child_id in store.children(parent.trace_id):
        child = store.get_trace(child_id)
        call = call_of(child) if child.mode == "remote" else None
        if call is None:
            continue
        ids = {f"{REMOTE_ENTRY_PREFIX}{call.agent}/{t}" for t in (*call.tasks, call.task_id) if t}
        if remote_id in ids:
            return child_id
    return None


def reopened(child: Trace) -> RemoteCall | None:
    """A remote child's call once `continue_from` gave it a new message to send."""
    call = call_of(child)
    if call is None:
        return None
    return call.model_copy(update={"state": "sent", "ok": False, "result": "", "errors": 0})


def offered_schema(runtime: Runtime, trace: Trace, schema: dict[str, Any]) -> dict[str, Any]:
    """The `agent` tool's schema for `trace`, its `agent` parameter narrowed.

    The parameter lists the remote agents the trace may call, and is left out when there
    are none (a model cannot guess a name).
    """
    names = [
        n
        for n in sorted(runtime.config.remote_agents)
        if may_call(runtime, trace, n, read_only=False)
    ]
    function = dict(schema["function"])
    parameters = dict(function["parameters"])
    properties = dict(parameters["properties"])
    if not names:
        properties.pop("agent", None)
    else:
        shown = ", ".join(names)
        properties["agent"] = {
            **properties["agent"],
            "enum": names,
            "description": f"{properties['agent']['description']} Remote agents: {shown}.",
        }
    parameters["properties"] = properties
    function["parameters"] = parameters
    return {**schema, "function": function}
