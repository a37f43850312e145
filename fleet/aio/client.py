"""`fleet.AsyncFleet`: the `Fleet` client for asyncio programs (web apps, bots, services).

Every method is a coroutine that runs the `Fleet` call it mirrors on a thread of its own
pool, so nothing it does blocks the event loop: the store is redis-py's blocking client
behind the fleet's own Lua scripts, stream reads and outage handling (`fleet.following`),
and mirroring all of that on `redis.asyncio` would be a second store to keep in step
with the first. A thread per waiting call is what asyncio's own `to_thread` does; the
pool is this client's (`max_threads`, default 64) so that twenty waits at once are not
queued behind the loop's small default executor.

Waits and event streams are cancellable: cancelling the awaiting task (or leaving an
`async for` early) sets the thread's cancel flag, and the thread ends within
`fleet.following.CANCEL_POLL_MS`; the tree itself runs on (use `stop` to stop it).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from fleet.client import Fleet, Handle
from fleet.errors import FleetError
from fleet.models import Event, Trace
from fleet.settings import Settings

T = TypeVar("T")
DEFAULT_THREADS = 64
_END = object()


@dataclass(frozen=True)
class AsyncHandle:
    """A submitted (or continued) root, followed from asyncio."""

    trace_id: str
    fleet: AsyncFleet
    turn: int = 0
    """Which run of the root this handle follows (a continue starts a new one)."""

    async def wait(self, timeout_s: float | None = None) -> Trace:
        """The trace once it ended; `TimeoutError` after `timeout_s`."""
        return await self.fleet.wait(self.trace_id, timeout_s, turn=self.turn)

    def watch(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        """The tree's events as they happen, until the root finishes."""
        return self.fleet.watch(self.trace_id, timeout_s, turn=self.turn)

    async def trace(self) -> Trace:
        """The trace as it is now."""
        return await self.fleet.trace(self.trace_id)


class AsyncFleet:
    """`Fleet` for asyncio: `await AsyncFleet.from_env()` then `await fleet.submit(...)`."""

    def __init__(self, fleet: Fleet, *, max_threads: int = DEFAULT_THREADS) -> None:
        """Wrap a `Fleet`; at most `max_threads` of its calls run (or wait) at once."""
        self.fleet = fleet
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="async-fleet")

    @classmethod
    async def from_env(
        cls, settings: Settings | None = None, *, max_threads: int = DEFAULT_THREADS
    ) -> AsyncFleet:
        """`Fleet.from_env` (it pings Redis) off the event loop."""
        fleet = await asyncio.to_thread(Fleet.from_env, settings)
        return cls(fleet, max_threads=max_threads)

    async def __aenter__(self) -> AsyncFleet:
        """`async with AsyncFleet(...) as fleet:` closes its threads afterwards."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close (see `close`)."""
        await self.close()

    async def close(self) -> None:
        """Stop taking calls; running ones end with their cancel flags (the store stays open)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def _handle(self, handle: Handle) -> AsyncHandle:
        return AsyncHandle(handle.trace_id, self, handle.turn)

    async def submit(self, task: str, **options: Any) -> AsyncHandle:
        """`Fleet.submit`: create a root and enqueue it (same options, same errors)."""
        return self._handle(await self._call(self.fleet.submit, task, **options))

    async def explore_tree(self, tasks: list[str], **options: Any) -> AsyncHandle:
        """`Fleet.explore_tree`: one root exploring `tasks`, a read-only branch each."""
        return self._handle(await self._call(self.fleet.explore_tree, tasks, **options))

    async def trace(self, trace_id: str) -> Trace:
        """The trace as it is now; `TraceNotFound` if unknown."""
        return await self._call(self.fleet.trace, trace_id)

    async def stop(self, trace_id: str) -> list[str]:
        """Stop a trace and its subtree; the ids told to stop."""
        return await self._call(self.fleet.stop, trace_id)

    async def continue_trace(
        self, trace_id: str, message: str, after_sequence: int | None = None
    ) -> AsyncHandle:
        """`Fleet.continue_trace`: a new user message (after `after_sequence`: a rewind)."""
        call = self.fleet.continue_trace
        return self._handle(await self._call(call, trace_id, message, after_sequence))

    async def regenerate(self, trace_id: str, after_sequence: int) -> AsyncHandle:
        """`Fleet.regenerate`: the model answers message `after_sequence` again."""
        return self._handle(await self._call(self.fleet.regenerate, trace_id, after_sequence))

    async def reply(self, trace_id: str, answer: str) -> AsyncHandle:
        """Answer the question the trace waits on (`ask_human`)."""
        return self._handle(await self._call(self.fleet.reply, trace_id, answer))

    async def approve(
        self, trace_id: str, approval_id: str | None = None, digest: str | None = None
    ) -> AsyncHandle:
        """Approve the tool call the trace waits on (`Fleet.approve`)."""
        return self._handle(await self._call(self.fleet.approve, trace_id, approval_id, digest))

    async def deny(
        self,
        trace_id: str,
        reason: str,
        approval_id: str | None = None,
        digest: str | None = None,
    ) -> AsyncHandle:
        """Deny it: nothing runs, the model reads `reason` (`Fleet.deny`)."""
        call = self.fleet.deny
        return self._handle(await self._call(call, trace_id, reason, approval_id, digest))

    async def send(self, trace_id: str, text: str, **options: Any) -> str:
        """Message a running trace (`Fleet.send`); the entry id."""
        return await self._call(self.fleet.send, trace_id, text, **options)

    async def wait(self, trace_id: str, timeout_s: float | None = None, *, turn: int = 0) -> Trace:
        """The trace once it ended (run `turn`); `TimeoutError` after `timeout_s`."""
        async for _ in self.watch(trace_id, timeout_s, turn=turn):
            pass
        trace = await self.trace(trace_id)
        if not trace.is_terminal:
            raise FleetError(f"trace {trace_id!r} ended its event stream in {trace.status!r}")
        return trace

    async def watch(
        self, trace_id: str, timeout_s: float | None = None, *, turn: int = 0
    ) -> AsyncIterator[Event]:
        """The tree's events until the root finishes: `async for event in fleet.watch(id)`.

        A thread reads the stream (`Fleet.events`) and hands each event to the loop;
        leaving the loop early, or cancelling, ends that thread.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def pump() -> None:
            try:
                for event in self.fleet.events(trace_id, timeout_s, turn=turn, cancel=cancel):
                    loop.call_soon_threadsafe(queue.put_nowait, event)
                loop.call_soon_threadsafe(queue.put_nowait, _END)
            except BaseException as exc:  # handed to the awaiting task, raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        reading = loop.run_in_executor(self._pool, pump)
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()
            await asyncio.shield(reading)

    events = watch
    """`Fleet.events`' name for `watch`."""
