"""GenAI spans from the runner's hooks: `invoke_agent`, `chat` and `execute_tool`.

Imported only when tracing is on (see `fleet.observe.otel`). One `invoke_agent {name}` span per
run of a trace, a `chat {model}` child per model call and an `execute_tool {name}` child
per tool call, with the GenAI semantic-convention attributes and the fleet's ids.

Across machines the context travels in the trace, not in process memory: a child trace
carries the W3C `traceparent` of its parent's `execute_tool agent` span in
`run.otel` (written when the child is created), so every run of the child — on any
worker, redelivered, or continued later — is that span's child. A root keeps the context of
its first run the same way, so a resumed parent continues the same distributed trace.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from fleet.llm.base import LLMResponse, ToolCall
from fleet.models import Trace, text_of
from fleet.observe.hooks import Hooks
from fleet.storage.store import TraceStore
from fleet.tools.base import ToolResult

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """The open spans of one run of one trace (a trace has at most one live run)."""

    span: Span
    input_tokens: int = 0
    output_tokens: int = 0
    chat: Span | None = None
    tools: dict[str, Span] = field(default_factory=dict)
    final: Trace | None = None


class OtelHooks(Hooks):
    """Records the spans; never raises into the agent loop (the OTel API does not raise)."""

    def __init__(
        self,
        store: TraceStore,
        tracer: Tracer,
        *,
        capture_content: bool = False,
        flush: Callable[[], object] = lambda: None,
    ) -> None:
        """Spans go to `tracer`; the store keeps a root's context for its later runs."""
        self._store = store
        self._tracer = tracer
        self._capture = capture_content
        self._flush = flush
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    # -- runs --------------------------------------------------------------------------

    def run_started(self, trace: Trace) -> None:
        """Open `invoke_agent {name}` under the trace's stored context (or a new trace)."""
        carrier = trace.run.otel
        parent = propagate.extract(carrier) if carrier is not None else None
        name = trace.name or trace.mode
        span = self._tracer.start_span(
            f"invoke_agent {name}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": name,
                "gen_ai.agent.id": trace.trace_id,
                "gen_ai.conversation.id": trace.root_trace_id,
                **({"gen_ai.request.model": trace.model} if trace.model else {}),
                **_fleet_attributes(trace),
            },
        )
        with self._lock:
            self._runs[trace.trace_id] = _Run(span)
        if parent is None and trace.parent_trace_id is None:
            # A root's first run: later runs (after its children) continue this trace.
            try:
                self._store.update_run(trace.trace_id, otel=_inject(span))
            except Exception:  # tracing must never fail a run: its resume starts a new trace
                log.warning("could not keep the trace context of %r", trace.trace_id)

    def run_finished(self, trace: Trace) -> None:
        """Remember how the trace ended, for its run span's status."""
        if (run := self._run(trace.trace_id)) is not None:
            run.final = trace

    def run_ended(self, trace: Trace, outcome: str, error: BaseException | None = None) -> None:
        """Close the run span with this run's token usage and how it ended."""
        with self._lock:
            run = self._runs.pop(trace.trace_id, None)
        if run is None:
            return
        for open_span in [s for s in (run.chat, *run.tools.values()) if s is not None]:
            _fail(open_span, type(error).__qualname__ if error else "run_ended")
        span = run.span
        span.set_attribute("gen_ai.usage.input_tokens", run.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", run.output_tokens)
        span.set_attribute("fleet.outcome", outcome)
        if error is not None:
            _fail(span, type(error).__qualname__, end=False)
        elif run.final is not None and run.final.status != "completed":
            reason = str(run.final.run.stop_reason or run.final.status)
            _fail(span, reason, end=False)
        span.end()

    # -- model calls ---------------------------------------------------------------------

    def model_requested(self, trace: Trace, model: str, messages: list[dict[str, Any]]) -> None:
        """Open `chat {model}` under the run span."""
        if (run := self._run(trace.trace_id)) is None:
            return
        provider, _, _ = model.partition(":")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": provider,
            **_fleet_attributes(trace),
            **_fallback_attributes(trace),
        }
        if self._capture:
            attributes["gen_ai.input.messages"] = json.dumps(
                [_message_parts(m) for m in messages], ensure_ascii=False
            )
        run.chat = self._tracer.start_span(
            f"chat {model}",
            context=set_span_in_context(run.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )

    def model_responded(self, trace: Trace, response: LLMResponse) -> None:
        """Usage on the chat span and, added up, on the run span."""
        if (run := self._run(trace.trace_id)) is None or run.chat is None:
            return
        usage = response.usage
        run.input_tokens += usage.prompt_tokens
        run.output_tokens += usage.completion_tokens
        chat, run.chat = run.chat, None
        chat.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        chat.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        if usage.cached_tokens:
            chat.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
        if usage.cache_write_tokens:
            chat.set_attribute("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens)
        if response.model:
            chat.set_attribute("gen_ai.response.model", response.model)
        if response.batch_id:  # answered through a provider's Batch API (fleet.batchapi)
            chat.set_attribute("fleet.batch_id", response.batch_id)
        finish = "tool_calls" if response.tool_calls else "stop"
        chat.set_attribute("gen_ai.response.finish_reasons", [finish])
        if self._capture:
            calls = [c.to_openai() for c in response.tool_calls]
            output = {"role": "assistant", "content": response.content, "tool_calls": calls}
            chat.set_attribute("gen_ai.output.messages", json.dumps([_message_parts(output)]))
        chat.end()

    def model_failed(self, trace: Trace, error: BaseException) -> None:
        """`error.type` on the chat span (the message may quote a provider: not recorded)."""
        if (run := self._run(trace.trace_id)) is None or run.chat is None:
            return
        chat, run.chat = run.chat, None
        _fail(chat, type(error).__qualname__)

    # -- tool calls ----------------------------------------------------------------------

    def tool_started(self, trace: Trace, call: ToolCall) -> None:
        """Open `execute_tool {name}` under the run span."""
        if (run := self._run(trace.trace_id)) is None:
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            **_fleet_attributes(trace),
        }
        if self._capture:
            attributes["gen_ai.tool.call.arguments"] = call.arguments
        run.tools[call.id] = self._tracer.start_span(
            f"execute_tool {call.name}",
            context=set_span_in_context(run.span),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )

    def child_context(self, parent: Trace, tool_call_id: str) -> dict[str, str]:
        """The `traceparent` of the open `execute_tool` span that spawns the child."""
        run = self._run(parent.trace_id)
        span = run.tools.get(tool_call_id) if run is not None else None
        return _inject(span) if span is not None else {}

    def tool_finished(self, trace: Trace, call: ToolCall, result: ToolResult | None) -> None:
        """Close the tool span; a refusal or tool error sets `error.type`."""
        run = self._run(trace.trace_id)
        span = run.tools.pop(call.id, None) if run is not None else None
        if span is None:
            return
        if result is None:
            span.set_attribute("fleet.dispatched", True)  # the children run on in their spans
        elif self._capture:
            span.set_attribute("gen_ai.tool.call.result", result.output)
        if result is not None and result.is_error:
            _fail(span, "tool_error")
            return
        span.end()

    def messages_delivered(self, trace: Trace, messages: list[dict[str, Any]]) -> None:
        """A `fleet.messages.delivered` event on the run span: how many, from whom."""
        if (run := self._run(trace.trace_id)) is None:
            return
        senders = sorted({str(m.get("from", "")) for m in messages})
        attributes: dict[str, Any] = {"fleet.messages.count": len(messages)}
        attributes["fleet.messages.from"] = senders
        if self._capture:
            attributes["fleet.messages.content"] = [str(m.get("content", "")) for m in messages]
        run.span.add_event("fleet.messages.delivered", attributes)

    def flush(self) -> None:
        """Export buffered spans now (worker shutdown)."""
        self._flush()

    def _run(self, trace_id: str) -> _Run | None:
        with self._lock:
            return self._runs.get(trace_id)


def _fleet_attributes(trace: Trace) -> dict[str, str]:
    return {
        "fleet.trace_id": trace.trace_id,
        "fleet.root_trace_id": trace.root_trace_id,
        "fleet.mode": trace.mode,
    }


def _fallback_attributes(trace: Trace) -> dict[str, Any]:
    """On a call made by a fallback model: which model it stands in for, after how many."""
    switches = trace.run.model_fallbacks
    if not switches:
        return {}
    return {
        "fleet.model.fallback": True,
        "fleet.model.fallback_from": switches[0].from_model,
        "fleet.model.fallback_count": len(switches),
    }


def _inject(span: Span) -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=set_span_in_context(span, otel_context.Context()))
    return carrier


def _fail(span: Span, error_type: str, *, end: bool = True) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR))
    if end:
        span.end()


def _message_parts(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-format message in the semconv's role/parts shape (capture-content only)."""
    parts: list[dict[str, Any]] = []
    if message.get("role") == "tool":
        parts.append(
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": _shown(message.get("content")),
            }
        )
    elif message.get("content"):
        parts.append({"type": "text", "content": _shown(message["content"])})
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    return {"role": message.get("role"), "parts": parts}


def _shown(content: Any) -> Any:
    """Text as it is; a list of parts as its text, each image as a placeholder (no bytes)."""
    return text_of(content) if isinstance(content, list) else content
