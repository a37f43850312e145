"""Keeping each request inside the model's context window.

`fleet.yaml` gives a model alias a `context_window` (tokens) and may set
`context_threshold` (default 0.8). When the next request would pass that share of the
window, tool outputs are elided *in the request only*, following the seeds' compression
rules: the system prompt, every user message and every assistant message stay; the oldest
tool outputs go first; the results of the turn being answered are cut last, and only as
far as needed. The stored messages stay whole, and the trace records that it happened
(`run.context` and a `context` event). Tokens are estimated at four characters each
(no tokenizer dependency); a conversation that cannot fit even then fails the trace with
`ContextOverflow` rather than being sent to be refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleet.errors import ContextOverflow
from fleet.llm.vision import Wire, content_image_tokens
from fleet.models import Event, Trace
from fleet.runstate import ContextNote
from fleet.storage.store import TraceRecords
from fleet.storage.writes import TraceWrite

CHARS_PER_TOKEN = 4
_MARK = "[{n} characters of tool output elided to fit the context window; call the tool again if you need them]"  # noqa: E501


@dataclass(frozen=True)
class Fitted:
    """A request's messages as sent, and what fitting did to them."""

    messages: list[dict[str, Any]]
    elided: int
    """Tool outputs shortened or replaced (0: the request was sent as built)."""
    tokens_before: int
    tokens_after: int


def estimate_tokens(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], wire: Wire | None = None
) -> int:
    """The request's size in tokens, estimated from its JSON at four characters a token.

    An `image_ref` part counts as its provider's formula says (`fleet.llm.vision`).
    """
    chars = sum(_size(m, wire) for m in messages) + len(json.dumps(tools, ensure_ascii=False))
    return chars // CHARS_PER_TOKEN + 1


def fit(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    window: int | None,
    threshold: float,
    wire: Wire | None = None,
) -> Fitted:
    """The messages to send so the request stays within `threshold * window` tokens.

    Raises:
        ContextOverflow: it cannot fit even with every tool output elided.
    """
    if window is None:  # nothing to fit: no estimate either
        return Fitted(messages, 0, 0, 0)
    before = estimate_tokens(messages, tools, wire)
    if before <= window * threshold:
        return Fitted(messages, 0, before, before)
    budget_chars = int(window * threshold) * CHARS_PER_TOKEN
    out = [dict(m) for m in messages]
    sizes = [_size(m, wire) for m in out]
    fixed = len(json.dumps(tools, ensure_ascii=False))
    last_assistant = max((i for i, m in enumerate(out) if m["role"] == "assistant"), default=-1)
    older = [i for i, m in enumerate(out) if m["role"] == "tool" and i < last_assistant]
    latest = [i for i, m in enumerate(out) if m["role"] == "tool" and i > last_assistant]
    elided = 0
    for index in older + latest:
        excess = fixed + sum(sizes) - budget_chars
        if excess <= 0:
            break
        content = _text(out[index].get("content"))  # an elided result's images go too
        keep = 0 if index in older else max(0, len(content) - excess - len(_MARK) - 16)
        out[index]["content"] = content[:keep] + _MARK.format(n=len(content) - keep)
        sizes[index] = _size(out[index], wire)
        elided += 1
    after = (fixed + sum(sizes)) // CHARS_PER_TOKEN + 1
    if after > window * threshold:
        raise ContextOverflow(
            f"the conversation needs about {after} tokens even with every tool output elided;"
            f" the model's context window is {window} tokens (threshold {threshold})"
        )
    return Fitted(out, elided, before, after)


def record(store: TraceRecords, trace: Trace, fitted: Fitted, window: int) -> Trace:
    """Note on the trace (`run.context` and a `context` event) that a request was fitted."""
    previous = trace.run.context or ContextNote()
    note = ContextNote(
        compactions=previous.compactions + 1,
        elided=fitted.elided,
        tokens_before=fitted.tokens_before,
        tokens_after=fitted.tokens_after,
        window=window,
    )
    event = Event(kind="context", trace_id=trace.trace_id, data=note.model_dump())
    store.apply(
        TraceWrite(trace.trace_id, trace.root_trace_id).emit(event).update_run(context=note)
    )
    return trace.with_run(context=note)


def _size(message: dict[str, Any], wire: Wire | None) -> int:
    images = content_image_tokens(message.get("content"), wire) * CHARS_PER_TOKEN
    return len(json.dumps(message, ensure_ascii=False)) + images


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return str(content or "")
