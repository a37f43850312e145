"""One model turn of a run: the message it stores, the trace after it, how it ends.

The message is numbered as the store will number it; the trace after a write is known
without reading it again; a provider error hands the run back or falls back to another
model. The call itself is `fleet.loop.call`.

The runner (`fleet.loop.runner`) drives the loop; these are its pieces that need no loop, and
how a run ends (`Outcome`, `RunResult`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from fleet import lifecycle
from fleet.errors import TransientLLMError
from fleet.limits.gate import Wait
from fleet.llm.base import LLMResponse, ToolCall
from fleet.llm.fallback import next_model, switch_entry
from fleet.llm.timing import CALL_SPAN_KEY
from fleet.loop.steps import Step
from fleet.models import Message, Status, Trace
from fleet.runtime import Runtime
from fleet.storage.leases import HeldLease
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import TraceWrite, WriteResult

FIRST_RETRY_DELAY_S, MAX_RETRY_DELAY_S = 2.0, 30.0

log = logging.getLogger(__name__)

Outcome = Literal[
    "completed",
    "failed",
    "stopped",
    "waiting",
    "busy",
    "lost",
    "yielded",
    "throttled",
    "interrupted",
    "parked",
    "gone",
]
"""`busy`: another runner holds the trace. `lost`: our lease was taken over.
`yielded`: the host asked us to let go (worker shutting down); the trace is queued again.
`throttled`: a provider limit said "not now"; the trace is queued again, to be run in
`RunResult.retry_in_s`. `interrupted`: the store could not be reached mid-run; the lease
was left to lapse, and a sweeper resumes the trace once the store is back. `parked`: the
turn's model call waits in a provider batch (`fleet.batchapi`), or a remote child waits on
its A2A task or a person (`fleet.remote`); a poller (or `fleet reply`) sends it again.
`gone`: the trace has no record (a Redis that lost it with its last writes, a Cluster
master killed before its replica had it): nothing to run, nothing to fail."""


@dataclass(frozen=True)
class RunResult:
    """How one `Runner.run` call ended. `busy`: another runner holds the trace."""

    trace_id: str
    outcome: Outcome
    retry_in_s: float = 0.0
    """For `throttled`: when the trace may ask again (its booked turn, or a pause's end)."""


@dataclass(frozen=True)
class Answered:
    """A turn's answer before it is written: the model's, or a fan-out root's own."""

    trace: Trace
    """The trace as the call left it (a note or a fitting may have been written)."""
    messages: list[Message]
    path: list[Message]
    """The main path the answer follows."""
    response: LLMResponse
    model: str
    """Recorded on the turn's message: the model name, or `FAN_OUT_MODEL`."""
    final: bool = False
    """The budget's last turn: whatever it says is the answer."""
    batched: bool = False
    """The trace's calls go through provider batches: the answer's custom id is recorded."""


def terminal(status: Status) -> Outcome:
    """The outcome of a run that ended the trace in this status."""
    if status == "completed" or status == "failed" or status == "stopped":
        return status
    raise ValueError(f"{status!r} is not terminal")


@dataclass
class Held:
    """A run's hold on its trace."""

    owner: str
    heartbeat: HeldLease
    started_ms: int = 0
    pending: TraceWrite | None = None
    """Writes that wait for the next model turn's (a fresh trace's first messages)."""

    @property
    def released(self) -> bool:
        """The lease was given up (with the duration written) in the run's last write."""
        return self.heartbeat.released

    @released.setter
    def released(self, value: bool) -> None:
        self.heartbeat.released = value


@dataclass(frozen=True)
class Turn:
    """A model call's outcome, and the write that stores it."""

    step: Step
    trace: Trace
    """The trace as it is once `write` is applied."""
    messages: list[Message]
    """Every message once `write` is applied."""
    write: TraceWrite
    pauses: tuple[str, ...] = ()
    """The pause keys the next model call checks: the turn's last write reads them."""


@dataclass(frozen=True)
class ReadAgain:
    """The run goes on from a fresh read of the trace (something else changed it too)."""


GoOn = TraceSnapshot | ReadAgain
"""Where the next turn starts: a snapshot known without a read, or a fresh read."""


def advanced(snapshot: TraceSnapshot, written: WriteResult) -> TraceSnapshot:
    """The snapshot after a write appended these messages (as a fresh read would show it)."""
    trace = snapshot.trace
    if written.messages:
        last = written.messages[-1].sequence
        trace = trace.model_copy(update={"head_sequence": last, "last_sequence": last})
    messages = [*snapshot.messages, *written.messages]
    return TraceSnapshot(trace, messages, written.stop_requested, written.pauses, written.inbox)


def numbered(trace: Trace, messages: list[Message]) -> tuple[Trace, list[Message]]:
    """Messages as the store numbers them when appended after the head, and the trace then."""
    out: list[Message] = []
    head, last = trace.head_sequence, trace.last_sequence
    for message in messages:
        last += 1
        out.append(message.model_copy(update={"sequence": last, "parent_sequence": head}))
        head = last
    return trace.model_copy(update={"head_sequence": head, "last_sequence": last}), out


def recorded(trace: Trace, message: Message) -> Trace:
    """The trace after `record_turn` wrote this model turn (as a fresh read would show it)."""
    stats = trace.stats.model_copy(
        update={
            "messages": trace.stats.messages + 1,
            "prompt_tokens": trace.stats.prompt_tokens + message.prompt_tokens,
            "completion_tokens": trace.stats.completion_tokens + message.completion_tokens,
            "cost_usd": trace.stats.cost_usd + message.cost_usd,
            "cached_tokens": trace.stats.cached_tokens + message.cached_tokens,
            "cache_write_tokens": trace.stats.cache_write_tokens + message.cache_write_tokens,
        }
    )
    update = {"iteration": trace.iteration + 1, "stats": stats}
    update |= {"head_sequence": message.sequence, "last_sequence": message.sequence}
    return trace.model_copy(update=update)


def model_message(
    runtime: Runtime, trace: Trace, response: LLMResponse, model_name: str
) -> Message:
    """The model's turn as the store will number it: only our lease's holder appends."""
    # The model's text is untrusted: whatever it learnt of our secrets is not persisted.
    scrub = runtime.redactor.values_only
    calls = [
        ToolCall(id=c.id, name=scrub(c.name), arguments=scrub(c.arguments))
        for c in response.tool_calls
    ]
    return Message(
        trace_id=trace.trace_id,
        sequence=trace.last_sequence + 1,
        parent_sequence=trace.head_sequence,
        role="assistant",
        content=scrub(response.content) if response.content else response.content,
        tool_calls=[c.to_openai() for c in calls] or None,
        model=model_name,
        prompt_tokens=response.usage.prompt_tokens,
        completion_tokens=response.usage.completion_tokens,
        cost_usd=response.usage.cost_usd,
        cached_tokens=response.usage.cached_tokens,
        cache_write_tokens=response.usage.cache_write_tokens,
        metadata={CALL_SPAN_KEY: response.timing.as_dict()} if response.timing else {},
    )


def fall_back(runtime: Runtime, trace: Trace, exc: TransientLLMError) -> Wait | None:
    """Move the trace to its model's next fallback alias and queue it again at once.

    None when the model has no fallback left (`fleet.llm.fallback`).
    """
    if switch_model(runtime, trace, exc) is None:
        return None
    lifecycle.requeue(runtime, trace, "model fallback")
    return Wait(0.0, "model fallback")


def switch_model(runtime: Runtime, trace: Trace, exc: TransientLLMError) -> str | None:
    """Set the trace's model to the next fallback alias, recorded in `run.model_fallbacks`."""
    current = runtime.model_name(trace.model, trace.preset)
    switches = trace.run.model_fallbacks
    fallback = next_model(runtime.config.models, current, [s.from_model for s in switches])
    if fallback is None:
        return None
    entry = switch_entry(current, fallback, runtime.redactor.values_only(str(exc)))
    write = TraceWrite(trace.trace_id, trace.root_trace_id).update(None, model=fallback)
    runtime.store.apply(write.update_run(model_fallbacks=[*switches, entry]))
    runtime.store.count_fallback(current, fallback)
    log.warning("run of %r: model %r failed, falling back to %r", trace.trace_id, current, fallback)
    return fallback


@dataclass(frozen=True)
class GaveUp:
    """A provider error outlasted every re-run: the trace fails with `error`."""

    error: str


def hand_back(runtime: Runtime, trace_id: str, exc: TransientLLMError) -> Wait | GaveUp:
    """A provider error the client's retries did not fix: queued again to run later.

    At most `Settings.transient_retries` times per trace (counted in its run state, so a
    worker restart does not reset it); then the error to fail the trace with.
    """
    trace = runtime.store.get_trace(trace_id)
    if (moved := fall_back(runtime, trace, exc)) is not None:
        return moved
    tries = trace.run.transient_retries
    if tries >= runtime.settings.transient_retries:
        return GaveUp(f"{exc} (gave up after {tries} re-runs)")
    runtime.store.update_run(trace_id, transient_retries=tries + 1)
    delay_s = min(MAX_RETRY_DELAY_S, FIRST_RETRY_DELAY_S * 2**tries)
    lifecycle.requeue(runtime, trace, "provider error", delay_s, attempts=exc.attempts)
    log.warning("run of %r handed back after %s; again in %.0f s", trace_id, exc, delay_s)
    return Wait(delay_s, "provider error")
