"""A task no `fleet a2a` process follows: after a restart, GetTask and CancelTask still work.

An executor follows each task's tree while the process that took it lives
(`FleetExecutor._follow`). Once that process is gone, the task (kept in the fleet's Redis,
`fleetops.a2a.store`) would say `working` for ever: `FleetHandler` brings it to its tree's
state when it is read (`caught_up`), and stops the tree when it is cancelled, which
a2a-sdk's handler does not ask the executor to do for a task it does not hold.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from a2a.helpers.proto_helpers import new_text_artifact, new_text_message
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.types import a2a_pb2 as pb

from fleet.conversation.human import waiting_on
from fleet.errors import FleetError

if TYPE_CHECKING:
    from fleetops.a2a.executor import FleetExecutor

ENDED = frozenset(
    {
        pb.TASK_STATE_COMPLETED,
        pb.TASK_STATE_FAILED,
        pb.TASK_STATE_CANCELED,
        pb.TASK_STATE_REJECTED,
    }
)


def caught_up(executor: FleetExecutor, task: pb.Task) -> pb.Task | None:
    """`task` at its tree's state, if no executor here follows it and the tree moved on."""
    if task.id in executor.following or task.status.state in ENDED:
        return None
    root = executor.links.root_of("task", task.id)
    if root is None:
        return None
    trace = executor.fleet.trace(root)
    updated = pb.Task()
    updated.CopyFrom(task)
    if trace.status == "completed":
        artifact = new_text_artifact("answer", trace.answer or "")
        artifact.metadata.update({"trace_id": root})
        updated.artifacts.append(artifact)
        updated.status.CopyFrom(pb.TaskStatus(state=pb.TASK_STATE_COMPLETED))
        return updated
    if trace.status in ("failed", "stopped"):
        why = f"tree {trace.status}: {trace.error or trace.status}"
        updated.status.CopyFrom(pb.TaskStatus(state=pb.TASK_STATE_FAILED, message=_said(why)))
        return updated
    asked = executor.asking(root)
    if asked is not None and task.status.state != pb.TASK_STATE_INPUT_REQUIRED:
        question = str((waiting_on(asked) or {}).get("question") or "")
        state = pb.TASK_STATE_INPUT_REQUIRED
        updated.status.CopyFrom(pb.TaskStatus(state=state, message=_said(question)))
        return updated
    return None


def _said(text: str) -> pb.Message:
    return new_text_message(text)


class FleetHandler(DefaultRequestHandler):
    """a2a-sdk's handler, for tasks an earlier (or another) `fleet a2a` took as well."""

    def __init__(self, executor: FleetExecutor, **kwargs: Any) -> None:
        """As `DefaultRequestHandler(agent_executor=executor, **kwargs)`."""
        super().__init__(agent_executor=executor, **kwargs)
        self.fleet_executor = executor

    async def on_get_task(self, params: pb.GetTaskRequest, context: Any) -> pb.Task | None:
        """The task, brought to its tree's state first when no executor here follows it."""
        await self._catch_up(params.id, context)
        task: pb.Task | None = await super().on_get_task(params, context)
        return task

    async def on_cancel_task(self, params: pb.CancelTaskRequest, context: Any) -> pb.Task | None:
        """Stop the tree of a task no executor here follows, then cancel it as a2a-sdk does."""
        executor = self.fleet_executor
        if params.id not in executor.following:
            root = await asyncio.to_thread(executor.links.root_of, "task", params.id)
            if root is not None:
                try:
                    await asyncio.to_thread(executor.fleet.stop, root)
                except FleetError:
                    pass  # the tree is gone past the retention: the task is cancelled all the same
        task: pb.Task | None = await super().on_cancel_task(params, context)
        return task

    async def _catch_up(self, task_id: str, context: Any) -> None:
        store: Any = self.task_store
        task = await store.get(task_id, context)
        if task is None:
            return
        updated = await asyncio.to_thread(caught_up, self.fleet_executor, task)
        if updated is not None:
            await store.save(updated, context)
