"""a2a-sdk's task store on the fleet's Redis (`fleet.storage.a2a_tasks`): tasks outlive the process.

`InMemoryTaskStore` forgets every task when `fleet a2a` restarts; this one keeps each task
(a2a-sdk's protobuf as JSON) for the fleet's retention, so GetTask and CancelTask of a task
an earlier `fleet a2a` took still work. ListTasks reads the newest `LIST_MAX` tasks (one
page, filtered by context and state; the bearer token is the one owner).
"""

from __future__ import annotations

import asyncio
from typing import Any

from a2a.server.tasks import TaskStore
from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format  # type: ignore[import-untyped]

from fleet.models import now_ms
from fleet.storage.a2a_tasks import A2ATasks

LIST_MAX = 100
"""Most tasks one ListTasks answers."""


class RedisTaskStore(TaskStore):
    """a2a-sdk's `TaskStore` over `A2ATasks` (sync Redis calls run on threads)."""

    def __init__(self, tasks: A2ATasks, retention_s: int) -> None:
        """Keep tasks in `tasks` for `retention_s` from their last save."""
        self.tasks, self.retention_s = tasks, retention_s

    async def save(self, task: pb.Task, context: Any = None) -> None:
        """Save (or replace) the task."""
        body = json_format.MessageToJson(task, indent=None)
        await asyncio.to_thread(self.tasks.save, task.id, body, now_ms(), self.retention_s)

    async def get(self, task_id: str, context: Any = None) -> pb.Task | None:
        """The task, or None."""
        body = await asyncio.to_thread(self.tasks.get, task_id)
        return None if body is None else _task(body)

    async def list(self, params: pb.ListTasksRequest, context: Any = None) -> pb.ListTasksResponse:
        """The newest tasks (at most `LIST_MAX`, or the page size asked), filtered."""
        limit = min(params.page_size or LIST_MAX, LIST_MAX)
        bodies = await asyncio.to_thread(self.tasks.recent, LIST_MAX)
        found = [_task(b) for b in bodies]
        if params.context_id:
            found = [t for t in found if t.context_id == params.context_id]
        if params.status:
            found = [t for t in found if t.status.state == params.status]
        found = found[:limit]
        return pb.ListTasksResponse(tasks=found, page_size=limit, total_size=len(found))

    async def delete(self, task_id: str, context: Any = None) -> None:
        """Forget the task."""
        await asyncio.to_thread(self.tasks.delete, task_id)


def _task(body: str) -> pb.Task:
    task = pb.Task()
    json_format.Parse(body, task, ignore_unknown_fields=True)
    return task
