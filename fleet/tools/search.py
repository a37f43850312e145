"""`glob` and `grep`: searching the workspace, bounded in depth, size and time.

Both walk from a descriptor opened by `fleet.tools.safe_open`, never following symlinks.
`grep` runs its regular expression in a child process killed at the tool's time limit
(Python's `re` can backtrack for hours and a thread cannot be stopped). `glob` matches
path segments with a linear-time matcher (`**` runs collapsed, each segment matched with
`fnmatch`, which does not backtrack catastrophically), descends at most
`MAX_GLOB_DEPTH` folders, looks at most at `MAX_GLOB_VISITED` entries and stops at the
tool's time limit.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.safe_open import Inode, open_dir, open_path, private_inodes
from fleet.tools.workspace import truncate

MAX_GREP_FILE_BYTES = 5_000_000
"""`grep` skips files larger than this."""
MAX_GREP_LINE_CHARS = 300
MAX_GREP_MATCHES = 5_000
"""A larger `max_matches` is cut to this. grep runs in the agent's thread: its child is
killed at the limit, but what the child printed is parsed afterwards, ~1.5x the child's
own time per line; the 30,000 output chars show fewer lines than this anyway."""
MAX_GLOB_RESULTS = 1_000
MAX_GLOB_DEPTH = 30
"""Folders below the start that `glob` descends into."""
MAX_GLOB_VISITED = 200_000
"""Entries `glob` looks at before it stops with what it found."""
MAX_GLOB_SEGMENTS = 32
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__"})
"""Folders `grep` never descends into."""
GREP_CHILD = Path(__file__).with_name("grep_child.py")


def glob(ctx: ToolContext, pattern: str, path: str = ".") -> ToolResult:
    """Find files whose paths match a glob pattern such as '**/*.py'.

    Args:
        ctx: The run's workspace and limits.
        pattern: Glob pattern relative to `path`; '**' matches any number of folders.
        path: Folder to search from, relative to the workspace root.
    """
    segments = _glob_segments(pattern)
    folder = open_dir(ctx.workspace, path, private=ctx.private_dirs)
    private = private_inodes(ctx.private_dirs)
    deadline = time.monotonic() + ctx.tool_timeout_s
    base = ctx.workspace.resolve()
    matches: list[str] = []
    visited = 0
    stopped = ""
    try:
        for here, dirs, files, dir_fd in os.fwalk(".", dir_fd=folder.fd, follow_symlinks=False):
            parts = PurePosixPath(here).parts  # '.' is dropped: () at the start
            if len(parts) >= MAX_GLOB_DEPTH:
                dirs[:] = []
            dirs[:] = sorted(d for d in dirs if _inode(d, dir_fd) not in private)
            for name in sorted([*dirs, *files]):
                if _segments_match(segments, (*parts, name)):
                    matches.append(str(PurePosixPath(folder.rel, *parts, name)))
            visited += len(dirs) + len(files)
            if visited > MAX_GLOB_VISITED or time.monotonic() > deadline:
                stopped = f" (stopped after {visited} entries / {ctx.tool_timeout_s:g}s)"
                break
    finally:
        os.close(folder.fd)
    shown = [label for m in sorted(matches) if (label := _label(base, m)) is not None]
    lines = shown[:MAX_GLOB_RESULTS]
    if len(shown) > MAX_GLOB_RESULTS:
        lines.append(f"… and {len(shown) - MAX_GLOB_RESULTS} more")
    return ToolResult(
        title=f"glob {pattern!r}: {len(shown)} matches{stopped}",
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
        re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from exc
    if max_matches < 1:
        raise ToolError("max_matches must be at least 1")
    max_matches = min(max_matches, MAX_GREP_MATCHES)
    start = open_path(ctx.workspace, path, private=ctx.private_dirs)
    try:
        request = {
            "pattern": pattern,
            "ignore_case": ignore_case,
            "fd": start.fd,
            "prefix": "" if start.rel == "." else start.rel,
            "is_file": stat.S_ISREG(os.fstat(start.fd).st_mode),
            "include": include,
            "max_matches": max_matches,
            "max_line_chars": MAX_GREP_LINE_CHARS,
            "max_file_bytes": MAX_GREP_FILE_BYTES,
            "skipped_dirs": sorted(SKIPPED_DIRS),
            "private_inodes": sorted(private_inodes(ctx.private_dirs)),
        }
        lines = _run_grep_child(request, start.fd, ctx.tool_timeout_s, pattern)
    finally:
        os.close(start.fd)
    *hits, summary = [json.loads(line) for line in lines]
    found = [f"{rel}:{number}: {line}" for rel, number, line in hits]
    stopped = " (stopped at max_matches)" if len(found) >= max_matches else ""
    files = summary["files_with_matches"]
    return ToolResult(
        title=f"grep {pattern!r}: {len(found)} matches in {files} files{stopped}",
        output=truncate("\n".join(found) or "no matches", ctx.output_limit_chars),
    )


def _run_grep_child(
    request: dict[str, object], fd: int, timeout_s: float, pattern: str
) -> list[str]:
    """Run `grep_child.py` on `fd`; killed (and a `ToolError`) after `timeout_s`."""
    try:
        done = subprocess.run(
            # -S too: no site import, so no `.pth` file of any site-packages ever runs here.
            [sys.executable, "-I", "-S", str(GREP_CHILD)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            pass_fds=(fd,),
            env={},
        )
    except subprocess.TimeoutExpired:
        raise ToolError(
            f"grep {pattern!r} stopped after {timeout_s:g}s; a pattern with nested"
            " repetition such as '(a+)+' can take forever: simplify it or narrow path/include"
        ) from None
    if done.returncode != 0 or not done.stdout:
        raise ToolError(f"grep failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return done.stdout.splitlines()


def _inode(name: str, dir_fd: int) -> Inode | None:
    """The folder's (st_dev, st_ino), not following a link; None if it is gone."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _glob_segments(pattern: str) -> tuple[str, ...]:
    """The pattern's segments with `**` runs collapsed; `ToolError` if it may not be used."""
    parts = pattern.split("/")
    if not pattern or PurePosixPath(pattern).is_absolute() or ".." in parts:
        raise ToolError(f"pattern {pattern!r} must be relative and must not contain '..'")
    if len(parts) > MAX_GLOB_SEGMENTS:
        raise ToolError(f"pattern {pattern!r} has more than {MAX_GLOB_SEGMENTS} segments")
    collapsed: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part != "**" or not collapsed or collapsed[-1] != "**":
            collapsed.append(part)
    return tuple(collapsed)


def _segments_match(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether path `parts` match `pattern`; `**` is any number of segments. O(len * len)."""
    states = _closure(pattern, {0})
    for part in parts:
        after: set[int] = set()
        for i in states:
            if i < len(pattern) and pattern[i] == "**":
                after.add(i)
            elif i < len(pattern) and fnmatchcase(part, pattern[i]):
                after.add(i + 1)
        states = _closure(pattern, after)
        if not states:
            return False
    return len(pattern) in states


def _closure(pattern: tuple[str, ...], states: set[int]) -> set[int]:
    """`states` plus, after each `**`, the state that skips it (it may match nothing)."""
    return states | {i + 1 for i in states if i < len(pattern) and pattern[i] == "**"}


def _label(base: Path, rel: str) -> str | None:
    """`rel` as shown: folders end with '/', links with '@'; None for links leaving `base`."""
    full = base / rel
    if full.is_symlink():
        return f"{rel}@" if full.resolve().is_relative_to(base) else None
    return f"{rel}/" if full.is_dir() else rel
