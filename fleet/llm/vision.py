"""Images on the wire: what one costs in tokens, and its data URL.

Token counts follow each provider's documented formula, computed from the width and
height the header gave (`fleet.tools.imagecheck`), never from the bytes:

- OpenAI (high detail): the image is fitted inside 2048 x 2048, then its shorter side
  brought down to 768; it costs 85 tokens plus 170 per 512-px tile.
- Anthropic: the image is brought down to 1568 px on its long edge; it costs
  width x height / 750 tokens, at most about 1600.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Literal

Wire = Literal["openai", "anthropic"]

OPENAI_BASE_TOKENS, OPENAI_TILE_TOKENS, OPENAI_TILE_PX = 85, 170, 512
ANTHROPIC_MAX_EDGE_PX, ANTHROPIC_PIXELS_PER_TOKEN, ANTHROPIC_MAX_TOKENS = 1568, 750, 1600


def openai_tokens(width: int, height: int) -> int:
    """OpenAI's count for a high-detail image."""
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / OPENAI_TILE_PX) * math.ceil(h / OPENAI_TILE_PX)
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles


def anthropic_tokens(width: int, height: int) -> int:
    """Anthropic's count."""
    w, h = float(width), float(height)
    if max(w, h) > ANTHROPIC_MAX_EDGE_PX:
        scale = ANTHROPIC_MAX_EDGE_PX / max(w, h)
        w, h = w * scale, h * scale
    return min(ANTHROPIC_MAX_TOKENS, math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN))


def image_tokens(ref: dict[str, Any], wire: Wire | None = None) -> int:
    """Tokens of an `image_ref` part's image on `wire`; the larger count when unknown."""
    width, height = int(ref.get("width") or 0), int(ref.get("height") or 0)
    if wire == "openai":
        return openai_tokens(width, height)
    if wire == "anthropic":
        return anthropic_tokens(width, height)
    return max(openai_tokens(width, height), anthropic_tokens(width, height))


def content_image_tokens(content: Any, wire: Wire | None = None) -> int:
    """Tokens of every `image_ref` part of a message's content (0 for text)."""
    if not isinstance(content, list):
        return 0
    return sum(
        image_tokens(part.get("image_ref") or {}, wire)
        for part in content
        if isinstance(part, dict) and part.get("type") == "image_ref"
    )


def data_url(media_type: str, data: bytes) -> str:
    """`data:image/png;base64,...`: how an OpenAI `image_url` part carries the bytes."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def split_data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a data URL; None for anything else (an http URL)."""
    if not url.startswith("data:") or ";base64," not in url:
        return None
    head, data = url[5:].split(";base64,", 1)
    return head, data
