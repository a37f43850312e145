"""The fleet as an MCP server: an MCP client (Claude Code, an IDE) fans work out over it.

`fleet mcp` serves these tools over stdio (or streamable HTTP with `--http PORT`):
`submit`, `explore`, `delegate`, `trace`, `wait`, `stop`, `reply`, `send`. Each goes through
`fleet.client.Fleet`, so budgets, limits, presets and workspace roots apply exactly as
for `fleet run`. `explore` submits one tree (`Fleet.explore_tree`: a root whose branches
are the tasks), reports progress as each branch ends, and returns the root's trace id
with every branch's result: `stop` on that id stops the whole exploration.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from fleet.client import Fleet, Handle
from fleet.errors import ConfigError, FleetError
from fleet.models import TERMINAL, Event
from fleet.security.numbers import client_wait_s

_P = ParamSpec("_P")
_T = TypeVar("_T")
DEFAULT_WAIT_S = 60.0
"""How long `wait` waits when the client does not say."""
RUN_TIMEOUT_S = 3600.0
"""How long `explore` and `delegate` wait for their results at most."""
SUMMARY_CHARS = 500
INSTRUCTIONS = (
    "Run LLM sub-agents on a Celery fleet. `explore` runs one read-only agent per task in "
    "parallel and returns every result; `delegate` runs one agent that may change the "
    "workspace; `submit` starts a run and returns its trace id for `trace`, `wait`, `stop` "
    "and `reply` (the answer to an agent waiting on a person); `send` tells a running agent "
    "something it reads before its next model call."
)


class FleetTools:
    """The MCP tools, each a thin call of `Fleet` run off the event loop."""

    def __init__(self, fleet: Fleet) -> None:
        """Serve `fleet`."""
        self.fleet = fleet

    async def submit(
        self,
        task: str,
        preset: str = "default",
        model: str | None = None,
        workspace: str | None = None,
        memory: list[str] | None = None,
    ) -> dict[str, Any]:
        """Start a main agent on the fleet; returns its trace id at once.

        Args:
            task: What the agent should do.
            preset: Agent preset (default, explore, analyst, or a project's).
            model: Model name or alias; the fleet's default when left out.
            workspace: A folder under the fleet's workspace roots; its default otherwise.
            memory: Long-term memory namespaces the tree may use (`user:alice`).
        """
        where = _workspace(workspace)
        handle = await _off_loop(
            self.fleet.submit,
            task,
            preset=preset,
            model=model,
            workspace=where,
            memory=tuple(memory or ()),
        )
        return {"trace_id": handle.trace_id}

    async def explore(
        self,
        tasks: list[str],
        ctx: Context,
        model: str | None = None,
        workspace: str | None = None,
        timeout_s: float = RUN_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Run one read-only explore agent per task, in parallel, as one tree; every result.

        Args:
            tasks: One question per branch.
            ctx: The request's context: progress goes through it.
            model: Model name or alias; the fleet's default when left out.
            workspace: A folder under the fleet's workspace roots; its default otherwise.
            timeout_s: Give up waiting after this long (branches keep running; `stop`
                with the returned trace id stops them all).
        """
        timeout_s = _timeout_s(timeout_s)
        limit = self.fleet.runtime.settings.max_branches
        if not tasks or len(tasks) > limit:
            raise ToolError(f"explore: give between 1 and {limit} tasks, not {len(tasks)}")
        where = _workspace(workspace)
        handle = await _off_loop(self.fleet.explore_tree, list(tasks), model=model, workspace=where)
        total = len(tasks)

        def report(ended: int) -> None:  # from the following thread, on the event loop
            note = f"{ended} of {total} branches ended"
            anyio.from_thread.run(ctx.report_progress, ended, total, note)

        await _off_loop(self._follow, handle.trace_id, timeout_s, report)
        view = await _off_loop(self._view, handle.trace_id)
        view["results"] = await _off_loop(self._branch_results, handle.trace_id)
        return view

    async def delegate(
        self,
        task: str,
        preset: str = "default",
        model: str | None = None,
        workspace: str | None = None,
        timeout_s: float = RUN_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Run one agent that may change the workspace; its answer once done.

        Args:
            task: What the agent should do.
            preset: Agent preset.
            model: Model name or alias; the fleet's default when left out.
            workspace: A folder under the fleet's workspace roots; its default otherwise.
            timeout_s: Give up waiting after this long (the agent keeps running).
        """
        timeout_s = _timeout_s(timeout_s)
        where = _workspace(workspace)
        handle = await _off_loop(
            self.fleet.submit, task, preset=preset, model=model, mode="delegate", workspace=where
        )
        return await self._settled(handle, timeout_s)

    async def trace(self, trace_id: str) -> dict[str, Any]:
        """A trace's status, answer and collaborators.

        Args:
            trace_id: The id `submit` returned.
        """
        return await _off_loop(self._view, trace_id)

    async def wait(self, trace_id: str, timeout_s: float = DEFAULT_WAIT_S) -> dict[str, Any]:
        """Wait up to `timeout_s` for a trace to end; its state then.

        Args:
            trace_id: The id `submit` returned.
            timeout_s: The most to wait, in seconds.
        """
        timeout_s = _timeout_s(timeout_s)
        return await self._settled(Handle(trace_id, self.fleet), timeout_s)

    async def stop(self, trace_id: str) -> dict[str, Any]:
        """Stop a trace and every agent under it.

        Args:
            trace_id: The id `submit` returned.
        """
        stopped = await _off_loop(self.fleet.stop, trace_id)
        return {"stopped": stopped}

    async def reply(self, trace_id: str, answer: str) -> dict[str, Any]:
        """Answer the question a trace waits on (its `ask_human`); it runs on.

        Args:
            trace_id: The waiting trace.
            answer: The answer to its question.
        """
        handle = await _off_loop(self.fleet.reply, trace_id, answer)
        return {"trace_id": handle.trace_id, "status": "running"}

    async def send(
        self, trace_id: str, text: str, sender: str = "mcp", interrupt: bool = False
    ) -> dict[str, Any]:
        """Send a running trace a message; it reads it before its next model call.

        Args:
            trace_id: The running trace (a root or any agent under it).
            text: The message.
            sender: Who it is from, as the agent sees it.
            interrupt: Cut its model call in flight and start its next turn with it.
        """
        entry_id = await _off_loop(
            self.fleet.send, trace_id, text, sender=sender, interrupt=interrupt
        )
        return {"trace_id": trace_id, "entry_id": entry_id}

    async def _settled(self, handle: Handle, timeout_s: float) -> dict[str, Any]:
        await _off_loop(self._follow, handle.trace_id, timeout_s)
        return await _off_loop(self._view, handle.trace_id)

    def _follow(
        self, trace_id: str, timeout_s: float, report: Callable[[int], None] | None = None
    ) -> None:
        """Until the trace ended or waits on a person (a `reply` is due), or `timeout_s`.

        With `report`, it is called once per child of the trace that ended, with how many
        have (an explore's progress: 1, 2, ... however many ended between two reads).
        """
        ended = 0

        def settled(event: Event | None) -> bool:
            nonlocal ended
            done = self._settled_now(trace_id)
            # counted after the status is read: a root that ended has every child ended
            if report is not None and (done or event is None or _about(event, trace_id)):
                now = self._children_ended(trace_id)
                for count in range(ended + 1, now + 1):  # one notification per branch
                    report(count)
                ended = max(ended, now)
            return done

        if settled(None):
            return
        try:
            for event in self.fleet.events(trace_id, timeout_s):
                if settled(event):
                    return
        except TimeoutError:
            pass  # still running: the view says so

    def _children_ended(self, trace_id: str) -> int:
        entries = self.fleet.store.collaborators(trace_id)
        return sum(1 for c in entries if c.type == "agent" and c.status in TERMINAL)

    def _branch_results(self, trace_id: str) -> list[dict[str, Any]]:
        """Each branch of a fan-out root, in task order: its status and answer."""
        results = []
        for entry in self.fleet.store.collaborators(trace_id):
            if entry.type != "agent":
                continue
            branch = self.fleet.trace(entry.trace_id)
            results.append(
                {
                    "task": branch.task,
                    "trace_id": branch.trace_id,
                    "status": branch.status,
                    "answer": branch.answer,
                    "error": branch.error,
                }
            )
        return results

    def _settled_now(self, trace_id: str) -> bool:
        trace = self.fleet.trace(trace_id)
        if trace.is_terminal:
            return True
        asked = self.fleet.store.collaborators(trace_id) if trace.status == "waiting" else []
        return any(c.type == "human" and c.status == "waiting" for c in asked)

    def _view(self, trace_id: str) -> dict[str, Any]:
        trace = self.fleet.trace(trace_id)
        return {
            "trace_id": trace.trace_id,
            "status": trace.status,
            "answer": trace.answer,
            "error": trace.error,
            "stop_reason": trace.run.stop_reason,
            "collaborators": [
                {
                    "name": c.name,
                    "type": c.type,
                    "trace_id": c.trace_id,
                    "status": c.status,
                    "summary": c.summary[:SUMMARY_CHARS],
                }
                for c in self.fleet.store.collaborators(trace_id)
            ],
        }


def _about(event: Event, trace_id: str) -> bool:
    """An event of this trace, or of a child of it (a child's end names its parent)."""
    return event.trace_id == trace_id or event.data.get("parent_trace_id") == trace_id


_READS = ToolAnnotations(read_only_hint=True)
TOOLS: dict[str, ToolAnnotations | None] = {
    "submit": None,
    "explore": None,
    "delegate": None,
    "trace": _READS,
    "wait": _READS,
    "stop": ToolAnnotations(read_only_hint=False, destructive_hint=True),
    "reply": None,
    "send": None,
}


def build_server(fleet: Fleet) -> MCPServer:
    """An MCP server whose tools drive `fleet`."""
    server = MCPServer("agent-fleet", instructions=INSTRUCTIONS)
    tools = FleetTools(fleet)
    for name, hints in TOOLS.items():
        server.add_tool(getattr(tools, name), name=name, annotations=hints)
    return server


def _timeout_s(value: float) -> float:
    """A client's `timeout_s`, finite and 0 to a week; else one line, before any submission."""
    try:
        checked = client_wait_s(value, "timeout_s", ConfigError)
    except ConfigError as exc:
        raise ToolError(str(exc)) from None
    assert checked is not None  # a float came in
    return checked


def _workspace(value: str | None) -> Path | None:
    # Checked against the roots by `Fleet.submit`, as any submission is.
    return Path(value) if value else None


async def _off_loop(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`fn(*args, **kwargs)` in a worker thread: `Fleet` blocks on Redis.

    Raises:
        ToolError: one line for the client, for a `FleetError` (unknown preset, a
            workspace outside the roots, no such trace, a budget refused...). Any other
            error is the SDK's: the client reads only "Error executing tool NAME".
    """
    try:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    except FleetError as exc:
        raise ToolError(" ".join(str(exc).split())) from None
