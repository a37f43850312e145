"""Talking to a remote A2A agent through `a2a-sdk`'s client, from synchronous fleet code.

Every call builds its own client on an httpx transport that (1) resolves the operator's
host once through the SSRF guard (`fleet.tools.netguard`: loopback and private addresses
only for an agent marked `private`) and connects to the address it checked, and (2) reads
at most `MAX_RESPONSE_BYTES` of any answer. The client is built from a card made here from
the operator's URL: the remote agent's own card is never read, so no URL the remote names
is ever followed. What comes back is reduced to a `RemoteTask` of capped plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from fleet.config.remote_agents import RemoteAgentConfig
from fleet.errors import ToolError
from fleet.remote.task import RemoteError, RemoteRefused, RemoteTask
from fleet.tools import netguard

MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""Most bytes read of one answer of a remote agent; past it the call fails (`RemoteTooLarge`)."""
MAX_RESULT_CHARS = 64_000
"""Most characters of a remote task's artifact kept as the child's answer."""
MAX_STATUS_CHARS = 2_000
"""Most characters of a status message (a question, a progress note) kept."""
CALL_TIMEOUT_S = 15.0
"""Most seconds one request (send, get, cancel) may take, whatever the agent's timeout_s."""

T = TypeVar("T")


class _TooLarge(httpx.ReadError):
    """The answer passed MAX_RESPONSE_BYTES."""


class _Refused(httpx.ConnectError):
    """The SSRF guard refused the address."""


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self.inner, self.request, self.read_bytes = inner, request, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.read_bytes += len(chunk)
            if self.read_bytes > MAX_RESPONSE_BYTES:
                shown = MAX_RESPONSE_BYTES // (1024 * 1024)
                raise _TooLarge(f"answer over {shown} MB", request=self.request)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """Each request to the address the SSRF guard checked, each answer read capped."""

    def __init__(self, private: bool) -> None:
        """`private`: the operator lets this agent be a loopback or private address."""
        self.private = private
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Resolve, check, pin; the answer's stream is counted."""
        host, port = request.url.host, request.url.port
        port = port or (443 if request.url.scheme == "https" else 80)
        allow = (host,) if self.private else ()
        try:
            target = await asyncio.to_thread(netguard.resolve, host, port, allow, "remote agent")
        except ToolError as exc:
            raise _Refused(str(exc), request=request) from None
        address = f"[{target.address}]" if ":" in target.address else target.address
        pinned = request.url.copy_with(host=address.strip("[]"))
        request.url = pinned
        request.headers["Host"] = host if port in (80, 443) else f"{host}:{port}"
        request.extensions = {**request.extensions, "sni_hostname": host}
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CappedStream(response.stream, request)
        return response

    async def aclose(self) -> None:
        """Close the pool."""
        await self.inner.aclose()


def _card(agent: RemoteAgentConfig, *, streams: bool = False) -> Any:
    from a2a.types import a2a_pb2 as pb

    interface = pb.AgentInterface(url=agent.url, protocol_binding="JSONRPC")
    capabilities = pb.AgentCapabilities(streaming=streams)
    return pb.AgentCard(
        name="remote", supported_interfaces=[interface], version="", capabilities=capabilities
    )


@contextlib.asynccontextmanager
async def guarded_client(
    agent: RemoteAgentConfig, token: str | None, *, read_s: float | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client to the agent: the SSRF guard, the byte cap, the token, timeouts.

    `read_s`: how long a read may wait for the next bytes (a stream), else the request's.
    """
    limit_s = min(CALL_TIMEOUT_S, agent.timeout_s)
    timeout = httpx.Timeout(limit_s, read=read_s + 1) if read_s else httpx.Timeout(limit_s)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = GuardedTransport(agent.private)
    async with httpx.AsyncClient(transport=transport, headers=headers, timeout=timeout) as hc:
        yield hc


def _run(agent: RemoteAgentConfig, token: str | None, act: Callable[[Any], Awaitable[T]]) -> T:
    """`arun` from synchronous code (a run's thread, which has no event loop)."""
    return asyncio.run(arun(agent, token, act))


async def arun(
    agent: RemoteAgentConfig,
    token: str | None,
    act: Callable[[Any], Awaitable[T]],
    *,
    stream_s: float | None = None,
) -> T:
    """`act(client)` on a fresh a2a-sdk client; every failure is one `RemoteError` line.

    `stream_s`: the client streams (SSE) and `act` may take that long (else one request,
    at most `CALL_TIMEOUT_S`); a read waits as long for the next bytes.
    """
    from a2a.client import ClientConfig, ClientFactory

    try:
        async with guarded_client(agent, token, read_s=stream_s) as hc:
            config = ClientConfig(streaming=stream_s is not None, httpx_client=hc)
            client = ClientFactory(config).create(_card(agent, streams=stream_s is not None))
            return await asyncio.wait_for(act(client), timeout=(stream_s or CALL_TIMEOUT_S) + 5)
    except RemoteError:
        raise
    except Exception as exc:  # the SDK's errors, timeouts, a hostile answer: one line
        error = _one_line(exc)
        raise type(error)(_masked(str(error), token)) from None


def _masked(text: str, token: str | None) -> str:
    """`text` without the agent's token: an agent may echo what it was sent."""
    return text.replace(token, "[redacted]") if token else text


def scrubbed(task: RemoteTask, token: str | None) -> RemoteTask:
    """The task's texts without the token (see `_masked`)."""
    if not token:
        return task
    return replace(
        task, message=_masked(task.message, token), artifact=_masked(task.artifact, token)
    )


def _one_line(exc: BaseException) -> RemoteError:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, _TooLarge | _Refused):
            return RemoteRefused(str(cause))
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    if isinstance(exc, TimeoutError):
        text = "no answer in time"
    return RemoteError(text)


def send(
    agent: RemoteAgentConfig,
    token: str | None,
    text: str,
    *,
    task_id: str | None = None,
    context_id: str | None = None,
    message_id: str | None = None,
) -> RemoteTask:
    """SendMessage without waiting for the end (`return_immediately`); the task it made.

    `task_id`: answer a task that asked for input; `context_id`: a new task in the same
    remote conversation; `message_id`: the same for a message sent again (an agent that
    keeps message ids knows it was sent).
    """
    from a2a.types import a2a_pb2 as pb

    message = pb.Message(
        message_id=message_id or uuid.uuid4().hex, role=pb.ROLE_USER, parts=[pb.Part(text=text)]
    )
    if task_id:
        message.task_id = task_id
    if context_id:
        message.context_id = context_id
    config = pb.SendMessageConfiguration(return_immediately=True, history_length=0)
    request = pb.SendMessageRequest(message=message, configuration=config)

    async def act(client: Any) -> RemoteTask:
        async for event in client.send_message(request):
            if event.HasField("task"):
                return task_of(event.task)
            if event.HasField("message"):  # an answer without a task: it ended at once
                reply = text_of(event.message.parts, MAX_RESULT_CHARS)
                ids = event.message.context_id or context_id or ""
                return RemoteTask(uuid.uuid4().hex, ids, "completed", artifact=reply)
        raise RemoteError("the agent answered with neither a task nor a message")

    found = scrubbed(_run(agent, token, act), token)
    if task_id and found.task_id != task_id:
        raise RemoteRefused(f"the agent answered for task {found.task_id[:40]!r}, not ours")
    return found


def get(agent: RemoteAgentConfig, token: str | None, task_id: str) -> RemoteTask:
    """GetTask from synchronous code (`aget`)."""
    return asyncio.run(aget(agent, token, task_id))


async def aget(agent: RemoteAgentConfig, token: str | None, task_id: str) -> RemoteTask:
    """GetTask: the task's state now (a task with another id is refused as forged)."""
    from a2a.types import a2a_pb2 as pb

    async def act(client: Any) -> RemoteTask:
        return task_of(await client.get_task(pb.GetTaskRequest(id=task_id, history_length=0)))

    found = scrubbed(await arun(agent, token, act), token)
    if found.task_id != task_id:
        raise RemoteRefused(f"the agent answered for task {found.task_id[:40]!r}, not ours")
    return found


def cancel(agent: RemoteAgentConfig, token: str | None, task_id: str) -> None:
    """CancelTask from synchronous code (`acancel`)."""
    asyncio.run(acancel(agent, token, task_id))


async def acancel(agent: RemoteAgentConfig, token: str | None, task_id: str) -> None:
    """CancelTask (what the agent answers is not read further)."""
    from a2a.types import a2a_pb2 as pb

    async def act(client: Any) -> None:
        await client.cancel_task(pb.CancelTaskRequest(id=task_id))

    await arun(agent, token, act)


_STATES = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_CANCELED": "canceled",
    "TASK_STATE_REJECTED": "rejected",
    "TASK_STATE_AUTH_REQUIRED": "auth-required",
}


def task_of(task: Any) -> RemoteTask:
    """The SDK's Task as a `RemoteTask` (text only, capped)."""
    from a2a.types import a2a_pb2 as pb

    state = _STATES.get(pb.TaskState.Name(task.status.state), "unknown")
    artifact = "\n\n".join(text_of(a.parts, MAX_RESULT_CHARS) for a in task.artifacts)
    return RemoteTask(
        task_id=str(task.id)[:200],
        context_id=str(task.context_id)[:200],
        state=state,
        message=text_of(task.status.message.parts, MAX_STATUS_CHARS),
        artifact=capped(artifact, MAX_RESULT_CHARS),
    )


def text_of(parts: Any, limit: int) -> str:
    """The text parts of a message or artifact, joined and capped at `limit`."""
    return capped("\n".join(p.text for p in parts if p.text), limit)


def capped(text: str, limit: int) -> str:
    """`text`, cut at `limit` characters with a line saying how long it was."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... cut: the remote text was {len(text)} characters]"


def host_of(url: str) -> str:
    """The URL without path or query, for messages (never a token: URLs carry none)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))
