from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.errors import ToolError
from fleet.tools import files as files_module
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.files import edit_file, list_dir, read_file, write_file
from fleet.tools.search import glob, grep
from fleet.tools.workspace import resolve_in_workspace, truncate


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret\n")
    return folder


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    (root / "notes.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    return root


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws)


# --- confinement -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../outside/secret.txt", "src/../../outside/secret.txt", ".."])
def test_dotdot_escape_is_refused(ws: Path, outside: Path, path: str) -> None:
    with pytest.raises(ToolError, match=r"leaves the workspace"):
        resolve_in_workspace(ws, path)


def test_absolute_path_outside_is_refused(ws: Path, outside: Path) -> None:
    with pytest.raises(ToolError, match=r"leaves the workspace"):
        resolve_in_workspace(ws, str(outside / "secret.txt"))


def test_absolute_path_inside_is_accepted(ws: Path) -> None:
    assert resolve_in_workspace(ws, str(ws / "notes.txt")) == (ws / "notes.txt").resolve()


def test_dotdot_that_stays_inside_is_accepted(ws: Path) -> None:
    assert resolve_in_workspace(ws, "src/../notes.txt") == (ws / "notes.txt").resolve()


def test_empty_path_is_the_root(ws: Path) -> None:
    assert resolve_in_workspace(ws, "") == ws.resolve()


def test_symlink_to_outside_file_is_refused_and_target_untouched(
    ws: Path, outside: Path, ctx: ToolContext
) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolError, match=r"through a symlink"):
        read_file(ctx, "link.txt")
    with pytest.raises(ToolError, match=r"through a symlink"):
        write_file(ctx, "link.txt", "overwritten")
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_symlinked_folder_cannot_be_written_through(
    ws: Path, outside: Path, ctx: ToolContext
) -> None:
    (ws / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ToolError, match=r"leaves the workspace"):
        write_file(ctx, "out/new.txt", "x")
    assert not (outside / "new.txt").exists()


def test_dangling_symlink_to_outside_is_refused(ws: Path, outside: Path, ctx: ToolContext) -> None:
    (ws / "dangling").symlink_to(outside / "not-yet.txt")
    with pytest.raises(ToolError, match=r"leaves the workspace"):
        write_file(ctx, "dangling", "x")
    assert not (outside / "not-yet.txt").exists()


def test_symlink_inside_the_workspace_is_followed(ws: Path, ctx: ToolContext) -> None:
    (ws / "alias.txt").symlink_to(ws / "notes.txt")
    assert "line 1" in read_file(ctx, "alias.txt").output


def test_escapes_are_refused_by_every_file_tool(ws: Path, outside: Path, ctx: ToolContext) -> None:
    calls: list[Callable[[], ToolResult]] = [
        lambda: read_file(ctx, "../outside/secret.txt"),
        lambda: list_dir(ctx, ".."),
        lambda: glob(ctx, "*", "../outside"),
        lambda: glob(ctx, "../outside/*"),
        lambda: grep(ctx, "secret", "../outside"),
        lambda: write_file(ctx, "../outside/secret.txt", "x"),
        lambda: edit_file(ctx, "../outside/secret.txt", "top", "bottom"),
    ]
    for call in calls:
        with pytest.raises(ToolError):
            call()
    assert (outside / "secret.txt").read_text() == "top secret\n"


# --- truncate ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short", 10, "short"),
        ("exactly10!", 10, "exactly10!"),
        ("0123456789abc", 10, "0123456789\n… [truncated 3 chars]"),
    ],
)
def test_truncate(text: str, limit: int, expected: str) -> None:
    assert truncate(text, limit) == expected


# --- reading -----------------------------------------------------------------------


def test_read_file_numbers_lines(ctx: ToolContext) -> None:
    result = read_file(ctx, "src/app.py")
    assert result.output.splitlines() == [
        "     1\timport os",
        "     2\t",
        "     3\tdef main():",
        "     4\t    return os.getcwd()",
    ]
    assert result.title == "src/app.py lines 1-4 of 4"
    assert not result.is_error


@pytest.mark.parametrize(
    ("start", "end", "first", "last"),
    [(3, 5, 3, 5), (9, None, 9, 10), (10, 10, 10, 10), (8, 99, 8, 10)],
)
def test_read_file_range(
    ctx: ToolContext, start: int, end: int | None, first: int, last: int
) -> None:
    lines = read_file(ctx, "notes.txt", start_line=start, end_line=end).output.splitlines()
    assert lines[0] == f"{first:>6}\tline {first}"
    assert lines[-1] == f"{last:>6}\tline {last}"
    assert len(lines) == last - first + 1


@pytest.mark.parametrize(("start", "end"), [(0, None), (11, None), (5, 4)])
def test_read_file_bad_range(ctx: ToolContext, start: int, end: int | None) -> None:
    with pytest.raises(ToolError, match=r"line"):
        read_file(ctx, "notes.txt", start_line=start, end_line=end)


def test_read_file_output_is_capped(ws: Path) -> None:
    (ws / "big.txt").write_text("x" * 5000)
    result = read_file(ToolContext(workspace=ws, output_limit_chars=100), "big.txt")
    head, marker = result.output.split("\n… [truncated ")
    assert len(head) == 100
    assert marker.endswith(" chars]")


def test_read_file_missing_and_folder(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"no such file"):
        read_file(ctx, "nope.txt")
    with pytest.raises(ToolError, match=r"not a file"):
        read_file(ctx, "src")


def test_list_dir(ws: Path, ctx: ToolContext) -> None:
    (ws / "alias.txt").symlink_to(ws / "notes.txt")
    result = list_dir(ctx, ".")
    assert result.output.splitlines() == ["alias.txt@", "notes.txt", "src/"]
    assert result.title == ". (3 entries)"


def test_list_dir_stops_reading_a_huge_folder(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It runs in the agent's thread: a folder of millions is read only so far."""
    monkeypatch.setattr(files_module, "MAX_LIST_SCAN", 5)
    monkeypatch.setattr(files_module, "MAX_LIST_ENTRIES", 3)
    for i in range(10):
        (ws / "src" / f"f{i}").write_text("")
    result = list_dir(ctx, "src")
    lines = result.output.splitlines()
    assert len(lines) == 5  # 3 shown, "… and more", the stop
    assert lines[-2:] == ["… and more", "(stopped reading after 5 entries; use glob to narrow)"]
    assert result.title == "src (more than 5 entries)"


def test_list_dir_of_a_folder_at_the_scan_limit_is_whole(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files_module, "MAX_LIST_SCAN", 3)
    (ws / "a").write_text("")  # with notes.txt and src/: exactly the limit
    result = list_dir(ctx, ".")
    assert result.output.splitlines() == ["a", "notes.txt", "src/"]
    assert result.title == ". (3 entries)"


def test_glob_is_recursive_and_relative(ws: Path, ctx: ToolContext) -> None:
    (ws / "src" / "pkg").mkdir()
    (ws / "src" / "pkg" / "mod.py").write_text("")
    result = glob(ctx, "**/*.py")
    assert result.output.splitlines() == ["src/app.py", "src/pkg/mod.py"]


def test_glob_leaves_out_symlinks_to_outside(ws: Path, outside: Path, ctx: ToolContext) -> None:
    (ws / "out.txt").symlink_to(outside / "secret.txt")
    assert glob(ctx, "*.txt").output.splitlines() == ["notes.txt"]


def test_grep_with_include_and_max(ws: Path, ctx: ToolContext) -> None:
    (ws / "src" / "other.md").write_text("import this\n")
    result = grep(ctx, r"^import", include="*.py")
    assert result.output == "src/app.py:1: import os"
    capped = grep(ctx, r"line \d", max_matches=3)
    assert capped.output.splitlines() == [
        "notes.txt:1: line 1",
        "notes.txt:2: line 2",
        "notes.txt:3: line 3",
    ]
    assert "stopped at max_matches" in capped.title


def test_grep_caps_the_matches_its_caller_parses(ws: Path, ctx: ToolContext) -> None:
    """grep runs in the agent's thread (registered bounded): only its child is killed at
    the limit, and every line the child printed is parsed afterwards. A model's
    `max_matches=10**9` over a large workspace made that parse ~1.5x the child's own time
    (1M lines: child 1.9 s, then 2.9 s in the agent's thread), past FLEET_TOOL_TIMEOUT_S."""
    (ws / "big.txt").write_text("x\n" * 20_000)
    result = grep(ctx, "^x$", max_matches=10**9)
    shown = int(result.title.split(": ")[1].split()[0])
    assert shown <= 10_000, result.title
    assert "stopped at max_matches" in result.title


def test_grep_skips_binary_and_reports_bad_regex(ws: Path, ctx: ToolContext) -> None:
    (ws / "blob.bin").write_bytes(b"line 1\x00\x01")
    assert "blob.bin" not in grep(ctx, "line 1").output
    with pytest.raises(ToolError, match=r"invalid regular expression"):
        grep(ctx, "(unclosed")


def test_grep_ignore_case(ctx: ToolContext) -> None:
    assert grep(ctx, "IMPORT OS").output == "no matches"
    assert grep(ctx, "IMPORT OS", ignore_case=True).output == "src/app.py:1: import os"


# --- writing -----------------------------------------------------------------------


def test_write_file_creates_folders_and_overwrites(ws: Path, ctx: ToolContext) -> None:
    created = write_file(ctx, "a/b/c.txt", "hello\n")
    assert created.title == "created a/b/c.txt (6 chars)"
    assert (ws / "a" / "b" / "c.txt").read_text() == "hello\n"
    updated = write_file(ctx, "a/b/c.txt", "bye")
    assert updated.title.startswith("updated")
    assert (ws / "a" / "b" / "c.txt").read_text() == "bye"


def test_edit_file_replaces_one_unique_occurrence(ws: Path, ctx: ToolContext) -> None:
    result = edit_file(ctx, "src/app.py", "os.getcwd()", "os.getpid()")
    assert result.title == "edited src/app.py (1 replaced)"
    assert (ws / "src" / "app.py").read_text().endswith("return os.getpid()\n")


def test_edit_file_not_found_leaves_file_alone(ws: Path, ctx: ToolContext) -> None:
    before = (ws / "src" / "app.py").read_text()
    with pytest.raises(ToolError, match=r"old_text not found in 'src/app.py'"):
        edit_file(ctx, "src/app.py", "import sys", "import re")
    assert (ws / "src" / "app.py").read_text() == before


def test_edit_file_ambiguous_needs_replace_all(ws: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match=r"found 2 times"):
        edit_file(ctx, "src/app.py", "os", "sys")
    assert "import os" in (ws / "src" / "app.py").read_text()
    result = edit_file(ctx, "src/app.py", "os", "sys", replace_all=True)
    assert result.title == "edited src/app.py (2 replaced)"
    assert (ws / "src" / "app.py").read_text() == (
        "import sys\n\ndef main():\n    return sys.getcwd()\n"
    )


@pytest.mark.parametrize(("old", "new"), [("", "x"), ("same", "same")])
def test_edit_file_refuses_empty_or_no_op(ctx: ToolContext, old: str, new: str) -> None:
    with pytest.raises(ToolError):
        edit_file(ctx, "src/app.py", old, new)


def test_edit_file_keeps_crlf_line_endings(ws: Path, ctx: ToolContext) -> None:
    (ws / "win.txt").write_bytes(b"one\r\ntwo\r\n")
    edit_file(ctx, "win.txt", "two", "2")
    assert (ws / "win.txt").read_bytes() == b"one\r\n2\r\n"


def test_edit_file_refuses_non_utf8(ws: Path, ctx: ToolContext) -> None:
    (ws / "latin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(ToolError, match=r"not UTF-8"):
        edit_file(ctx, "latin.txt", "caf", "bar")
    assert (ws / "latin.txt").read_bytes() == b"caf\xe9\n"


def test_a_symlink_loop_is_an_error_not_a_hang(ws: Path, ctx: ToolContext) -> None:
    (ws / "a").symlink_to("b")
    (ws / "b").symlink_to("a")
    with pytest.raises(ToolError, match=r"too many symbolic links"):
        read_file(ctx, "a/x.txt")


def test_a_fifo_is_refused_without_blocking(ws: Path, ctx: ToolContext) -> None:
    os.mkfifo(ws / "pipe")
    with pytest.raises(ToolError, match=r"not a regular file"):
        read_file(ctx, "pipe")


def test_relative_symlinks_and_dotdot_inside_are_walked(ws: Path, ctx: ToolContext) -> None:
    (ws / "src" / "up").symlink_to("..", target_is_directory=True)
    assert "line 1" in read_file(ctx, "src/up/notes.txt").output
    (ws / "src" / "far").symlink_to("../..", target_is_directory=True)
    with pytest.raises(ToolError, match=r"leaves the workspace"):
        read_file(ctx, "src/far/outside/secret.txt")
