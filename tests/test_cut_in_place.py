"""A model call whose client ends on a cancel runs in the run's own thread, and is still cut.

`fleet.loop.cut`: the HTTP clients and the scripted model (`LLMClient.ends_on_cancel`) are
not handed to a spare thread (that hop cost ~2 ms per call); the watcher cancels the
call's handle when it finds a stop or an interrupting message, and the run raises
`CallCut`. A client that does not end on a cancel keeps the hop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

from fleet.inprocess import InProcessDispatcher, InProcessFleet
from fleet.lifecycle import stop_subtree
from fleet.llm import base as llm_base
from fleet.llm import cancel
from fleet.llm.base import LLMClient, LLMResponse
from fleet.llm.cancel import CallCancelled, Cancel, cancelling
from fleet.llm.openai import OpenAIClient
from fleet.llm.retry import RetryPolicy, send_with_retry
from fleet.llm.scripted import ScriptedModel
from fleet.llm.transport import CutBackend, CutStream
from fleet.loop import cut
from fleet.loop.cut import CallCut, CallWatcher, SpareThreads, cuttable
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.store import TraceStore
from fleet.storage.writes import InboxSeen
from fleet.testing import text
from tests.fake_held_provider import HeldProvider
from tests.fleetkit import wait_until

SLOW_S = 20.0


class CountingSpares(SpareThreads):
    """Spare threads that count the calls handed to them."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0

    def run(self, work: Callable[[], None]) -> None:
        self.handed += 1
        super().run(work)


@pytest.fixture
def spares(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingSpares]:
    counting = CountingSpares()
    monkeypatch.setattr(cut, "_SPARE", counting)
    yield counting


class ThreadNoting(ScriptedModel):
    """A scripted model (no function: it ends on a cancel) noting each call's thread."""

    def __init__(self, answers: list[LLMResponse | str], latency_ms: int = 0) -> None:
        super().__init__(answers, latency_ms=latency_ms)
        self.threads: list[threading.Thread] = []

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kw: Any
    ) -> LLMResponse:
        self.threads.append(threading.current_thread())
        return super().complete(messages, tools, **kw)


def runtime_with(store: TraceStore, tmp_path: Path, client: LLMClient) -> Runtime:
    settings = Settings(workspace=tmp_path, env={})
    return Runtime.build(settings, store, InProcessDispatcher(), clients={"test": client})


def test_a_scripted_models_call_runs_on_the_runs_thread(
    store: TraceStore, tmp_path: Path, spares: CountingSpares
) -> None:
    model = ThreadNoting([text("done")])
    trace = InProcessFleet(runtime_with(store, tmp_path, model)).run("task", model="test")
    assert trace.status == "completed" and trace.answer == "done"
    assert model.threads == [threading.current_thread()]
    assert spares.handed == 0, "no spare thread was handed the model call"


def test_a_client_that_does_not_end_on_a_cancel_keeps_the_hop(
    store: TraceStore, tmp_path: Path, spares: CountingSpares
) -> None:
    seen: list[threading.Thread] = []

    def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        seen.append(threading.current_thread())
        return text("done")

    model = ScriptedModel(function=answer)  # code's function may block: not in place
    trace = InProcessFleet(runtime_with(store, tmp_path, model)).run("task", model="test")
    assert trace.status == "completed"
    assert spares.handed == 1 and seen[0] is not threading.current_thread()


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_base, "ALLOW_MODEL_REQUESTS", True)  # the local provider only


def _openai(provider: HeldProvider) -> OpenAIClient:
    return OpenAIClient(f"{provider.url}/v1", "", "fake-model")


def test_an_http_models_call_runs_on_the_runs_thread(
    store: TraceStore, tmp_path: Path, spares: CountingSpares, loopback: None
) -> None:
    with HeldProvider(lambda m: text("done"), lambda m: 0.0) as provider:
        client = _openai(provider)
        assert client.ends_on_cancel
        trace = InProcessFleet(runtime_with(store, tmp_path, client)).run("task", model="test")
        client.close()
    assert trace.status == "completed" and trace.answer == "done"
    assert spares.handed == 0, "no spare thread was handed the model call"


def test_a_stop_cuts_an_http_call_on_the_runs_thread_within_the_poll(
    store: TraceStore, tmp_path: Path, spares: CountingSpares, loopback: None
) -> None:
    with HeldProvider(lambda m: text("too late"), lambda m: SLOW_S) as provider:
        client = _openai(provider)
        runtime = runtime_with(store, tmp_path, client)
        done: dict[str, Trace] = {}
        threading.Thread(
            target=lambda: done.update(trace=InProcessFleet(runtime).run("task", model="test")),
            daemon=True,
        ).start()
        wait_until(lambda: len(provider.in_flight()) == 1, 10, "the request held")
        stopped_at = time.monotonic()
        stop_subtree(runtime, store.list_traces()[0].trace_id)
        wait_until(lambda: "trace" in done, SLOW_S / 2, "the run's end")
        took_s = time.monotonic() - stopped_at
        wait_until(lambda: len(provider.cancelled()) == 1, 5, "the provider saw it go")
        client.close()
    assert done["trace"].status == "stopped" and done["trace"].answer is None
    assert took_s < SLOW_S / 4, f"the stop took {took_s:.1f} s: the call was not cut"
    assert spares.handed == 0 and len(provider.requests) == 1, "cut on the run's thread"


class _Flags:
    """A stop flag and an empty inbox for a bare `CallWatcher`."""

    def __init__(self) -> None:
        self.stop = False

    def stop_requested(self, trace_id: str) -> bool:
        return self.stop

    def after(self, trace_id: str, cursor: str | None, limit: int) -> list[Any]:
        return []

    def newest(self, trace_id: str) -> str | None:
        return None


def test_in_place_a_cut_ends_a_pause_and_an_answer_that_came_is_kept(
    spares: CountingSpares,
) -> None:
    flags = _Flags()
    watcher = CallWatcher(flags, flags)  # type: ignore[arg-type]

    def answered_as_the_cut_landed() -> str:
        flags.stop = True
        wait_until(lambda: cancel.current() is not None and cancel.current().cancelled, 10, "cut")  # type: ignore[union-attr]
        return "the answer"

    with watcher.watching("t1", seen=InboxSeen(None)) as watch:
        assert cuttable(watch, answered_as_the_cut_landed, in_place=True) == "the answer"
    flags.stop = False
    ran_on: list[threading.Thread] = []

    def slow() -> None:
        ran_on.append(threading.current_thread())
        flags.stop = True
        cancel.pause(SLOW_S)  # the scripted model's latency, the retries' backoff

    started = time.monotonic()
    with pytest.raises(CallCut) as cut_, watcher.watching("t2", seen=InboxSeen(None)) as watch:
        cuttable(watch, slow, in_place=True)
    assert cut_.value.reason == "stop" and time.monotonic() - started < SLOW_S / 4
    assert ran_on == [threading.current_thread()] and spares.handed == 0


def test_a_call_cancelled_in_its_backoff_makes_no_further_attempt() -> None:
    sent: list[int] = []
    handle = Cancel()

    def send() -> httpx.Response:
        sent.append(1)
        threading.Timer(0.05, handle.cancel).start()  # lands in the backoff
        raise httpx.ConnectError("refused")

    policy = RetryPolicy(max_attempts=4, base_delay_s=SLOW_S, random_fraction=lambda: 0.99)
    started = time.monotonic()
    with cancelling(handle), pytest.raises(CallCancelled):
        send_with_retry(send, provider="p", api_key_env="", policy=policy)
    assert sent == [1] and time.monotonic() - started < SLOW_S / 4


class _HungConnect(httpcore.NetworkBackend):
    """A backend whose connect hangs until released (a blackholed address, a slow DNS)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        self.release.wait(SLOW_S)
        closed = self.closed

        class Opened(httpcore.NetworkStream):
            def close(self) -> None:
                closed.set()

        return Opened()


def test_a_cut_lands_while_a_new_connection_is_still_connecting() -> None:
    inner = _HungConnect()
    backend = CutBackend(inner)
    handle = Cancel()
    threading.Timer(0.05, handle.cancel).start()
    started = time.monotonic()
    with cancelling(handle), pytest.raises(CallCancelled):
        backend.connect_tcp("192.0.2.1", 443, timeout=SLOW_S)
    assert time.monotonic() - started < SLOW_S / 4, "the connect was abandoned at the cut"
    inner.release.set()
    assert inner.closed.wait(5), "the abandoned connect closed what it opened"
    assert isinstance(CutBackend(_Opened()).connect_tcp("h", 1), CutStream), "no handle: inline"


class _Opened(httpcore.NetworkBackend):
    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return httpcore.NetworkStream()
