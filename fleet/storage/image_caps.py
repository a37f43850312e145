"""How many bytes one image and one tree's images may take: the rule both backends apply."""

from __future__ import annotations

from fleet.errors import ToolError
from fleet.storage import keys


def check_size(data: bytes) -> None:
    """Refuse one image over `keys.IMAGE_MAX_BYTES` (both backends apply it)."""
    if len(data) > keys.IMAGE_MAX_BYTES:
        raise ToolError(f"an image of {len(data)} bytes is over {keys.IMAGE_MAX_BYTES}: refused")


def over_tree_cap(stored_bytes: int) -> ToolError | None:
    """The refusal once a tree stored more than `keys.IMAGE_TREE_MAX_BYTES` (None: it fits)."""
    if stored_bytes <= keys.IMAGE_TREE_MAX_BYTES:
        return None
    return ToolError(
        f"this tree stored {keys.IMAGE_TREE_MAX_BYTES} bytes of images already: no more"
    )
