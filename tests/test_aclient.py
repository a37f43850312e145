"""`fleet.AsyncFleet`: the client from asyncio, never blocking the event loop.

On a real worker process: twenty trees submitted and awaited together while a timer task
in the same loop ticks every 10 ms (its worst lateness is the measure: a blocking call
would hold it for the length of a tree); a watched tree's events; a stop; a continue.
Reply, approve, deny and regenerate on an in-process fleet.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet import AsyncFleet
from fleet.client import Fleet
from fleet.config.approval_rules import ApprovalRule
from fleet.conversation import approval
from fleet.errors import ConfigError, ConversationError
from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import LLMResponse
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text
from tests.servekit import InlineBackend

TREES = 20
TICK_S = 0.010
MAX_LATE_S = 1.0
"""A bound on one tick's lateness that a busy 2-core machine keeps (0.4 s was seen in a full
run beside six test processes); a blocking wait holds the loop for the length of a tree,
two model calls of CALL_MS each and more (over two seconds)."""
CALL_MS = 1200


def script(path: Path, steps: list[dict[str, Any]], latency_ms: int = 0) -> str:
    body = {"latency_ms": latency_ms, "scripts": [{"match": ".*", "steps": steps}]}
    path.write_text(yaml.safe_dump(body))
    return f"scripted:{path}"


async def ticking(stop: asyncio.Event, late: list[float]) -> None:
    """Tick every TICK_S until `stop`; keep how late each tick woke."""
    due = time.monotonic()
    while not stop.is_set():
        due += TICK_S
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        late.append(time.monotonic() - due)


@pytest.mark.integration
def test_twenty_trees_are_awaited_together_and_the_loop_keeps_ticking(
    worker_fleet: Fleet, tmp_path: Path
) -> None:
    looks = [{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}]
    model = script(tmp_path / "m.yaml", [*looks, {"content": "done: {task}"}], latency_ms=CALL_MS)

    async def main() -> tuple[list[Any], list[float], float]:
        late: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(ticking(stop, late))
        async with AsyncFleet(worker_fleet) as fleet:
            started = time.monotonic()
            handles = await asyncio.gather(
                *(fleet.submit(f"task {i}", model=model) for i in range(TREES))
            )
            done = await asyncio.gather(*(h.wait(timeout_s=120) for h in handles))
            took = time.monotonic() - started
        stop.set()
        await ticker
        return done, late, took

    done, late, took = asyncio.run(main())
    assert [t.status for t in done] == ["completed"] * TREES
    assert sorted(t.answer for t in done) == sorted(f"done: task {i}" for i in range(TREES))
    worst = max(late)
    print(f"\n{TREES} trees in {took:.2f} s; {len(late)} ticks, worst {worst * 1000:.1f} ms late")
    assert len(late) >= took / TICK_S * 0.5, "the timer ticked throughout"
    assert worst < MAX_LATE_S, f"a tick was {worst * 1000:.0f} ms late: something blocked"


@pytest.mark.integration
def test_watch_stop_and_continue_from_asyncio(worker_fleet: Fleet, tmp_path: Path) -> None:
    quick = script(tmp_path / "q.yaml", [{"content": "said: {last_user}"}])
    looping = [
        {"tool_calls": [{"name": "list_dir", "arguments": {"path": "/".join(["."] * n)}}]}
        for n in range(1, 40)
    ]
    slow = script(tmp_path / "s.yaml", looping, latency_ms=200)

    async def main() -> tuple[list[str], str, str, int]:
        async with AsyncFleet(worker_fleet) as fleet:
            handle = await fleet.submit("first", model=quick)
            kinds: list[str] = [event.kind async for event in handle.watch(timeout_s=60)]
            going_on = await fleet.continue_trace(handle.trace_id, "second")
            answer = (await going_on.wait(timeout_s=60)).answer or ""
            long = await fleet.submit("forever", model=slow)
            async for event in long.watch(timeout_s=60):
                if event.kind == "message":  # it runs: stop it mid-way
                    break
            await fleet.stop(long.trace_id)
            stopped = await long.wait(timeout_s=60)
            return kinds, answer, stopped.status, going_on.turn

    kinds, answer, status, turn = asyncio.run(main())
    assert kinds[-1] == "finish" and "message" in kinds
    assert (answer, turn) == ("said: second", 1)
    assert status == "stopped"


def waiter(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """Asks a person, then writes a file (a call to approve), then answers."""
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return call("ask_human", question="which file?")
    if len(results) == 1:
        return call("write_file", path=str(results[0]["content"]), content="x")
    return text(f"wrote it: {results[-1]['content'][:40]}")


def test_reply_approve_and_regenerate_from_asyncio(store: TraceStore, tmp_path: Path) -> None:
    settings = Settings(workspace=tmp_path, env={})
    clients = {"test": ScriptedModel(function=waiter)}
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients=clients)
    default = replace(runtime.presets["default"], approve=(ApprovalRule("write_file"),))
    runtime = replace(runtime, presets={**runtime.presets, "default": default})
    sync = Fleet(runtime, InlineBackend(runtime))  # an enqueued trace runs to its next wait

    async def main() -> tuple[str, str]:
        fleet = AsyncFleet(sync)
        handle = await fleet.submit("make a file", model="test")
        assert (await handle.trace()).status == "waiting"
        await fleet.reply(handle.trace_id, "out.txt")
        pending = approval.pending(await handle.trace()) or {}
        done = await fleet.approve(handle.trace_id, pending["tool_call_id"], pending["digest"])
        finished = await done.trace()
        with pytest.raises(ConversationError):
            await fleet.approve(handle.trace_id)  # answered already: the error comes through
        task = next(m for m in store.messages(handle.trace_id) if m.role == "user")
        again = await fleet.regenerate(handle.trace_id, task.sequence)
        status = (await again.trace()).status
        await fleet.close()
        return finished.answer or "", status

    answer, status = asyncio.run(main())
    assert answer.startswith("wrote it") and (tmp_path / "out.txt").read_text() == "x"
    assert status == "waiting", "regenerated from the task: it asks again"


class _Idle:
    """A backend that queues and never runs: a trace stays `queued`, a wait never ends."""

    def enqueue(self, trace: Any, priority: str = "interactive") -> None:
        pass

    def revoke(self, stamps: list[str]) -> None:
        pass

    def queue(self, mode: str) -> str | None:
        return None


def test_refusals_come_through_and_a_cancelled_wait_frees_its_thread(
    store: TraceStore, tmp_path: Path
) -> None:
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(
        settings, store, InProcessDispatcher(), clients={"test": ScriptedModel(function=waiter)}
    )
    sync = Fleet(runtime, _Idle())

    async def main() -> None:
        fleet = AsyncFleet(sync, max_threads=1)  # one thread: a leaked wait would hold it
        with pytest.raises(ConfigError, match="unknown preset 'nope'"):
            await fleet.submit("x", model="test", preset="nope")
        handle = await fleet.submit("never runs", model="test")
        waiting = asyncio.create_task(handle.wait())
        await asyncio.sleep(0.3)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # the only thread is free again: this call answers (it would hang otherwise)
        trace = await asyncio.wait_for(fleet.trace(handle.trace_id), 2.0)
        assert trace.status == "queued"
        with pytest.raises(TimeoutError):
            await handle.wait(timeout_s=0.3)
        await fleet.close()

    asyncio.run(main())
    assert store.list_traces(10)[0].status == "queued", "the tree itself was left as it was"
