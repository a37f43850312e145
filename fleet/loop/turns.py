"""One model turn of a run: the call, the message it stores, the trace after it.

The call goes on its booked turn and is settled with the gate; the message is numbered as
the store will number it; the trace after a write is known without reading it again.

The runner (`fleet.loop.runner`) drives the loop; these are its pieces that need no loop, and
how a run ends (`Outcome`, `RunResult`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from fleet import lifecycle
from fleet.errors import HookBlocked, ProviderOverloaded, TransientLLMError
from fleet.limits.gate import FINAL_NOTE, Go, Wait
from fleet.llm.base import LLMResponse, ToolCall
from fleet.llm.caching import cache_key
from fleet.llm.fallback import next_model, switch_entry
from fleet.llm.timing import CALL_SPAN_KEY, Attempt, CallTiming, recording_attempts, wall_ms
from fleet.loop.context import injection
from fleet.loop.cut import CallCut, call_watch, cuttable, estimated
from fleet.loop.steps import Step
from fleet.models import Message, Status, Trace
from fleet.runtime import Runtime
from fleet.storage.leases import HeldLease
from fleet.storage.store import TraceSnapshot
from fleet.storage.writes import InboxSeen, TraceWrite, WriteResult

FIRST_RETRY_DELAY_S, MAX_RETRY_DELAY_S = 2.0, 30.0
OVERLOADS_PER_RETRY = 10

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


def note(
    runtime: Runtime,
    trace: Trace,
    messages: list[Message],
    *,
    final: bool,
    seen: InboxSeen | None = None,
) -> Message | None:
    """What this turn adds before the call: the budget's last word, or an injection.

    `seen`: the inbox as the run's last round trip read it (None: not read).
    """
    if not final:
        return injection(runtime, trace, messages, seen)
    note = Message(trace_id=trace.trace_id, role="user", content=FINAL_NOTE)
    note.metadata["injected"] = True
    return note


def call_model(
    runtime: Runtime,
    trace: Trace,
    model_name: str,
    go: Go,
    wire: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    shown: list[dict[str, Any]] | None = None,
    seen: InboxSeen | None = None,
) -> LLMResponse | Wait:
    """The model call on its booked turn, settled with the gate whatever happens.

    `shown`: the request as hooks see it, when it differs from what is sent (images as
    their references: an operator's hook or a span never holds an image's bytes). `seen`:
    the inbox entry an interrupting message must come after (None: the watcher reads it).
    """
    if go.wait_s > 0:
        time.sleep(go.wait_s)  # at most limits.MAX_WAIT_S: later turns were handed back
    # Counted as it leaves: a call late for its turn must not join others in one window, and
    # one inside a pause set meanwhile (a 429 elsewhere) does not go; it books again.
    if (held := runtime.gate.sending(go)) is not None:
        return held
    hooks = runtime.hooks
    hooks.turn_started(trace, trace.iteration)
    gate, started = runtime.gate, time.monotonic()
    try:
        hooks.model_requested(trace, model_name, wire if shown is None else shown)
    except HookBlocked:  # the operator's policy ends the trace: the booked turn is given back
        gate.after(go, None, None)
        raise
    client, temperature = runtime.client(model_name), runtime.temperature(trace)
    started_ms, attempts = wall_ms(), list[Attempt]()
    try:
        with (
            call_watch(runtime, trace.trace_id, seen=seen) as watch,
            recording_attempts(attempts),
        ):
            response = cuttable(  # a stop or interrupt cuts it
                watch,
                lambda: client.complete(
                    wire,
                    tools,
                    temperature=temperature,
                    max_output_tokens=go.max_output_tokens,
                    cache_key=cache_key(trace.root_trace_id, trace.preset),
                ),
            )
        response = replace(response, timing=CallTiming(started_ms, wall_ms(), tuple(attempts)))
    except CallCut as exc:  # settled with its estimate, once: nothing of it is written
        hooks.model_failed(trace, exc)
        gate.after(go, estimated(go), None)
        raise
    except ProviderOverloaded as exc:
        hooks.model_failed(trace, exc)
        return _overloaded(runtime, trace, go, exc)
    except BaseException as exc:
        hooks.model_failed(trace, exc)
        gate.after(go, None, None)
        if isinstance(exc, TransientLLMError):  # its attempts go with the hand-back's event
            exc.attempts = tuple(a.as_dict() for a in attempts)
        raise
    gate.after(go, response, int((time.monotonic() - started) * 1000))
    return response


def _overloaded(runtime: Runtime, trace: Trace, go: Go, exc: ProviderOverloaded) -> Wait:
    """Back off an overloaded provider, but not forever.

    A provider that stays down fails the trace (through the runner's retries) after
    OVERLOADS_PER_RETRY × `transient_retries` pauses.
    """
    wait = runtime.gate.overloaded(go, exc)  # re-raises without a limiter
    alias = runtime.config.models.get(runtime.model_name(trace.model, trace.preset))
    max_wait_s = alias.max_wait_s if alias is not None else None
    if (
        max_wait_s is not None
        and wait.retry_in_s > max_wait_s
        and switch_model(runtime, trace, exc)
    ):
        return Wait(0.0, "model fallback")  # the runner queues it again, on the fallback
    count = trace.run.overloads + 1
    if count > OVERLOADS_PER_RETRY * runtime.settings.transient_retries:
        raise exc
    runtime.store.update_run(trace.trace_id, overloads=count)
    return wait


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
