"""A batch trace's model turn: park it in the queue, or take the answer the poller stored.

The turn's custom id is the trace's turn: a hash of the trace id and the sequence the
model's message will get (`custom_id_of`), so a redelivered run, a resend by the owner
check or a sweeper's recovery finds the same call and queues nothing new. The trace's
run state (`run.waiting_on_batch`, a `fleet.runstate.BatchWait`) says where its call is:

- `parked`: queued or in a provider batch; a run that finds no answer parks again (the
  note of the turn was written when it first parked: it is not written twice).
- `answered`: the poller stored the answer; the run takes it instead of calling the model.
- `live`: it errored in its batch and the operator wants errors retried live.
- `consumed`: the answer is in the trace; the next park deletes it from Redis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleet import lifecycle
from fleet.errors import ConfigError
from fleet.llm.base import LLMResponse, ToolCall, Usage
from fleet.models import Message, Trace, now_ms
from fleet.runstate import BatchWait
from fleet.runtime import Runtime
from fleet.storage.batch_calls import CallStates, Flushes, PendingCall, batch_calls

COUNT_LIMIT = 1_000_000
"""Most queued calls `in_batches` counts (ids and times only)."""
CALL_KEY = "batch_call"
"""Message metadata: the custom id whose answer this assistant message is."""

Route = Literal["live", "fresh", "parked", "answered", "retry_live"]
BATCHED: tuple[Route, ...] = ("fresh", "parked", "answered")
"""The routes whose call goes into a provider batch (or takes the answer one gave)."""


@dataclass(frozen=True)
class Parked:
    """The turn's call waits in a provider batch; the run ends `parked`."""

    custom_id: str
    kind: Literal["parked"] = "parked"


def custom_id_of(trace_id: str, sequence: int) -> str:
    """The call's custom id: the trace's turn (its model message's sequence), hashed.

    Hashed because providers take `[A-Za-z0-9_-]{1,64}` and a trace id may not fit.
    """
    digest = hashlib.sha256(f"{trace_id}#{sequence}".encode()).hexdigest()[:40]
    return f"fc{digest}"


def routed(trace: Trace) -> bool:
    """Whether this trace's model calls go through a provider batch."""
    return trace.run.batch_api


def parked_call(trace: Trace) -> BatchWait | None:
    """The trace's call on a provider batch (`run.waiting_on_batch`), if it has one."""
    return trace.run.waiting_on_batch


def route_of(trace: Trace, path: Sequence[Message] = ()) -> Route:
    """How this turn's model call goes (read before the note of the turn is written).

    `path`: the trace's main path. A call whose answer is on it already was consumed,
    whatever the run state says (a stale write may have put an old state back): the turn
    is a fresh one, so no answer is taken twice and no turn is sent twice.
    """
    if not routed(trace):
        return "live"
    parked = parked_call(trace)
    state = parked.state if parked else None
    if state is None or state == "consumed" or _on_path(str(parked and parked.custom_id), path):
        return "fresh"
    if state == "live":
        return "retry_live"
    return "answered" if state == "answered" else "parked"


def _on_path(custom_id: str, path: Sequence[Message]) -> bool:
    return any(
        m.role == "assistant" and m.metadata.get(CALL_KEY) == custom_id for m in reversed(path)
    )


def take(runtime: Runtime, trace: Trace) -> LLMResponse | None:
    """The stored answer of the trace's parked call (with its `batch_id`); None if none."""
    parked = parked_call(trace)
    if parked is None:
        return None
    answer = batch_calls(runtime.store).answer_of(str(parked.custom_id))
    return None if answer is None else response_of(answer)


def park(
    runtime: Runtime,
    trace: Trace,
    model_name: str,
    body: dict[str, Any],
    route: Route,
) -> Parked:
    """Queue the turn's call (once per custom id) and put the trace `waiting` on it.

    A `fresh` turn gets its own custom id (the last turn's answer, in the trace now, is
    deleted); a parked one keeps the id it parked with. `body`: `messages`, `tools`,
    `temperature`, `max_output_tokens`.
    """
    calls: CallStates = batch_calls(runtime.store)
    parked = parked_call(trace) or BatchWait()
    if route == "fresh":
        if parked.custom_id:  # the last turn's answer is in the trace now
            calls.forget(parked.custom_id)
        custom_id = custom_id_of(trace.trace_id, trace.last_sequence + 1)
    else:
        custom_id = str(parked.custom_id)
    # The trace says where its call is before the call exists: a crash between the two
    # leaves a waiting trace the owner check sends again, and that run queues the call.
    lifecycle.wait_on_batch(runtime, trace, custom_id)
    call = PendingCall(
        custom_id=custom_id,
        trace_id=trace.trace_id,
        root_trace_id=trace.root_trace_id,
        model_name=model_name,
        body=body,
        queued_at_ms=now_ms(),
    )
    budgets = runtime.gate.budgets
    deadline_ms = budgets.deadline_ms(trace.root_trace_id) if budgets is not None else None
    calls.enqueue(call, deadline_ms)
    return Parked(custom_id)


def consumed(trace: Trace) -> BatchWait:
    """The trace's `run.waiting_on_batch` once its model message holds the answer."""
    parked = parked_call(trace) or BatchWait()
    return BatchWait(custom_id=parked.custom_id, state="consumed")


def wants_batch(runtime: Runtime, explicit: bool | None, model_name: str) -> bool:
    """Whether a root goes through provider batches: as asked, else its alias's default."""
    if explicit is not None:
        return explicit
    alias = runtime.config.models.get(model_name)
    return alias is not None and alias.batch_api


def check_route(runtime: Runtime, model_name: str) -> None:
    """Refuse a batch tree on a provider without a Batch API, in one line (`ConfigError`)."""
    from fleet.batchapi.providers import check_batch_api

    if model_name in runtime.clients:
        raise ConfigError(f"model {model_name!r} is an in-process client: it has no batch API")
    check_batch_api(runtime.config, model_name)


def answer_of(response: LLMResponse, batch_id: str) -> dict[str, Any]:
    """What the poller stores for a call: the parsed answer, priced, with its batch id."""
    return {
        "content": response.content,
        "tool_calls": [[c.id, c.name, c.arguments] for c in response.tool_calls],
        "prompt_tokens": response.usage.prompt_tokens,
        "completion_tokens": response.usage.completion_tokens,
        "cached_tokens": response.usage.cached_tokens,
        "cache_write_tokens": response.usage.cache_write_tokens,
        "cost_usd": response.usage.cost_usd,
        "model": response.model,
        "finish_reason": response.finish_reason,
        "batch_id": batch_id,
    }


def response_of(answer: dict[str, Any]) -> LLMResponse:
    """The stored answer as the response the live client would have returned."""
    calls = tuple(ToolCall(str(i), str(n), str(a)) for i, n, a in answer.get("tool_calls") or [])
    usage = Usage(
        int(answer.get("prompt_tokens") or 0),
        int(answer.get("completion_tokens") or 0),
        float(answer.get("cost_usd") or 0.0),
        int(answer.get("cached_tokens") or 0),
        int(answer.get("cache_write_tokens") or 0),
    )
    content = answer.get("content")
    return LLMResponse(
        content=content if isinstance(content, str) else None,
        tool_calls=calls,
        usage=usage,
        model=str(answer.get("model") or ""),
        finish_reason=answer.get("finish_reason"),
        batch_id=str(answer.get("batch_id") or "") or None,
    )


def in_batches(runtime: Runtime) -> tuple[int, int | None]:
    """Calls queued or in provider batches, and when the oldest was queued (ms), fleet-wide."""
    calls: Flushes = batch_calls(runtime.store)
    queued = calls.queued(COUNT_LIMIT)
    flying = calls.in_flight()
    count = len(queued) + sum(len(f.custom_ids) for f in flying)
    times = [at for _, at in queued[:1]] + [f.at_ms for f in flying]
    return count, min(times) if times else None
