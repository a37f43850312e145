"""A provider that keeps failing, a store that goes away: handed back, never lost or hung."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import TransientLLMError
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner, run_safely
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.writes import TraceWrite, WriteResult
from fleet.testing import ScriptedModel
from tests.test_runner import make_fleet


class FailingModel(ScriptedModel):
    """Fails every call the way an exhausted client retry does."""

    def complete(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        raise TransientLLMError("flaky request failed after 4 attempts; last: HTTP 503")


def test_a_provider_error_hands_the_run_back_with_backoff_then_fails_clearly(
    tmp_path: Path,
) -> None:
    local = make_fleet(tmp_path, FailingModel(), transient_retries=3)
    root = create_root(local.runtime, TaskSpec(task="work", model="test"))
    delays = []
    for _ in range(3):
        result = Runner(local.runtime).run(root.trace_id)
        assert result.outcome == "throttled"
        delays.append(result.retry_in_s)
        assert local.store.get_trace(root.trace_id).status == "queued"
    assert delays == [2.0, 4.0, 8.0]
    requeued = [
        e.data
        for _, e in local.store.read_events(root.trace_id)
        if e.kind == "trace" and e.status == "queued" and e.data
    ]  # what the page's timeline shows as a wait on a limit or countdown
    assert requeued == [{"on": "provider error", "retry_in_s": d} for d in delays]
    assert local.store.get_trace(root.trace_id).run.transient_retries == 3
    assert Runner(local.runtime).run(root.trace_id).outcome == "failed"
    trace = local.store.get_trace(root.trace_id)
    assert trace.status == "failed"
    assert trace.error == (
        "flaky request failed after 4 attempts; last: HTTP 503 (gave up after 3 re-runs)"
    )


class StoreAway(Exception):
    """What a client library raises while the server cannot be reached."""


class FlakyStore(MemoryStore):
    """A MemoryStore whose batched writes fail while `away` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.away = threading.Event()  # shared with the runner's fenced view

    def unavailable(self, exc: BaseException) -> bool:
        return isinstance(exc, StoreAway)

    def apply(self, write: TraceWrite) -> WriteResult:
        if self.away.is_set():
            raise StoreAway("connection refused")
        return super().apply(write)


class GoesAway(ScriptedModel):
    def __init__(self, store: FlakyStore) -> None:
        super().__init__(["the answer"])
        self.store = store

    def complete(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> LLMResponse:
        self.store.away.set()  # Redis restarts while the model thinks
        return super().complete(messages, tools, **kw)


def test_a_run_cut_off_from_the_store_keeps_its_lease_to_lapse_and_is_not_failed(
    tmp_path: Path,
) -> None:
    local = make_fleet(tmp_path, ScriptedModel([]))
    store = FlakyStore()
    runtime = local.runtime.__class__.build(local.runtime.settings, store, local.runtime.dispatcher)
    runtime.clients["test"] = GoesAway(store)
    root = create_root(runtime, TaskSpec(task="work", model="test"))

    result = run_safely(Runner(runtime), root.trace_id)

    assert result.outcome == "interrupted"
    store.away.clear()
    trace = store.get_trace(root.trace_id)
    assert trace.status == "running", "not failed: a sweeper resumes it"
    assert store.lease_holder(root.trace_id) is not None, "left to lapse, not released"
    assert store.expired_leases(10**15) == [root.trace_id]  # the sweeper will find it


def test_a_run_of_a_trace_with_no_record_is_one_line_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by bench/chaos.py: a Cluster master killed before its replica had a new root;
    # the root's task still reached a worker, whose run logged "crashed" with a
    # TraceNotFound traceback, then raised it again from the failing of a trace not there.
    local = make_fleet(tmp_path, ScriptedModel())
    caplog.set_level(logging.WARNING, "fleet.loop.runner")

    result = run_safely(Runner(local.runtime), "20261129T013522-ade94d")

    assert result.outcome == "gone"
    (record,) = caplog.records
    assert record.exc_info is None
    assert "dropped: the trace has no record" in record.getMessage()
