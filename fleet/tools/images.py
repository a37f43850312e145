"""`read_image`: the model looks at an image in its workspace.

Confined like `read_file` (`fleet.tools.safe_open`: no `..`, absolute path or symlink out
of the workspace, no private folder), capped in bytes as it is read, and checked by
content (`fleet.tools.imagecheck`): the type by its magic bytes, the pixel count from its
header, before anything decodes it. The image goes to the model in the next request (an
`image_ref` part of the tool result, stored once per tree); after that turn the result's
short form stands in for it, so an image is paid for once.
"""

from __future__ import annotations

import os

from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.imagecheck import MAX_IMAGE_BYTES, checked
from fleet.tools.safe_open import open_file


def read_image(ctx: ToolContext, path: str) -> ToolResult:
    """Look at an image file (PNG, JPEG, GIF or WebP) in the workspace.

    Args:
        ctx: The run's workspace and limits.
        path: Image path relative to the workspace root.
    """
    opened = open_file(ctx.workspace, path, os.O_RDONLY, private=ctx.private_dirs)
    with os.fdopen(opened.fd, "rb") as file:
        data = file.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:
        raise ToolError(f"{path!r} is larger than {MAX_IMAGE_BYTES} bytes: refused")
    image = checked(data, repr(opened.rel))
    summary = image.describe(str(opened.rel))
    return ToolResult(
        title=summary,
        output=f"{summary} (the image follows)",
        long_term_memory=f"looked at {summary}",
        images=(image,),
    )
