"""One model call of a run: its inputs, prepared once per run, and the call on its turn.

The runner prepares a `Prepared` before a run's first model call (`prepare`): the model's
client, the tools offered, the gate's terms for the model, the request's window and wire,
the cache key, the temperature, which call events some hook listens to, and the call
watcher. A turn (`fleet.loop.route.ask_model`) takes it, so it computes only what varies
per turn: the note, the request, the booking, the call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from fleet.conversation.messages import got_mail
from fleet.errors import HookBlocked, ProviderOverloaded, TransientLLMError
from fleet.limits.gate import FINAL_NOTE, Go, Terms, Wait
from fleet.llm.base import LLMClient, LLMResponse
from fleet.llm.caching import cache_key
from fleet.llm.timing import Attempt, CallTiming, recording_attempts, wall_ms
from fleet.llm.vision import Wire
from fleet.loop.context import injection
from fleet.loop.cut import CallCut, CallWatcher, cuttable, estimated, runtime_watcher
from fleet.loop.fit import fit, record
from fleet.loop.images import Request, with_images
from fleet.loop.toolcalls import Offered, offered
from fleet.loop.turns import switch_model
from fleet.models import Message, Trace
from fleet.runtime import Runtime
from fleet.storage.writes import InboxSeen

OVERLOADS_PER_RETRY = 10
CALL_EVENTS = ("turn_started", "model_requested", "model_responded", "model_failed")
"""The hook events of every model call: those no hook listens to are not called."""


@dataclass
class Prepared:
    """What every model call of one run takes, prepared once (`prepare`)."""

    runtime: Runtime
    model_name: str
    client: LLMClient | None
    """None: it could not be built; the call builds it again, raising what it raises."""
    offered: Offered
    terms: Terms
    """What the gate books each call with (`fleet.limits.gate.Terms`)."""
    cache_key: str
    """The call's `prompt_cache_key` (`fleet.llm.caching.cache_key`)."""
    temperature: float | None
    window: int | None
    """The model's `context_window` (None: nothing to fit)."""
    threshold: float
    wire: Wire | None
    live: frozenset[str]
    """The `CALL_EVENTS` some hook listens to (`Hooks.listens`)."""
    watcher: CallWatcher
    """The process's call watcher (`fleet.loop.cut`): a stop or a message cuts the call."""
    cancellable: bool = True
    """The call is given a cancel handle (`LLMClient.holds_no_connection` says it needs
    none)."""
    in_place: bool = False
    """The call runs in the run's thread: a cancel ends it (`LLMClient.ends_on_cancel`)."""

    def tools(self, trace: Trace, seen: InboxSeen | None) -> list[dict[str, Any]]:
        """The tools offered to this call: built again only if the registry changed."""
        runtime = self.runtime
        if runtime.mcp is not None:  # an MCP server's listing may have changed meanwhile
            runtime.sync_mcp_tools(runtime.permissions(trace).mcp_servers)
        if runtime.tools.generation != self.offered.generation:
            self.offered = offered(runtime, trace)
        found = self.offered
        if found.plain is found.mailed:  # `check_messages` offered always, or never
            return list(found.plain)
        mailed = seen.newest is not None if seen is not None else got_mail(runtime, trace)
        return list(found.mailed if mailed else found.plain)

    def request(
        self, trace: Trace, wire: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[Trace, Request]:
        """The request fitted into the model's window, then given the images' bytes.

        A fitting is noted on the trace (returned as it is after the note).
        """
        if self.window is not None:
            fitted = fit(wire, tools, self.window, self.threshold, self.wire)
            if fitted.elided:
                trace = record(self.runtime.store, trace, fitted, self.window)
            wire = fitted.messages
        sent = wire
        if any(isinstance(m.get("content"), list) for m in wire):  # parts: an image, maybe
            sent = with_images(self.runtime, trace.root_trace_id, self.model_name, wire)
        return trace, Request(sent, wire)

    def built_client(self) -> LLMClient:
        """The model's client (built again if preparing it failed: that error is raised)."""
        return self.client if self.client is not None else self.runtime.client(self.model_name)


def prepare(runtime: Runtime, trace: Trace, model_name: str) -> Prepared:
    """The inputs of every model call of this run of `trace` on `model_name`."""
    try:
        client: LLMClient | None = runtime.client(model_name)
    except Exception:  # raised again by the call, where it was raised before
        client = None
    in_place = getattr(client, "ends_on_cancel", False) is True
    return Prepared(
        runtime=runtime,
        model_name=model_name,
        client=client,
        offered=offered(runtime, trace),
        terms=runtime.gate.terms(model_name, trace.root_trace_id),
        cache_key=cache_key(trace.root_trace_id, trace.preset),
        temperature=runtime.temperature(trace),
        window=runtime.context_window(model_name),
        threshold=runtime.config.context_threshold,
        wire=runtime.wire_of(model_name),
        live=frozenset(e for e in CALL_EVENTS if runtime.hooks.listens(e)),
        watcher=runtime_watcher(runtime),
        cancellable=in_place or not getattr(client, "holds_no_connection", False),
        in_place=in_place,
    )


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
        every = runtime.settings.inject_every_turns  # `injection`'s own conditions:
        due = trace.iteration > 0 and every > 0 and trace.iteration % every == 0
        if not due and seen is not None and seen.newest is None:
            return None  # no block due and no message ever came: nothing to add or read
        return injection(runtime, trace, messages, seen)
    if messages and messages[-1].role == "user" and messages[-1].content == FINAL_NOTE:
        return None  # a root run again on its final turn (its runner was lost): said once
    note = Message(trace_id=trace.trace_id, role="user", content=FINAL_NOTE)
    note.metadata["injected"] = True
    return note


def call_model(
    prepared: Prepared,
    trace: Trace,
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
    runtime = prepared.runtime
    if go.wait_s > 0:
        time.sleep(go.wait_s)  # at most limits.MAX_WAIT_S: later turns were handed back
    # Counted as it leaves: a call late for its turn must not join others in one window, and
    # one inside a pause set meanwhile (a 429 elsewhere) does not go; it books again.
    if (held := runtime.gate.sending(go)) is not None:
        return held
    hooks, live = runtime.hooks, prepared.live
    if "turn_started" in live:
        hooks.turn_started(trace, trace.iteration)
    gate, started = runtime.gate, time.monotonic()
    try:
        if "model_requested" in live:
            hooks.model_requested(trace, prepared.model_name, wire if shown is None else shown)
    except HookBlocked:  # the operator's policy ends the trace: the booked turn is given back
        gate.after(go, None, None)
        raise
    client, temperature = prepared.built_client(), prepared.temperature
    started_ms, attempts = wall_ms(), list[Attempt]()
    try:
        with (
            prepared.watcher.watching(
                trace.trace_id, seen=seen, cancellable=prepared.cancellable
            ) as watch,
            recording_attempts(attempts),
        ):
            response = cuttable(  # a stop or interrupt cuts it
                watch,
                lambda: client.complete(
                    wire,
                    tools,
                    temperature=temperature,
                    max_output_tokens=go.max_output_tokens,
                    cache_key=prepared.cache_key,
                ),
                in_place=prepared.in_place,
            )
        response = replace(response, timing=CallTiming(started_ms, wall_ms(), tuple(attempts)))
    except BaseException as exc:
        return _failed(prepared, trace, go, exc, attempts)
    gate.after(go, response, int((time.monotonic() - started) * 1000))
    return response


def _failed(
    prepared: Prepared, trace: Trace, go: Go, exc: BaseException, attempts: list[Attempt]
) -> Wait:
    """A call that raised, told to the hooks and settled: an overload waits, else it raises.

    A cut call is settled with its estimate, once (nothing of it is written); any other
    is refunded, and a transient error carries its attempts to the hand-back's event.
    """
    runtime = prepared.runtime
    if "model_failed" in prepared.live:
        runtime.hooks.model_failed(trace, exc)
    if isinstance(exc, CallCut):
        runtime.gate.after(go, estimated(go), None)
        raise exc
    if isinstance(exc, ProviderOverloaded):
        return _overloaded(runtime, trace, go, exc)
    runtime.gate.after(go, None, None)
    if isinstance(exc, TransientLLMError):
        exc.attempts = tuple(a.as_dict() for a in attempts)
    raise exc


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
