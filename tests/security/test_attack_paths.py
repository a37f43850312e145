"""Route 10: reading and writing outside the workspace through hard links and symlink swaps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleet.inprocess import InProcessFleet
from fleet.models import text_of
from fleet.settings import Settings
from fleet.testing import ScriptedModel, call, calls, text

OUTSIDE = "OUTSIDE-SECRET-c0ffee"
SWAP = """
import os, sys
real, outside = sys.argv[1], sys.argv[2]
while True:
    os.rename(real, real + ".real")
    os.symlink(outside, real)
    os.unlink(real)
    os.rename(real + ".real", real)
"""


def run_tools(workspace: Path, *turns: object) -> list[tuple[bool, str]]:
    """Run a main agent through `turns` (scripted responses); (is_error, output) per tool."""
    model = ScriptedModel([*turns, text("done")])  # type: ignore[list-item]
    settings = Settings.from_env({"FLEET_WORKSPACE": str(workspace)})
    local = InProcessFleet.from_settings(settings, clients={"m": model})
    trace = local.run("work", model="m")
    tools = [m for m in local.store.messages(trace.trace_id) if m.role == "tool"]
    return [(bool(m.metadata.get("is_error")), text_of(m.content)) for m in tools]


def test_a_hard_link_to_an_outside_file_is_neither_read_nor_written(tmp_path: Path) -> None:
    """Route: a pre-existing hard link inside the workspace to a file outside read and
    wrote that file (no symlink for the path check to see). Control: a file with more than
    one hard link is refused by every file tool."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{OUTSIDE}\n")
    os.link(outside / "secret.txt", workspace / "notes.txt")

    results = run_tools(
        workspace,
        call("read_file", path="notes.txt"),
        call("grep", pattern="SECRET"),
        call("write_file", path="notes.txt", content="pwned"),
        call("edit_file", path="notes.txt", old_text="OUTSIDE", new_text="pwned"),
    )

    assert [is_error for is_error, _ in results] == [True, False, True, True]
    assert all(OUTSIDE not in output for _, output in results)
    assert "hard links" in results[0][1]
    assert (outside / "secret.txt").read_text() == f"{OUTSIDE}\n"


def test_a_folder_swapped_for_a_symlink_mid_call_never_reads_outside(tmp_path: Path) -> None:
    """Route: a folder swapped for a symlink to outside between the path check and the
    open (TOCTOU) made read_file read outside. Control: paths are opened component by
    component with O_NOFOLLOW from the root's descriptor: no check-then-open window."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "d").mkdir(parents=True)
    outside.mkdir()
    (workspace / "d" / "f.txt").write_text("inside\n")
    (outside / "f.txt").write_text(f"{OUTSIDE}\n")
    # The attacker: another process sharing the workspace, flipping `d` as fast as it can.
    swapper = subprocess.Popen([sys.executable, "-c", SWAP, str(workspace / "d"), str(outside)])
    try:
        reads = [("read_file", {"path": "d/f.txt", "end_line": n}) for n in range(1, 4001)]
        results = run_tools(workspace, calls(*reads))  # distinct arguments: no doom loop
    finally:
        swapper.kill()
        swapper.wait()
        if (workspace / "d.real").exists():  # killed mid-swap: put the folder back
            (workspace / "d").unlink(missing_ok=True)
            (workspace / "d.real").rename(workspace / "d")

    assert len(results) == 4000
    assert not [output for _, output in results if OUTSIDE in output]
    assert any("inside" in output for _, output in results)
