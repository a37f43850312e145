"""A model turn through a provider batch: the stored answer taken, or the call parked.

The route (`fleet.loop.route.decide`) is chosen by `route.ask_model`; these are its
two batch-only steps, kept apart so the live path reads as before.
"""

from __future__ import annotations

from typing import Any

from fleet.batchapi.route import Parked, Route, park, take
from fleet.errors import HookBlocked
from fleet.history import to_wire
from fleet.limits.gate import Go
from fleet.llm.base import LLMResponse
from fleet.models import Message, Trace
from fleet.runtime import Runtime


def taken(runtime: Runtime, trace: Trace, go: Go, path: list[Message]) -> LLMResponse | None:
    """The provider batch's stored answer to this turn, settled with the gate; None if none.

    Its `chat` span is opened and closed here: the answer and its batch id, not the wait.
    """
    answer = take(runtime, trace)
    if answer is None:
        return None
    runtime.hooks.turn_started(trace, trace.iteration)
    try:
        runtime.hooks.model_requested(trace, go.model_name, to_wire(path))
    except HookBlocked:
        runtime.gate.after(go, None, None)
        raise
    runtime.gate.after(go, answer, None)  # settled at the batch price
    return answer


def park_turn(
    runtime: Runtime,
    trace: Trace,
    go: Go,
    request: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    route: Route,
) -> Parked:
    """Queue the turn's call for the next provider batch; the trace waits on it, unleased.

    The budget's reservation is given back now and made again when the answer is read.
    """
    runtime.gate.after(go, None, None)
    sent, tools = request
    body: dict[str, Any] = {"messages": sent, "tools": tools}
    body |= {"temperature": runtime.temperature(trace)}
    body["max_output_tokens"] = go.max_output_tokens
    return park(runtime, trace, go.model_name, body, route)
