"""Images in a run: stored once per tree when they arrive, put back into each request.

A message holds `image_ref` parts (`fleet.tools.imagecheck.Image.ref`); only the request
that leaves for the model carries the bytes, as OpenAI `image_url` parts with a data URL
(the Anthropic client turns those into `image` blocks). A model alias with `vision: false`
is never sent one: the run fails with an error that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.errors import ConfigError
from fleet.llm.vision import data_url
from fleet.loop.fit import fit, record
from fleet.models import Trace, image_placeholder
from fleet.runtime import Runtime
from fleet.tools.imagecheck import MEDIA_TYPES


@dataclass(frozen=True)
class Request:
    """One model request's messages: as sent, and as hooks and spans are shown them."""

    sent: list[dict[str, Any]]
    """Fitted, with each image's bytes in place of its reference."""
    shown: list[dict[str, Any]]
    """Fitted, images as their `image_ref` parts."""


def prepared(
    runtime: Runtime,
    trace: Trace,
    model_name: str,
    wire: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> tuple[Trace, Request]:
    """The request fitted into the model's window, then given the images' bytes.

    A fitting is noted on the trace (returned as it is after the note).
    """
    window = runtime.context_window(model_name)
    threshold = runtime.config.context_threshold
    fitted = fit(wire, tools, window, threshold, runtime.wire_of(model_name))
    if fitted.elided and window is not None:
        trace = record(runtime.store, trace, fitted, window)
    sent = with_images(runtime, trace.root_trace_id, model_name, fitted.messages)
    return trace, Request(sent, fitted.messages)


def with_images(
    runtime: Runtime, root_trace_id: str, model_name: str, wire: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The request's messages with every `image_ref` part replaced by the image's data.

    Raises:
        ConfigError: the model takes no images (`vision: false` in fleet.yaml).
    """
    if not any(_refs(message) for message in wire):
        return wire
    if not runtime.has_vision(model_name):
        count = sum(_refs(message) for message in wire)
        raise ConfigError(
            f"model {model_name!r} takes no images (vision: false in fleet.yaml): a request"
            f" with {count} image(s) was not sent; use a model with vision"
        )
    out = []
    for message in wire:
        if _refs(message):
            parts = [_resolved(runtime, root_trace_id, part) for part in message["content"]]
            message = {**message, "content": parts}
        out.append(message)
    return out


def _refs(message: dict[str, Any]) -> int:
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for part in content if part.get("type") == "image_ref")


def _resolved(runtime: Runtime, root_trace_id: str, part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") != "image_ref":
        return part
    ref = part.get("image_ref") or {}
    media_type = str(ref.get("media_type", ""))
    try:
        data = runtime.images.get(root_trace_id, str(ref.get("id", "")))
    except ValueError:  # not a digest: a forged reference
        data = None
    if data is None or media_type not in MEDIA_TYPES:  # expired with an old tree, or forged
        return {"type": "text", "text": f"{image_placeholder(part)} (no longer stored)"}
    url = data_url(media_type, data)
    return {"type": "image_url", "image_url": {"url": url}}
