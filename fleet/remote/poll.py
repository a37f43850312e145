"""The watcher of the parked remote children: each worker's one loop follows their tasks.

Each due entry of the watch list is taken by one worker's watcher (`RemoteWatch.due`),
which follows its task once (`follow_one`): over SSE for an agent whose card says it
streams (`fleet.remote.stream`: every status note becomes the child's event as it comes,
for one window), then one `GetTask`, which decides what the stream did not (an end between
two windows, a quiet stream, a deadline, an agent gone). `run.apply` writes what it means;
True comes back for a child whose task ended, for the host to send to a worker (the run
that finishes the child and settles its parent). A child that ended here already
(`fleet stop`, the tree's budget) has its remote task cancelled and leaves the list; a
stop that lands while a stream is followed ends that stream within one poll interval.

Every call here runs on the watcher's event loop: the remote agent's requests are awaited
(many tasks followed at once on one thread), the Redis reads and writes are short and
made in place.
"""

from __future__ import annotations

import asyncio
import logging

from fleet.config.remote_agents import RemoteAgentConfig
from fleet.errors import FleetError, TraceNotFound
from fleet.lifecycle.remote import RemoteCall, call_of
from fleet.models import Trace, now_ms
from fleet.remote import run
from fleet.remote.decide import AskPerson, Decision, Ended, Progress, Unchanged, decide
from fleet.remote.task import RemoteRefused, RemoteTask
from fleet.runtime import Runtime
from fleet.storage.remote_watch import REMOTE_WATCH, RemoteWatch

log = logging.getLogger(__name__)

MAX_FOLLOWED = 64
"""Most remote tasks one watcher follows at once (each a stream or a request)."""
CLAIM_MS = 60_000
"""A taken entry is due again after this if its watcher died mid-follow (> a stream window)."""


def claim_due(runtime: Runtime, limit: int) -> list[str]:
    """Take at most `limit` due entries (each due again one claim later, unless re-scored)."""
    watch = runtime.store.capability(REMOTE_WATCH)
    return watch.due(now_ms(), limit, CLAIM_MS)


async def follow_one(runtime: Runtime, trace_id: str) -> bool:
    """Follow one child's task once; True when the child is to be run (its task ended)."""
    watch = runtime.store.capability(REMOTE_WATCH)
    try:
        return await _follow(runtime, watch, trace_id)
    except FleetError as exc:  # one child's trouble never stops the others'
        log.warning("watch of remote child %r: %s", trace_id, exc)
        return False


async def _follow(runtime: Runtime, watch: RemoteWatch, trace_id: str) -> bool:
    try:
        trace = runtime.store.get_trace(trace_id)
    except TraceNotFound:
        watch.forget(trace_id)
        return False
    call = call_of(trace)
    if call is None or call.task_id is None:
        watch.forget(trace_id)
        return False
    again_ms = now_ms() + int(runtime.settings.remote_poll_s * 1000)
    agent: RemoteAgentConfig | None = None
    token: str | None = None
    try:
        agent, token = run.agent_of(runtime, call)
    except FleetError:
        pass  # gone from fleet.yaml: no cancel is possible, the child fails below
    if trace.is_terminal:  # stopped or cut while it waited: the remote task goes too
        if agent is not None:
            await run.acancel_task(agent, token, call)
        watch.forget(trace_id)
        return False
    if trace.status != "waiting" or call.state != "sent":
        watch.watch(trace_id, again_ms)  # a run holds it, or a person: look again later
        return False
    if agent is None:  # left fleet.yaml (or lost its token) while it waited: a run fails it
        watch.forget(trace_id)
        run.apply(runtime, trace, run.gone(call))
        return True
    trace, decision = await _decision(runtime, trace, agent, token, call)
    if _ended_meanwhile(runtime, trace_id):  # a stop landed during the follow
        await run.acancel_task(agent, token, call)
        watch.forget(trace_id)
        return False
    run.apply(runtime, trace, decision)
    if isinstance(decision, Ended):
        watch.forget(trace_id)
        return True
    # Still watched while a person is asked: a stop then must cancel the remote task too.
    streamed = decision.call.streams and not isinstance(decision, AskPerson)
    watch.watch(trace_id, now_ms() if streamed else again_ms)
    return False


async def _decision(
    runtime: Runtime, trace: Trace, agent: RemoteAgentConfig, token: str | None, call: RemoteCall
) -> tuple[Trace, Decision]:
    """What the task says now: a window of its stream (if it streams), else one GetTask."""
    found: Decision | None = None
    if call.streams is None:
        trace, call = await _read_card(runtime, trace, agent, token, call)
    if call.streams:
        trace, found = await _stream(runtime, trace, agent, token, call)
        call = call_of(trace) or call
    if found is None:
        return trace, await run.aobserve(agent, token, call)
    if isinstance(found, Ended) and found.cancel:  # the call before it ended: still running
        await run.acancel_task(agent, token, call)
    return trace, found


async def _read_card(
    runtime: Runtime, trace: Trace, agent: RemoteAgentConfig, token: str | None, call: RemoteCall
) -> tuple[Trace, RemoteCall]:
    """Whether the agent streams, read once per child from its card and kept in the call."""
    from fleet.remote import stream  # a2a-sdk: loaded by a follow, not by a worker's start

    call = call.model_copy(update={"streams": await stream.streams(agent, token)})
    runtime.store.update_run(trace.trace_id, remote_call=call)
    return trace.with_run(remote_call=call), call


async def _stream(
    runtime: Runtime, trace: Trace, agent: RemoteAgentConfig, token: str | None, call: RemoteCall
) -> tuple[Trace, Decision | None]:
    """One window of the task's stream: progress written as it comes; the end or a question.

    None: neither came in the window (or the stream could not be read, or a stop came).
    """
    from fleet.remote import stream  # a2a-sdk: loaded by a follow, not by a worker's start

    left_s = (call.deadline_ms - now_ms()) / 1000 if call.deadline_ms else stream.STREAM_WINDOW_S
    window_s = min(stream.STREAM_WINDOW_S, left_s)
    if window_s <= 0:
        return trace, None  # past its deadline: GetTask's decision ends it
    now: dict[str, Trace | Decision] = {"trace": trace}

    def seen(task: RemoteTask) -> bool:
        held = now["trace"]
        assert isinstance(held, Trace)
        decision = decide(call_of(held) or call, task, now_ms())
        if isinstance(decision, Progress | Unchanged):
            now["trace"] = run.apply(runtime, held, decision)[0]
            return False
        now["decision"] = decision
        return True

    following = asyncio.create_task(stream.follow(agent, token, str(call.task_id), window_s, seen))
    stopping = asyncio.create_task(_until_stopped(runtime, trace.trace_id))
    await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not following.done():  # a stop: the stream ends here, the caller cancels the task
        following.cancel()
        return _held(now), None
    try:
        following.result()
    except RemoteRefused as exc:  # over a cap, another task's events: fail it, cancel it
        ended = decide(call_of(_held(now)) or call, exc, now_ms())
        return _held(now), Ended(ended.call, cancel=True)
    found = now.get("decision")
    return _held(now), found if isinstance(found, Ended | AskPerson) else None


def _held(now: dict[str, Trace | Decision]) -> Trace:
    held = now["trace"]
    assert isinstance(held, Trace)
    return held


async def _until_stopped(runtime: Runtime, trace_id: str) -> None:
    while not _ended_meanwhile(runtime, trace_id):
        await asyncio.sleep(runtime.settings.remote_poll_s)


def _ended_meanwhile(runtime: Runtime, trace_id: str) -> bool:
    try:
        return runtime.store.get_trace(trace_id).status != "waiting"
    except TraceNotFound:
        return True
