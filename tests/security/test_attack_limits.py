"""Route 8: a tool call that holds a worker slot for minutes (regex backtracking, glob `**`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.security.conftest import HardenedFleet, run_forged, steps_script, tool_outputs, tool_step

pytestmark = pytest.mark.integration


def tree(root: Path, depth: int, fanout: int = 3) -> None:
    """Folders `fanout` wide and `depth` deep, a file in each."""
    if depth == 0:
        return
    for i in range(fanout):
        child = root / f"d{i}"
        child.mkdir(exist_ok=True)
        (child / "f.txt").write_text("x\n")
        tree(child, depth - 1, fanout)


def test_a_backtracking_regex_is_stopped_at_the_tool_time_limit(
    hardened: HardenedFleet, tmp_path: Path
) -> None:
    """Route: `grep` with `(a+)+$` over a line of a's held the worker slot for hours.
    Control: grep's regex runs in a child process killed at `tool_timeout_s` (5 s on this
    worker); the model gets an error result and the loop goes on."""
    workspace = hardened.root / "regex"
    workspace.mkdir()
    (workspace / "bait.txt").write_text("a" * 64 + "!\n")
    script = steps_script(tmp_path / "s.yaml", [tool_step("grep", pattern="(a+)+$")])

    started = time.monotonic()
    trace = run_forged(hardened, script, str(workspace))

    assert trace.status == "completed", trace
    assert time.monotonic() - started < 30
    assert "stopped after 5s" in tool_outputs(hardened, trace.trace_id)[0]


def test_a_glob_of_many_double_stars_is_linear(hardened: HardenedFleet, tmp_path: Path) -> None:
    """Route: `glob` with many `**` walked the tree once per `**` and per match (six of
    them over ~1,100 folders: minutes). Control: `**` runs collapse, segments match in
    linear time, depth and entries are bounded, and the tool stops at `tool_timeout_s`."""
    workspace = hardened.root / "deep"
    workspace.mkdir()
    tree(workspace, depth=6)
    pattern = "/".join(["**"] * 6) + "/*.txt"
    script = steps_script(tmp_path / "s.yaml", [tool_step("glob", pattern=pattern)])

    started = time.monotonic()
    trace = run_forged(hardened, script, str(workspace))

    assert trace.status == "completed", trace
    assert time.monotonic() - started < 30
    shown = tool_outputs(hardened, trace.trace_id)[0].splitlines()
    assert shown[-1] == "… and 92 more"  # 1,092 files: every one found, 1,000 shown
