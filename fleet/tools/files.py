"""File tools, every path confined to the workspace.

Reading: `read_file`, `list_dir`, `glob`, `grep`. Writing: `write_file`, `edit_file`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.workspace import resolve_in_workspace, truncate, workspace_relative

MAX_READ_BYTES = 10_000_000
"""Larger files are refused by `read_file`/`edit_file`; `grep` or `bash` suit them."""
MAX_GREP_FILE_BYTES = 5_000_000
"""`grep` skips files larger than this."""
MAX_LIST_ENTRIES = 1_000
MAX_GLOB_RESULTS = 1_000
MAX_GREP_LINE_CHARS = 300
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__"})
"""Folders `grep` never descends into."""


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
    target = _existing_file(ctx, path)
    lines = _read_text(target, path, strict=False).splitlines()
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
    folder = resolve_in_workspace(ctx.workspace, path)
    if not folder.is_dir():
        raise ToolError(f"{path!r} is not a folder")
    entries = sorted(folder.iterdir(), key=lambda entry: entry.name)
    shown = [_entry_label(entry) for entry in entries[:MAX_LIST_ENTRIES]]
    if len(entries) > MAX_LIST_ENTRIES:
        shown.append(f"… and {len(entries) - MAX_LIST_ENTRIES} more")
    output = "\n".join(shown) if shown else "(empty folder)"
    return ToolResult(
        title=f"{workspace_relative(ctx.workspace, folder)} ({len(entries)} entries)",
        output=truncate(output, ctx.output_limit_chars),
    )


def glob(ctx: ToolContext, pattern: str, path: str = ".") -> ToolResult:
    """Find files whose paths match a glob pattern such as '**/*.py'.

    Args:
        ctx: The run's workspace and limits.
        pattern: Glob pattern relative to `path`; '**' matches any number of folders.
        path: Folder to search from, relative to the workspace root.
    """
    if not pattern or PurePosixPath(pattern).is_absolute() or ".." in pattern.split("/"):
        raise ToolError(f"pattern {pattern!r} must be relative and must not contain '..'")
    folder = resolve_in_workspace(ctx.workspace, path)
    if not folder.is_dir():
        raise ToolError(f"{path!r} is not a folder")
    base = ctx.workspace.resolve()
    try:
        matches = sorted(m for m in folder.glob(pattern) if m.resolve().is_relative_to(base))
    except ValueError as exc:
        raise ToolError(f"invalid pattern {pattern!r}: {exc}") from exc
    lines = [_entry_label(m, relative_to=base) for m in matches[:MAX_GLOB_RESULTS]]
    if len(matches) > MAX_GLOB_RESULTS:
        lines.append(f"… and {len(matches) - MAX_GLOB_RESULTS} more")
    return ToolResult(
        title=f"glob {pattern!r}: {len(matches)} matches",
        output=truncate("\n".join(lines) or "no matches", ctx.output_limit_chars),
    )


def grep(
    ctx: ToolContext,
    pattern: str,
    path: str = ".",
    include: str | None = None,
    max_matches: int = 100,
    ignore_case: bool = False,
) -> ToolResult:
    """Search file contents with a regular expression (Python `re` syntax).

    Args:
        ctx: The run's workspace and limits.
        pattern: Regular expression searched for in each line.
        path: File or folder to search, relative to the workspace root.
        include: Only search files whose path matches this glob, e.g. '*.py'.
        max_matches: Stop after this many matching lines.
        ignore_case: Match without regard to letter case.
    """
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from exc
    if max_matches < 1:
        raise ToolError("max_matches must be at least 1")
    base = ctx.workspace.resolve()
    found: list[str] = []
    files_with_matches = 0
    for file in _searchable_files(base, resolve_in_workspace(ctx.workspace, path), include):
        hits = _grep_file(file, regex, max_matches - len(found))
        rel = file.relative_to(base).as_posix()
        found.extend(f"{rel}:{number}: {line}" for number, line in hits)
        files_with_matches += bool(hits)
        if len(found) >= max_matches:
            break
    stopped = " (stopped at max_matches)" if len(found) >= max_matches else ""
    return ToolResult(
        title=f"grep {pattern!r}: {len(found)} matches in {files_with_matches} files{stopped}",
        output=truncate("\n".join(found) or "no matches", ctx.output_limit_chars),
    )


def write_file(ctx: ToolContext, path: str, content: str) -> ToolResult:
    """Create a file or replace its whole content; missing folders are created.

    Args:
        ctx: The run's workspace and limits.
        path: File path relative to the workspace root.
        content: The complete new content of the file.
    """
    target = resolve_in_workspace(ctx.workspace, path)
    if target.is_dir():
        raise ToolError(f"{path!r} is a folder")
    existed = target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8", newline="")
    verb = "updated" if existed else "created"
    summary = f"{verb} {workspace_relative(ctx.workspace, target)} ({len(content)} chars)"
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
    target = _existing_file(ctx, path)
    text = _read_text(target, path, strict=True)
    count = text.count(old_text)
    if count == 0:
        raise ToolError(f"old_text not found in {path!r}")
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_text found {count} times in {path!r}; "
            "add surrounding lines to make it unique, or set replace_all"
        )
    replaced = count if replace_all else 1
    target.write_text(text.replace(old_text, new_text, replaced), encoding="utf-8", newline="")
    summary = f"edited {workspace_relative(ctx.workspace, target)} ({replaced} replaced)"
    return ToolResult(title=summary, output=summary)


def _existing_file(ctx: ToolContext, path: str) -> Path:
    target = resolve_in_workspace(ctx.workspace, path)
    if not target.exists():
        raise ToolError(f"no such file: {path!r}")
    if not target.is_file():
        raise ToolError(f"{path!r} is not a file (use list_dir for folders)")
    if target.stat().st_size > MAX_READ_BYTES:
        raise ToolError(f"{path!r} is larger than {MAX_READ_BYTES} bytes; use grep instead")
    return target


def _read_text(target: Path, path: str, *, strict: bool) -> str:
    """The file's text; `strict` refuses non-UTF-8 bytes instead of replacing them."""
    data = target.read_bytes()
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{path!r} is not UTF-8 text") from exc


def _entry_label(entry: Path, relative_to: Path | None = None) -> str:
    name = entry.relative_to(relative_to).as_posix() if relative_to else entry.name
    if entry.is_symlink():
        return f"{name}@"
    return f"{name}/" if entry.is_dir() else name


def _searchable_files(base: Path, start: Path, include: str | None) -> Iterator[Path]:
    """Regular files under `start` that stay inside `base`, in a stable order."""
    if start.is_file():
        yield start
        return
    for folder, dirs, files in os.walk(start):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            file = Path(folder) / name
            if include and not PurePosixPath(file.relative_to(base).as_posix()).match(include):
                continue
            if file.resolve().is_relative_to(base) and file.is_file():
                yield file


def _grep_file(file: Path, regex: re.Pattern[str], limit: int) -> list[tuple[int, str]]:
    """Up to `limit` (line number, line) matches; binary and huge files give none."""
    if file.stat().st_size > MAX_GREP_FILE_BYTES:
        return []
    data = file.read_bytes()
    if b"\x00" in data[:8192]:
        return []
    hits: list[tuple[int, str]] = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if regex.search(line):
            hits.append((number, line[:MAX_GREP_LINE_CHARS]))
            if len(hits) >= limit:
                break
    return hits
