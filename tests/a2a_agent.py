"""A remote agent for tests, built with a2a-sdk's own server, on a loopback port.

What it does is read from the message text:
- `slow N ...`: works N seconds (status "working" with a note), then completes;
- `ask ...`: asks for input (input-required), then completes with the reply it got;
- `notes N ...`: works 3 s, says `note 1` ... `note N` 50 ms apart (status "working"),
  then completes;
- anything else: works 0.2 s and completes with the artifact `reviewed: <text>`.
Each artifact names its context, so a test sees a continued conversation reach the same
one; task ids are `task-1`, `task-2`, ... in order. `record` keeps (task id, context id,
text) of every message, `canceled` every cancelled task and `methods` how often GetTask
and SubscribeToTask were asked. `serve_reviewer(streaming=False)`: a card without streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.simple_request_context_builder import SimpleRequestContextBuilder
from a2a.server.events import EventQueue
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2 as pb
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


@dataclass
class Record:
    """What the agent saw."""

    messages: list[tuple[str, str, str]] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    """The `messageId` of each of `messages`, in the same order."""
    canceled: list[str] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    methods: Counter[str] = field(default_factory=Counter)


class Reviewer(AgentExecutor):
    def __init__(self, record: Record) -> None:
        self.record = record

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        text = context.get_user_input()
        self.record.messages.append((context.task_id, context.context_id, text))
        self.record.message_ids.append(context.message.message_id)
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        asked = context.current_task is not None and context.current_task.status.state == (
            pb.TASK_STATE_INPUT_REQUIRED
        )
        if text.startswith("ask") and not asked:
            question = updater.new_agent_message([pb.Part(text="Which module first?")])
            await updater.requires_input(question)
            return
        if text.startswith("notes"):
            await updater.start_work()
            await asyncio.sleep(3)  # a watcher polling every second subscribes meanwhile
            for number in range(1, int(text.split()[1]) + 1):
                note = updater.new_agent_message([pb.Part(text=f"note {number}")])
                await updater.update_status(pb.TASK_STATE_WORKING, note)
                await asyncio.sleep(0.05)
        seconds = float(text.split()[1]) if text.startswith("slow") else 0.2
        await updater.start_work(updater.new_agent_message([pb.Part(text="reading the diff")]))
        await asyncio.sleep(seconds)
        answer = f"reviewed: {text} (context {context.context_id})"
        await updater.add_artifact([pb.Part(text=answer)], name="review")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        self.record.canceled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class _Counting(DefaultRequestHandler):
    """a2a-sdk's handler, counting GetTask and SubscribeToTask."""

    def __init__(self, record: Record, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record

    async def on_get_task(self, params: Any, context: Any) -> Any:
        self.record.methods["GetTask"] += 1
        return await super().on_get_task(params, context)

    async def on_subscribe_to_task(self, params: Any, context: Any) -> AsyncGenerator[Any, None]:
        self.record.methods["SubscribeToTask"] += 1
        async for event in super().on_subscribe_to_task(params, context):
            yield event


class _Bearer(BaseHTTPMiddleware):
    def __init__(self, app: Any, token: str | None, record: Record) -> None:
        super().__init__(app)
        self.token, self.record = token, record

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        self.record.auth.append(request.headers.get("authorization", ""))
        if self.token and request.url.path != "/.well-known/agent-card.json":
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


class _Numbered(IDGenerator):
    """Task ids `task-1`, `task-2`, ...: a scripted model can name them in `continue_from`."""

    def __init__(self) -> None:
        self.count = itertools.count(1)

    def generate(self, context: IDGeneratorContext) -> str:
        return f"task-{next(self.count)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningAgent:
    url: str
    record: Record
    server: uvicorn.Server
    thread: threading.Thread

    def kill(self) -> None:
        """Stop serving at once (open streams and pending requests are dropped)."""
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(10)


@contextlib.contextmanager
def serve_reviewer(token: str | None = None, streaming: bool = True) -> Iterator[RunningAgent]:
    """The reviewer on a free loopback port, in a thread; its JSON-RPC URL is `/`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    record = Record()
    card = pb.AgentCard(
        name="reviewer",
        description="reviews code",
        version="1",
        supported_interfaces=[
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        skills=[pb.AgentSkill(id="review", name="review", description="reviews", tags=["code"])],
        capabilities=pb.AgentCapabilities(streaming=streaming),
        default_input_modes=["text"],
        default_output_modes=["text"],
    )
    handler = _Counting(
        record,
        agent_executor=Reviewer(record),
        task_store=InMemoryTaskStore(),
        agent_card=card,
        request_context_builder=SimpleRequestContextBuilder(task_id_generator=_Numbered()),
    )
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    app.add_middleware(_Bearer, token=token, record=record)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    running = RunningAgent(url, record, server, thread)
    try:
        yield running
    finally:
        running.kill()
