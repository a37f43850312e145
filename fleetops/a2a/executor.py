"""A2A tasks as fleet trees: the `AgentExecutor` a2a-sdk's request handler calls.

- A message with no task: a new root on the skill's preset (`metadata.skill`, else the
  first skill), or, in a context that already holds a tree, that root continued.
- A message to a task that is `input-required`: the reply to the person the tree waits on.
- The task then follows the tree (read every `POLL_S`): `working` with a note while it
  runs, the answer as an artifact (its metadata names the root's `trace_id`) and
  `completed`, `failed` with its one-line error, `input-required` with the question when
  a trace of it waits on a person.
- CancelTask stops the tree (`fleet stop`).

Which task and context belong to which tree is kept in the fleet's Redis
(`fleet.storage.a2a_tasks`, for the fleet's retention), as a2a-sdk's tasks are
(`fleetops.a2a.store`): a restarted `fleet a2a` still answers GetTask and CancelTask of an
earlier task, and a message to its context continues the same tree.
"""

from __future__ import annotations

import asyncio
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue

from fleet.client import Fleet
from fleet.conversation.human import waiting_on
from fleet.errors import FleetError
from fleet.models import Trace
from fleet.storage.a2a_tasks import A2A_TASKS

POLL_S = 0.3
"""How often a task reads its tree."""
MAX_DEPTH_READ = 200
"""Most traces of a tree read to find the one waiting on a person."""


def _parts(text: str) -> list[Any]:
    from a2a.types import a2a_pb2 as pb

    return [pb.Part(text=text)]


class FleetExecutor(AgentExecutor):
    """a2a-sdk's `AgentExecutor` over a `Fleet` client (sync calls run on threads)."""

    def __init__(self, fleet: Fleet, skills: list[str], poll_s: float = POLL_S) -> None:
        """Serve `skills` (preset names; the first is the default) through `fleet`."""
        self.fleet, self.skills, self.poll_s = fleet, skills, poll_s
        self.links = fleet.store.capability(A2A_TASKS)
        self.retention_s = fleet.runtime.settings.retention_s
        self.following: set[str] = set()
        """The tasks this process follows (`fleetops.a2a.resume` catches up the others)."""
        self.canceling: set[str] = set()
        """Tasks whose CancelTask is stopping their tree: the stop ends them `canceled`."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Start, continue or answer the task's tree, then follow it (module doc)."""
        from a2a.helpers.proto_helpers import new_task_from_user_message
        from a2a.server.tasks import TaskUpdater

        task_id, context_id = str(context.task_id), str(context.context_id)  # the SDK sets both
        if context.current_task is None and context.message is not None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, task_id, context_id)
        try:
            root = await asyncio.to_thread(self._begin, context, task_id, context_id)
        except FleetError as exc:
            await updater.failed(updater.new_agent_message(_parts(_one_line(exc))))
            return
        await asyncio.to_thread(self._link, task_id, context_id, root)
        self.following.add(task_id)
        try:
            await updater.start_work(updater.new_agent_message(_parts(f"fleet trace {root}")))
            await self._follow(root, updater)
        finally:
            self.following.discard(task_id)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Stop the task's tree; the task ends `canceled`."""
        from a2a.server.tasks import TaskUpdater

        task_id, context_id = str(context.task_id), str(context.context_id)
        self.canceling.add(task_id)  # the follower, seeing the tree stopped, leaves it to us
        try:
            root = await asyncio.to_thread(self.links.root_of, "task", task_id)
            if root is not None:
                await asyncio.to_thread(self.fleet.stop, root)
            await TaskUpdater(event_queue, task_id, context_id).cancel()
        finally:
            self.canceling.discard(task_id)

    def _begin(self, context: RequestContext, task_id: str, context_id: str) -> str:
        """The root this message goes to: answered, continued or new (its trace id)."""
        text = context.get_user_input()
        if not text.strip():
            raise FleetError("the message has no text")
        root = self.links.root_of("task", task_id)
        if root is not None:  # the task asked for input: this is the answer
            asked = self.asking(root)
            if asked is None:
                raise FleetError(f"tree {root!r} is not waiting on a person")
            self.fleet.reply(asked.trace_id, text)
            return root
        root = self.links.root_of("context", context_id)
        if root is not None:  # a new task in a known context: the conversation goes on
            self.fleet.continue_trace(root, text)
            return root
        return self.fleet.submit(text, preset=self._skill(context)).trace_id

    def _link(self, task_id: str, context_id: str, root: str) -> None:
        self.links.link("task", task_id, root, self.retention_s)
        self.links.link("context", context_id, root, self.retention_s)

    def _skill(self, context: RequestContext) -> str:
        metadata = dict(context.metadata or {})
        skill = str(metadata.get("skill") or self.skills[0])
        if skill not in self.skills:
            raise FleetError(f"no skill {skill[:40]!r} (skills: {', '.join(self.skills)})")
        return skill

    def asking(self, root: str) -> Trace | None:
        """The trace of the tree that waits on a person, root first; None if none."""
        frontier, read = [root], 0
        while frontier and read < MAX_DEPTH_READ:
            traces = self.fleet.store.get_traces(frontier)
            read += len(traces)
            for trace in traces:
                if waiting_on(trace) is not None:
                    return trace
            frontier = [c for t in traces for c in self.fleet.store.children(t.trace_id)]
        return None

    async def _follow(self, root: str, updater: Any) -> None:
        """Mirror the tree into the task until it ends or asks a person."""
        while True:
            trace = await asyncio.to_thread(self.fleet.trace, root)
            if trace.status == "completed":
                meta = {"trace_id": root}  # where `fleet trace show` finds the tree
                await updater.add_artifact(_parts(trace.answer or ""), name="answer", metadata=meta)
                await updater.complete()
                return
            if trace.status == "stopped" and updater.task_id in self.canceling:
                return  # a CancelTask stopped it: `cancel` ends the task `canceled`
            if trace.status in ("failed", "stopped"):
                why = f"tree {trace.status}: {trace.error or trace.status}"
                await updater.failed(updater.new_agent_message(_parts(why)))
                return
            asked = await asyncio.to_thread(self.asking, root)
            if asked is not None:
                question = str((waiting_on(asked) or {}).get("question") or "")
                await updater.requires_input(updater.new_agent_message(_parts(question)))
                return
            await asyncio.sleep(self.poll_s)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
