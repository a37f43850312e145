"""Following a remote task by streaming (SubscribeToTask over SSE), through a2a-sdk's client.

Used by the watcher (`fleet.remote.poll`) for an agent whose card says it streams
(`streams`, read once per child): `follow` reads the task's events for one window and
hands each state it adds up to (`Streamed`) to the caller, which turns progress into the
child's events and stops at an end or a question. What a stream may cost is capped:
`window_s` of time (the caller's, at most `STREAM_WINDOW_S`), `MAX_STREAM_EVENTS` events
and `wire.MAX_RESPONSE_BYTES` bytes (the transport's cap, for the whole stream); past
either cap the stream is refused (`RemoteRefused`: the child fails, the task is
cancelled). Any other trouble with the stream (the task already ended, the connection
dropped, a quiet stream) ends it quietly: the watcher then asks `GetTask`, which decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fleet.config.remote_agents import RemoteAgentConfig
from fleet.remote import wire
from fleet.remote.task import RemoteError, RemoteRefused, RemoteTask

STREAM_WINDOW_S = 20.0
"""Most seconds one watcher follows one stream before it asks again (a new subscription)."""
MAX_STREAM_EVENTS = 500
"""Most events read of one stream (one window); past it the stream is hostile."""
CARD_PATH = ".well-known/agent-card.json"


async def streams(agent: RemoteAgentConfig, token: str | None) -> bool:
    """Whether the agent's card says it streams (`capabilities.streaming`).

    The card is read beside the operator's URL (then at its host's root) through the same
    guarded, capped client; only that one flag is used, never a URL the card names. An
    agent without a readable card is polled.
    """
    from a2a.client import A2ACardResolver

    try:
        async with wire.guarded_client(agent, token) as http:
            for base in (agent.url, wire.host_of(agent.url)):
                resolver = A2ACardResolver(http, base, CARD_PATH)
                try:
                    card = await asyncio.wait_for(resolver.get_agent_card(), wire.CALL_TIMEOUT_S)
                except Exception:  # no card there (404, not a card, too large): the next
                    continue
                return bool(card.capabilities.streaming)
    except Exception:  # the address refused, the client not built: polled
        return False
    return False


class Streamed:
    """The task as a stream's events tell it so far (text capped as `wire.task_of` does)."""

    def __init__(self, task_id: str) -> None:
        """Nothing heard yet of `task_id`."""
        self.task = RemoteTask(task_id, "", "submitted")
        self.artifacts: dict[str, str] = {}

    def add(self, event: Any) -> RemoteTask:
        """The task after `event` (a StreamResponse).

        Raises:
            RemoteRefused: the event is for another task.
        """
        if event.HasField("task"):
            self._ours(event.task.id)
            self.task = wire.task_of(event.task)
            self.artifacts = {
                str(a.artifact_id)[:200]: wire.text_of(a.parts, wire.MAX_RESULT_CHARS)
                for a in event.task.artifacts
            }
        elif event.HasField("status_update"):
            update = event.status_update
            self._ours(update.task_id)
            seen = wire.task_of(_as_task(update))
            self.task = replace(seen, context_id=seen.context_id or self.task.context_id)
        elif event.HasField("artifact_update"):
            update = event.artifact_update
            self._ours(update.task_id)
            text = wire.text_of(update.artifact.parts, wire.MAX_RESULT_CHARS)
            key = str(update.artifact.artifact_id)[:200]
            joined = self.artifacts.get(key, "") + text if update.append else text
            self.artifacts[key] = joined[: wire.MAX_RESULT_CHARS + 1]
        elif event.HasField("message"):  # an answer without a task: it ended
            reply = wire.text_of(event.message.parts, wire.MAX_RESULT_CHARS)
            self.task = replace(self.task, state="completed", message="", artifact=reply)
            self.artifacts = {"": reply}
        joined = "\n\n".join(a for a in self.artifacts.values() if a)
        self.task = replace(self.task, artifact=wire.capped(joined, wire.MAX_RESULT_CHARS))
        return self.task

    def _ours(self, task_id: str) -> None:
        if task_id and task_id != self.task.task_id:
            raise RemoteRefused(f"the stream told of task {task_id[:40]!r}, not ours")


def _as_task(update: Any) -> Any:
    from a2a.types import a2a_pb2 as pb

    return pb.Task(id=update.task_id, context_id=update.context_id, status=update.status)


async def follow(
    agent: RemoteAgentConfig,
    token: str | None,
    task_id: str,
    window_s: float,
    seen: Callable[[RemoteTask], bool],
) -> None:
    """Subscribe to the task; each state to `seen` until it returns True or the window ends.

    Raises:
        RemoteRefused: the stream passed a cap or told of another task.
    """
    from a2a.types import a2a_pb2 as pb

    async def act(client: Any) -> None:
        streamed, count = Streamed(task_id), 0
        try:
            async with asyncio.timeout(window_s):
                async for event in client.subscribe(pb.SubscribeToTaskRequest(id=task_id)):
                    count += 1
                    if count > MAX_STREAM_EVENTS:
                        raise RemoteRefused(f"stream over {MAX_STREAM_EVENTS} events")
                    if seen(wire.scrubbed(streamed.add(event), token)):
                        return
        except TimeoutError:
            return  # the window ended: the watcher asks again

    try:
        await wire.arun(agent, token, act, stream_s=window_s)
    except RemoteRefused:
        raise
    except RemoteError:
        return  # ended, dropped, not offered after all: GetTask decides
