"""Keep tool paths inside the workspace root and tool output under a size cap."""

from __future__ import annotations

import os
from pathlib import Path

from fleet.errors import ToolError


def resolve_in_workspace(root: Path, path: str) -> Path:
    """Turn a path from the model into a real path inside the workspace.

    Relative paths are taken from `root`. An absolute path is accepted only when it
    points inside `root`. Every symlink is followed, dangling ones included, so a link
    whose target leaves the workspace is refused even when the target does not exist
    yet (a `write_file` through it would otherwise create a file outside).

    Args:
        root: The workspace root; it must exist.
        path: The path as the model wrote it; empty means the root itself.

    Returns:
        The fully resolved absolute path, which is what the caller must open.

    Raises:
        ToolError: The path leaves the workspace by `..`, by being absolute elsewhere,
            or through a symlink, or it cannot be resolved.
    """
    base = root.resolve(strict=True)
    if "\x00" in path:
        raise ToolError(f"path {path!r} contains a NUL byte")
    lexical = _lexical_path(root, base, path)
    if lexical is None:
        raise ToolError(f"path {path!r} leaves the workspace")
    try:
        resolved = lexical.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on 3.11
        raise ToolError(f"path {path!r} cannot be resolved: {exc}") from exc
    if not resolved.is_relative_to(base):
        raise ToolError(f"path {path!r} leaves the workspace through a symlink")
    return resolved


def lexical_parts(root: Path, base: Path, path: str) -> tuple[str, ...]:
    """The components of `path` below `base`, `..` folded; `ToolError` when that leaves it."""
    if "\x00" in path:
        raise ToolError(f"path {path!r} contains a NUL byte")
    lexical = _lexical_path(root, base, path)
    if lexical is None:
        raise ToolError(f"path {path!r} leaves the workspace")
    return lexical.relative_to(base).parts


def _lexical_path(root: Path, base: Path, path: str) -> Path | None:
    """`path` joined to `base` with `..` folded, or None when that lands outside."""
    raw = Path(path or ".")
    if not raw.is_absolute():
        joined = Path(os.path.normpath(base / raw))
        return joined if joined.is_relative_to(base) else None
    absolute = Path(os.path.normpath(raw))
    # The model may have been shown the root unresolved (e.g. /tmp -> /private/tmp).
    for anchor in (base, Path(os.path.normpath(root.absolute()))):
        if absolute.is_relative_to(anchor):
            return base / absolute.relative_to(anchor)
    return None


def truncate(text: str, limit_chars: int) -> str:
    r"""Cut `text` to `limit_chars`, saying how much was dropped.

    Args:
        text: Any tool output.
        limit_chars: The most characters kept before the marker.

    Returns:
        `text` unchanged when short enough, else its head plus
        `\n… [truncated N chars]`.
    """
    if len(text) <= limit_chars:
        return text
    dropped = len(text) - limit_chars
    return f"{text[:limit_chars]}\n… [truncated {dropped} chars]"
