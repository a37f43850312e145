"""File tools, every path confined to the workspace and opened race-free.

Reading: `read_file`, `list_dir` (and `glob`, `grep` in `fleet.tools.search`). Writing:
`write_file`, `edit_file`. Every open goes through `fleet.tools.safe_open`: component by
component with `O_NOFOLLOW`, never through a file with other hard links.
"""

from __future__ import annotations

import itertools
import os
from typing import BinaryIO

from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.safe_open import open_dir, open_file
from fleet.tools.workspace import truncate

MAX_READ_BYTES = 10_000_000
"""Larger files are refused by `read_file`/`edit_file`; `grep` or `bash` suit them."""
MAX_LIST_ENTRIES = 1_000
MAX_LIST_SCAN = 200_000
"""`list_dir` reads at most this many entries (as `glob` looks at most at as many): it runs
in the agent's thread, and a folder of millions must not hold it."""


def read_file(
    ctx: ToolContext, path: str, start_line: int = 1, end_line: int | None = None
) -> ToolResult:
    """Read a text file, with line numbers, optionally only a range of lines.

    Args:
        ctx: The run's workspace and limits.
        path: File path relative to the workspace root.
        start_line: First line to show, counting from 1.
        end_line: Last line to show (inclusive); omit to read to the end.
    """
    opened = open_file(ctx.workspace, path, os.O_RDONLY, private=ctx.private_dirs)
    with os.fdopen(opened.fd, "rb") as file:
        lines = _decode(_read_capped(file, path), path, strict=False).splitlines()
    total = len(lines)
    if total == 0:
        return ToolResult(title=f"{path} (empty file)", output="")
    last = total if end_line is None else min(end_line, total)
    if start_line < 1 or start_line > total:
        raise ToolError(f"start_line {start_line} is outside {path!r}, which has {total} lines")
    if last < start_line:
        raise ToolError(f"end_line {end_line} is before start_line {start_line}")
    numbered = "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in range(start_line, last + 1))
    summary = f"{path} lines {start_line}-{last} of {total}"
    return ToolResult(
        title=summary,
        output=truncate(numbered, ctx.output_limit_chars),
        long_term_memory=f"read {summary}",
    )


def list_dir(ctx: ToolContext, path: str = ".") -> ToolResult:
    """List a folder: sub-folders end with '/', symlinks with '@'.

    Args:
        ctx: The run's workspace and limits.
        path: Folder path relative to the workspace root.
    """
    folder = open_dir(ctx.workspace, path, private=ctx.private_dirs)
    try:
        with os.scandir(folder.fd) as found:
            read = list(itertools.islice(found, MAX_LIST_SCAN + 1))
            entries = sorted(read[:MAX_LIST_SCAN], key=lambda entry: entry.name)
            shown = [_entry_label(entry) for entry in entries[:MAX_LIST_ENTRIES]]
    finally:
        os.close(folder.fd)
    stopped = len(read) > MAX_LIST_SCAN
    if len(entries) > MAX_LIST_ENTRIES:
        more = "more" if stopped else f"{len(entries) - MAX_LIST_ENTRIES} more"
        shown.append(f"… and {more}")
    if stopped:
        shown.append(f"(stopped reading after {MAX_LIST_SCAN} entries; use glob to narrow)")
    output = "\n".join(shown) if shown else "(empty folder)"
    count = f"more than {MAX_LIST_SCAN}" if stopped else str(len(entries))
    return ToolResult(
        title=f"{folder.rel} ({count} entries)",
        output=truncate(output, ctx.output_limit_chars),
    )


def write_file(ctx: ToolContext, path: str, content: str) -> ToolResult:
    """Create a file or replace its whole content; missing folders are created.

    Args:
        ctx: The run's workspace and limits.
        path: File path relative to the workspace root.
        content: The complete new content of the file.
    """
    flags = os.O_WRONLY | os.O_CREAT
    opened = open_file(ctx.workspace, path, flags, create_dirs=True, private=ctx.private_dirs)
    with os.fdopen(opened.fd, "wb") as file:
        file.truncate(0)  # after open_file's hard-link check, never before it
        file.write(content.encode("utf-8"))
    verb = "created" if opened.created else "updated"
    summary = f"{verb} {opened.rel} ({len(content)} chars)"
    return ToolResult(title=summary, output=summary)


def edit_file(
    ctx: ToolContext, path: str, old_text: str, new_text: str, replace_all: bool = False
) -> ToolResult:
    """Replace an exact piece of text in a file.

    `old_text` must occur exactly once, unless `replace_all` is set; include enough
    surrounding lines to make it unique.

    Args:
        ctx: The run's workspace and limits.
        path: File path relative to the workspace root.
        old_text: The exact text to replace, whitespace and indentation included.
        new_text: The text to put in its place.
        replace_all: Replace every occurrence instead of requiring exactly one.
    """
    if not old_text:
        raise ToolError("old_text is empty; use write_file to create or overwrite a file")
    if old_text == new_text:
        raise ToolError("old_text and new_text are the same; nothing to change")
    opened = open_file(ctx.workspace, path, os.O_RDWR, private=ctx.private_dirs)
    with os.fdopen(opened.fd, "r+b") as file:
        text = _decode(_read_capped(file, path), path, strict=True)
        replaced = _occurrences(text, old_text, path, replace_all)
        file.seek(0)
        file.truncate(0)
        file.write(text.replace(old_text, new_text, replaced).encode("utf-8"))
    summary = f"edited {opened.rel} ({replaced} replaced)"
    return ToolResult(title=summary, output=summary)


def _occurrences(text: str, old_text: str, path: str, replace_all: bool) -> int:
    """How many to replace; `ToolError` when none, or several without `replace_all`."""
    count = text.count(old_text)
    if count == 0:
        raise ToolError(f"old_text not found in {path!r}")
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_text found {count} times in {path!r}; "
            "add surrounding lines to make it unique, or set replace_all"
        )
    return count if replace_all else 1


def _read_capped(file: BinaryIO, path: str) -> bytes:
    """The whole file, or `ToolError` past `MAX_READ_BYTES` (counted on what is read)."""
    data = file.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise ToolError(f"{path!r} is larger than {MAX_READ_BYTES} bytes; use grep instead")
    return data


def _decode(data: bytes, path: str, *, strict: bool) -> str:
    """The file's text; `strict` refuses non-UTF-8 bytes instead of replacing them."""
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{path!r} is not UTF-8 text") from exc


def _entry_label(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return f"{entry.name}@"
    return f"{entry.name}/" if entry.is_dir(follow_symlinks=False) else entry.name
