"""Route 3: a model with `bash` steals the worker's secrets, floods it, or leaves processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.security.attacker import leaked, none_left_with, redis_text
from tests.security.conftest import HardenedFleet, run_forged, steps_script, tool_outputs, tool_step

pytestmark = pytest.mark.integration

READ_WORKER_ENV = (
    "umount -l /proc; umount /proc;"  # as root: try to uncover the host's /proc first
    " tr '\\0' '\\n' < /proc/$PPID/environ; tr '\\0' '\\n' < /proc/1/environ;"
    " for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; env;"
    " cat /proc/self/../$PPID/environ; ls /proc | head -50"
)


def high_water_kb(pid: int) -> int:
    """The process's peak resident memory (VmHWM) in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_the_shell_cannot_read_the_workers_environment(
    hardened: HardenedFleet, tmp_path: Path
) -> None:
    """Route: with FLEET_ALLOW_SHELL=1, `tr '\\0' '\\n' < /proc/$PPID/environ` printed every
    worker secret (and the name-based scrub missed GH_PAT, DB_PWD, SENTRY_DSN, ...).
    Control: an allow-listed environment, and the command runs as pid 1 of its own pid
    namespace with a private /proc and no capabilities: the worker is not there to read."""
    script = steps_script(tmp_path / "s.yaml", [tool_step("bash", command=READ_WORKER_ENV)])

    trace = run_forged(hardened, script, str(hardened.root))

    outputs = tool_outputs(hardened, trace.trace_id)
    assert trace.status == "completed" and outputs, trace
    assert "PATH=" in outputs[0]  # the command did run and print its own environment
    with redis.Redis.from_url(hardened.url) as client:
        assert leaked(redis_text(client)) == []


def test_setsid_children_are_gone_when_the_call_returns(
    hardened: HardenedFleet, tmp_path: Path
) -> None:
    """Route: `setsid sleep ... &` outlived the command (a new session escapes the process
    group kill). Control: the pid namespace dies with its pid 1, taking every process in it."""
    command = (
        "setsid sleep 314.159 >/dev/null 2>&1 &"
        " nohup setsid bash -c 'sleep 314.159' >/dev/null 2>&1 &"
    )
    script = steps_script(tmp_path / "s.yaml", [tool_step("bash", command=command)])

    trace = run_forged(hardened, script, str(hardened.root))

    assert trace.status == "completed", trace
    assert none_left_with("314.159")


def test_output_is_capped_while_it_streams(hardened: HardenedFleet, tmp_path: Path) -> None:
    """Route: output was read whole before it was cut (300 MB -> 619 MB RSS on the worker).
    Control: at most output_limit_chars * 4 bytes are kept; the rest is read and dropped."""
    before_kb = high_water_kb(hardened.worker_pid)
    flood = tool_step("bash", command="head -c 200000000 /dev/zero | tr '\\0' a")
    script = steps_script(tmp_path / "s.yaml", [flood])

    trace = run_forged(hardened, script, str(hardened.root))

    assert trace.status == "completed", trace
    assert "[truncated " in tool_outputs(hardened, trace.trace_id)[0]
    assert high_water_kb(hardened.worker_pid) - before_kb < 50_000
