"""A model turn: its route decided first, as a value, then one function per route.

A turn is called live, waits for its first sibling to warm the prompt cache, is parked in
a provider batch, or takes the answer a provider batch already gave. `decide` reads the
trace and its main path only (the batch state: `fleet.batchapi.route.route_of`); the gate
may still turn a batched route live (a tree's budget ran out: its last word does not wait
hours for a batch). `ask_model` matches the route; `_live`, `_to_batch` and `_from_batch`
are the routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, assert_never

from fleet.batchapi.route import Route as BatchRoute
from fleet.batchapi.route import route_of
from fleet.children.warming import warming
from fleet.conversation.messages import baseline
from fleet.history import main_path, to_wire
from fleet.limits.gate import Go, Spent, Wait, request_chars
from fleet.llm.base import LLMResponse
from fleet.loop.batched import park_turn, taken
from fleet.loop.call import Prepared, call_model, note
from fleet.loop.steps import OnBatch
from fleet.loop.turns import Answered, Held
from fleet.models import Message, Trace
from fleet.runtime import Runtime
from fleet.storage.store import TraceSnapshot, TraceStore
from fleet.storage.writes import InboxSeen, TraceWrite


@dataclass(frozen=True)
class Live:
    """Call the model now."""

    note: bool = True
    """The turn's note (an injection, the budget's last word) is written first; not for a
    call made live after its batch errored (its note was written when it first parked)."""
    batched: bool = False
    """The trace's calls go through provider batches: the answer's custom id is recorded."""
    kind: Literal["live"] = "live"


@dataclass(frozen=True)
class WarmWait:
    """An explore branch (not the first) waits for the first branch's call to warm the cache."""

    wait: Wait
    kind: Literal["warm_wait"] = "warm_wait"


@dataclass(frozen=True)
class ToBatch:
    """Park the call in a provider batch: a new one, or the one parked before.

    A fresh call's note is written first; one parked before (a redelivered run, a resend)
    is queued once per custom id.
    """

    fresh: bool
    kind: Literal["to_batch"] = "to_batch"


@dataclass(frozen=True)
class FromBatch:
    """The provider batch answered the parked call: take the stored answer.

    Parked again if none is stored.
    """

    kind: Literal["from_batch"] = "from_batch"


Route = Live | WarmWait | ToBatch | FromBatch


def decide(store: TraceStore, trace: Trace, path: list[Message]) -> Route:
    """The turn's route, before the gate is asked (read before its note is written)."""
    if (warm := warming(store, trace)) is not None:  # the first branch goes first
        return WarmWait(warm)
    match route_of(trace, path):
        case "live":
            return Live()
        case "retry_live":
            return Live(note=False, batched=True)
        case "fresh":
            return ToBatch(fresh=True)
        case "parked":
            return ToBatch(fresh=False)
        case "answered":
            return FromBatch()


def batched(route: Route) -> bool:
    """Whether the gate books the call at the batch price (it goes into a provider batch)."""
    return isinstance(route, ToBatch | FromBatch)


def ask_model(
    prepared: Prepared, snapshot: TraceSnapshot, held: Held
) -> Answered | Wait | Spent | OnBatch:
    """The model call of a turn: its route decided, booked with the gate, then taken.

    `prepared`: what every call of the run takes, prepared by the runner (`fleet.loop.call`).
    """
    trace = snapshot.trace
    path = main_path(snapshot.messages, trace.head_sequence)
    # Only a branch that may warm the cache, or a batched trace, has a route to decide.
    routed = trace.run.warm_after_first or trace.run.batch_api
    route = decide(prepared.runtime.store, trace, path) if routed else Live()
    match route:
        case WarmWait(wait=wait):
            return wait
        case Live() | ToBatch() | FromBatch():
            return _booked(prepared, snapshot, held, path, route)
        case _:
            assert_never(route)


def _booked(
    prepared: Prepared,
    snapshot: TraceSnapshot,
    held: Held,
    path: list[Message],
    route: Live | ToBatch | FromBatch,
) -> Answered | Wait | Spent | OnBatch:
    """The call booked with the gate (at the batch price for a batch), then its route taken."""
    trace, messages, runtime = snapshot.trace, snapshot.messages, prepared.runtime
    tools = prepared.tools(trace, snapshot.inbox)
    chars = request_chars(path, tools)
    terms = prepared.terms
    verdict = runtime.gate.before(trace, terms, chars, snapshot.pauses, batch=batched(route))
    if not isinstance(verdict, Go):
        return verdict
    if verdict.budget.final:  # the tree's budget ran out: its last word does not wait hours
        route = Live()
    call = _Call(prepared, held, tools, verdict, snapshot.inbox)
    match route:
        case Live():
            return _live(call, trace, messages, route)
        case ToBatch(fresh=fresh):
            return _to_batch(call, trace, messages, fresh)
        case FromBatch():
            return _from_batch(call, trace, messages)
        case _:
            assert_never(route)


@dataclass(frozen=True)
class _Call:
    """What every route of one turn's model call shares."""

    prepared: Prepared
    held: Held
    tools: list[dict[str, Any]]
    go: Go
    seen: InboxSeen | None
    """The inbox as the run's last round trip read it (None: not read)."""

    @property
    def runtime(self) -> Runtime:
        """The run's runtime."""
        return self.prepared.runtime

    @property
    def model_name(self) -> str:
        """The model the run calls."""
        return self.prepared.model_name

    def noted(self, trace: Trace, messages: list[Message]) -> tuple[Trace, list[Message]]:
        """The turn's note written first (an injection, the budget's last word), if any."""
        extra = note(self.runtime, trace, messages, final=self.go.budget.final, seen=self.seen)
        if extra is None:
            return trace, messages
        # A fresh trace's first messages go first, in the same step.
        write = self.held.pending or TraceWrite(trace.trace_id, trace.root_trace_id)
        self.held.pending = None
        stored = self.runtime.store.apply(write.append(extra)).messages[-1]
        update = {"head_sequence": stored.sequence, "last_sequence": stored.sequence}
        return trace.model_copy(update=update), [*messages, stored]

    def flush(self) -> None:
        """Write what waited for this turn (a fresh trace's first messages)."""
        if self.held.pending is not None:
            self.runtime.store.apply(self.held.pending)
            self.held.pending = None

    def answered(
        self,
        trace: Trace,
        messages: list[Message],
        path: list[Message],
        response: LLMResponse,
        *,
        batched: bool,
    ) -> Answered:
        """The turn's answer, told to the hooks."""
        if "model_responded" in self.prepared.live:
            self.runtime.hooks.model_responded(trace, response)
        final = self.go.budget.final
        return Answered(trace, messages, path, response, self.model_name, final, batched=batched)


def _live(call: _Call, trace: Trace, messages: list[Message], route: Live) -> Answered | Wait:
    """Call the model now."""
    if route.note:
        trace, messages = call.noted(trace, messages)
    path = main_path(messages, trace.head_sequence)
    trace, request = call.prepared.request(trace, to_wire(path), call.tools)
    seen = call.seen  # a message the note gave in full cuts nothing (an empty inbox: none)
    if seen is None or seen.newest is not None:
        seen = baseline(seen, messages)
    called = call_model(
        call.prepared,
        trace,
        call.go,
        request.sent,
        call.tools,
        shown=request.shown,
        seen=seen,
    )
    if isinstance(called, Wait):
        return called
    return call.answered(trace, messages, path, called, batched=route.batched)


def _to_batch(call: _Call, trace: Trace, messages: list[Message], fresh: bool) -> OnBatch:
    """Park the call in a provider batch (a fresh one's note written first)."""
    if fresh:
        trace, messages = call.noted(trace, messages)
    path = main_path(messages, trace.head_sequence)
    trace, request = call.prepared.request(trace, to_wire(path), call.tools)
    call.flush()
    again: BatchRoute = "fresh" if fresh else "parked"
    parked = park_turn(call.runtime, trace, call.go, (request.sent, call.tools), again)
    return OnBatch(parked.custom_id)


def _from_batch(call: _Call, trace: Trace, messages: list[Message]) -> Answered | OnBatch:
    """Take the answer the provider batch gave; park the call again if none is stored."""
    path = main_path(messages, trace.head_sequence)
    response = taken(call.runtime, trace, call.go, path)
    if response is None:
        return _to_batch(call, trace, messages, fresh=False)
    return call.answered(trace, messages, path, response, batched=True)
