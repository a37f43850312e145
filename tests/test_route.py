"""A model turn's route and a run's waits are values the runner matches (`fleet.loop`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.batchapi.route import CALL_KEY
from fleet.llm.base import LLMResponse
from fleet.loop.resume import heal
from fleet.loop.route import FromBatch, Live, Route, ToBatch, batched, decide
from fleet.loop.steps import OnApproval, OnPerson
from fleet.models import Message, Trace
from fleet.runstate import BatchCallState, BatchWait, RunState
from fleet.storage.backends.memory.store import MemoryStore
from fleet.testing import ScriptedModel, call, text
from tests.test_approval import local_fleet, writer


def batch_trace(state: BatchCallState | None) -> Trace:
    parked = None if state is None else BatchWait(custom_id="fc1", state=state)
    run = RunState(batch_api=True, waiting_on_batch=parked)
    return Trace(trace_id="t1", root_trace_id="t1", task="x", run=run)


@pytest.mark.parametrize(
    ("trace", "route"),
    [
        (Trace(trace_id="t1", root_trace_id="t1", task="x"), Live()),
        (batch_trace(None), ToBatch(fresh=True)),
        (batch_trace("consumed"), ToBatch(fresh=True)),
        (batch_trace("parked"), ToBatch(fresh=False)),
        (batch_trace("cancelled"), ToBatch(fresh=False)),
        (batch_trace("answered"), FromBatch()),
        (batch_trace("live"), Live(note=False, batched=True)),
    ],
)
def test_the_route_follows_the_run_state(trace: Trace, route: Route) -> None:
    assert decide(MemoryStore(), trace, []) == route
    assert batched(route) == isinstance(route, ToBatch | FromBatch)


def test_an_answer_already_on_the_path_makes_the_turn_fresh() -> None:
    taken = Message(trace_id="t1", role="assistant", content="hi", metadata={CALL_KEY: "fc1"})
    assert decide(MemoryStore(), batch_trace("answered"), [taken]) == ToBatch(fresh=True)


def asker(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    if not any(m["role"] == "tool" for m in messages):
        return call("ask_human", call_id="q1", question="which colour?")
    return text("done")


@pytest.mark.parametrize(("answer", "waits"), [(writer, OnApproval("w1")), (asker, OnPerson("q1"))])
def test_a_resumed_trace_says_what_it_still_waits_on(
    tmp_path: Path, answer: Any, waits: OnApproval | OnPerson
) -> None:
    store = MemoryStore()
    local = local_fleet(store, tmp_path, ScriptedModel(function=answer))
    trace = local.run("go", model="test")
    assert trace.status == "waiting"
    assert heal(local.runtime, trace, store.messages(trace.trace_id)) == waits
