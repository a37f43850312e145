"""A stop or an interrupting message cuts the model call in flight (`fleet.loop.cut`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fleet.conversation.messages import send
from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.lifecycle import stop_subtree
from fleet.llm.base import LLMResponse
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.testing import call, text
from fleet.tools.base import ToolContext, ToolResult
from tests.fleetkit import wait_until

SLOW_S = 20.0


class SlowModel:
    """Each call takes SLOW_S unless it is the n-th in `quick`; records when each left."""

    def __init__(self, answer: LLMResponse, quick: frozenset[int] = frozenset()) -> None:
        self.answer, self.quick = answer, quick
        self.sent_at: list[float] = []
        self.requests: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()

    def complete(
        self,
        request: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        cache_key: str | None = None,
    ) -> LLMResponse:
        """An LLMClient whose calls may overlap (a cut one sleeps on in its thread)."""
        with self.lock:
            self.sent_at.append(time.monotonic())
            self.requests.append(request)
            turn = len(self.requests)
        if turn not in self.quick:
            time.sleep(SLOW_S)
        return self.answer if turn == 1 else text("after the message")


def start(store: TraceStore, workspace: Path, fn: SlowModel) -> tuple[Runtime, dict[str, Trace]]:
    settings = Settings(workspace=workspace, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": fn})
    done: dict[str, Trace] = {}

    def run() -> None:
        done["trace"] = InProcessFleet(runtime).run("task", model="test")

    threading.Thread(target=run, daemon=True).start()
    wait_until(lambda: len(fn.sent_at) == 1, 10, "the first call")
    return runtime, done


def test_a_stop_cuts_the_call_and_the_trace_ends_stopped_at_once(
    store: TraceStore, tmp_path: Path
) -> None:
    fn = SlowModel(text("an answer that must not count"))
    runtime, done = start(store, tmp_path, fn)
    trace_id = store.list_traces()[0].trace_id
    stopped_at = time.monotonic()
    stop_subtree(runtime, trace_id)
    wait_until(lambda: "trace" in done, 5, "the run's end")
    took_s = time.monotonic() - stopped_at
    assert done["trace"].status == "stopped" and done["trace"].answer is None
    assert took_s < 1.5, f"stop took {took_s:.2f} s"
    assert len(fn.sent_at) == 1


def test_a_stop_during_a_call_that_asks_for_children_creates_none(
    store: TraceStore, tmp_path: Path
) -> None:
    fn = SlowModel(call("agent", task=["a", "b"]))
    runtime, done = start(store, tmp_path, fn)
    trace_id = store.list_traces()[0].trace_id
    stop_subtree(runtime, trace_id)
    wait_until(lambda: "trace" in done, 5, "the run's end")
    assert done["trace"].status == "stopped"
    assert store.children(trace_id) == []


def test_an_interrupt_starts_the_next_call_at_once_with_the_message(
    store: TraceStore, tmp_path: Path
) -> None:
    fn = SlowModel(text("the slow answer"), quick=frozenset({2}))
    runtime, done = start(store, tmp_path, fn)
    trace_id = store.list_traces()[0].trace_id
    sent_at = time.monotonic()
    send(runtime, trace_id, "switch to plan B", sender="lead", interrupt=True)
    wait_until(lambda: "trace" in done, 5, "the run's end")
    assert fn.sent_at[1] - sent_at < 1.0, "the next request left within a second"
    assert done["trace"].status == "completed" and done["trace"].answer == "after the message"
    users = [str(m["content"]) for m in fn.requests[1] if m["role"] == "user"]
    assert any('from "lead": "switch to plan B"' in u for u in users)
    assert not any(m["role"] == "assistant" for m in fn.requests[1]), "the cut call left nothing"
    assert done["trace"].stats.prompt_tokens == 0 or done["trace"].stats.messages >= 1


def test_a_plain_message_does_not_cut_the_call(store: TraceStore, tmp_path: Path) -> None:
    fn = SlowModel(text("done"), quick=frozenset({1}))
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": fn})
    trace = InProcessFleet(runtime).run("task", model="test")
    assert trace.status == "completed" and len(fn.sent_at) == 1


def test_a_stop_cuts_a_tool_in_flight_and_the_trace_ends_stopped(
    store: TraceStore, tmp_path: Path
) -> None:
    started = threading.Event()

    def slow_tool(ctx: ToolContext) -> ToolResult:
        """Take a long time."""
        started.set()
        time.sleep(SLOW_S)
        return ToolResult("slow", "done")

    fn = SlowModel(call("slow_tool"), quick=frozenset({1, 2}))
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"test": fn})
    runtime.tools.register(slow_tool, read_only=True)
    done: dict[str, Trace] = {}
    threading.Thread(
        target=lambda: done.update(trace=InProcessFleet(runtime).run("task", model="test")),
        daemon=True,
    ).start()
    assert started.wait(10)
    trace_id = store.list_traces()[0].trace_id
    stopped_at = time.monotonic()
    stop_subtree(runtime, trace_id)
    wait_until(lambda: "trace" in done, 5, "the run's end")
    assert time.monotonic() - stopped_at < 1.5
    assert done["trace"].status == "stopped" and len(fn.sent_at) == 1


class _Reads:
    """A stop flag and an inbox that count the watcher's reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.stop = False

    def stop_requested(self, trace_id: str) -> bool:
        self.reads += 1
        return self.stop

    def after(self, trace_id: str, cursor: str | None, limit: int) -> list[Any]:
        self.reads += 1
        return []

    def newest(self, trace_id: str) -> str | None:
        self.reads += 1
        return None


def test_a_call_shorter_than_a_poll_reads_nothing_and_a_stop_still_cuts_a_long_one() -> None:
    from fleet.loop.cut import POLL_S, CallCut, CallWatcher, cuttable
    from fleet.storage.writes import InboxSeen

    reads = _Reads()
    watcher = CallWatcher(reads, reads)  # type: ignore[arg-type]
    with watcher.watching("t1", seen=InboxSeen(None)) as watch:
        assert cuttable(watch, lambda: "answer") == "answer"
    time.sleep(POLL_S * 3)  # the watcher's thread wakes, finds no call, and ends
    assert reads.reads == 0, "the run read the stop flag and the inbox as the call left"
    reads.stop = True
    release = threading.Event()
    started = time.monotonic()
    try:
        with watcher.watching("t1", seen=InboxSeen(None)) as watch:
            cuttable(watch, lambda: release.wait(30))
        raise AssertionError("not cut")
    except CallCut as cut:
        assert cut.reason == "stop"
    finally:
        release.set()
    assert reads.reads >= 1 and time.monotonic() - started < 10  # a poll, with a big margin
