"""Attacks on the shell's limits from one call onto another (issue 39, item 8).

Every call runs as the same shell user (`nobody` under a root worker), and `RLIMIT_NPROC`
counts every process of that user: one call's fork bomb left every other bash call on the
host unable to start a process. Now each call has its own cgroup (`fleet.tools.cgroups`),
so a flood or a memory hog in one call stops at that call's bound while a second call, at
the same time, runs as usual.

The floods are bounded: by the call's limit (`MAX_PROCS` here), by the call's time limit,
and each sleeper by its own duration; everything is killed when the call returns and the
tests check that none of it is left.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleet.config.shell import ShellLimits
from fleet.tools import cgroups
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.shell import bash
from tests.fleetkit import wait_until
from tests.procs import start_worker, wait_for_workers
from tests.security.attacker import shell_writable
from tests.test_fleet_recovery import database_url

LOG_DB = 6
MAX_PROCS = 32
MAX_MEMORY_BYTES = 64 << 20
FLOOD_S = 8.0
SLEEPER = "20.4137"
"""The flood's sleep duration: how its processes are found (and counted) on the host."""

pytestmark = pytest.mark.skipif(
    cgroups.probe().version == "none",
    reason=f"no cgroups for the shell here: {cgroups.probe().why}",
)


def ctx(workspace: Path, timeout_s: float) -> ToolContext:
    limits = ShellLimits(max_procs=MAX_PROCS, max_memory_bytes=MAX_MEMORY_BYTES)
    return ToolContext(
        workspace=shell_writable(workspace),
        allow_shell=True,
        bash_timeout_s=timeout_s,
        tool_timeout_s=timeout_s,
        shell_limits=limits,
    )


def sleepers() -> int:
    found = 0
    for entry in Path("/proc").iterdir():
        try:
            found += entry.name.isdigit() and SLEEPER in (entry / "cmdline").read_text()
        except OSError:
            continue
    return found


def beside(workspace: Path, hog: str, when_started: float = 0.0) -> tuple[ToolResult, ToolResult]:
    """`hog` in one call and `/bin/true && echo ok` (a fork and an exec) in another."""
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(bash, ctx(workspace, FLOOD_S), hog)
        if when_started:
            wait_until(lambda: sleepers() >= MAX_PROCS // 2, 10, "the flood to fill its call")
        second = pool.submit(bash, ctx(workspace, 10.0), "/bin/true && echo ok")
        return first.result(timeout=FLOOD_S + 20), second.result(timeout=FLOOD_S + 20)


def test_a_fork_flood_in_one_call_leaves_the_other_calls_their_processes(tmp_path: Path) -> None:
    flood = f"for i in $(seq 400); do sleep {SLEEPER} & done 2>/dev/null; wait"
    started = time.monotonic()
    flooded, other = beside(tmp_path, flood, when_started=1.0)
    assert other.output.strip() == "ok" and not other.is_error, other
    assert flooded.metadata.get("timed_out") or flooded.is_error, flooded
    assert time.monotonic() - started < FLOOD_S + 15
    wait_until(lambda: sleepers() == 0, 5, "every process of the flood to be gone")
    pids = cgroups.probe().pids
    mine = list(pids.glob(f"call-{os.getpid()}-*")) if pids else []
    assert mine == [], "every call's group is removed when it returns"


def test_a_memory_hog_in_one_call_is_killed_at_its_bound_the_other_runs(tmp_path: Path) -> None:
    if cgroups.probe().memory is None:
        pytest.skip("no memory cgroup for the shell here")
    hog = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived ${#x}"
    hogged, other = beside(tmp_path, hog)
    assert other.output.strip() == "ok" and not other.is_error, other
    assert "survived" not in hogged.output, "200 MB held by a call bounded at 64 MiB"


def test_fleet_doctor_says_how_this_host_bounds_a_call() -> None:
    from fleetops.doctor import check_shell

    check = check_shell()
    assert check.status == "ok" and check.detail.startswith("per call: cgroup"), check


def test_a_host_without_cgroups_is_a_warning_naming_the_per_user_limit() -> None:
    host = cgroups.CgroupHost("none", why="no cgroup file system is mounted")
    assert host.describe().startswith("per user only (RLIMIT_NPROC")
    with cgroups.call_group(host, MAX_PROCS, MAX_MEMORY_BYTES) as join:
        assert join == ()


@pytest.mark.integration
def test_a_worker_that_may_run_bash_says_at_start_how_a_call_is_bounded(redis_url: str) -> None:
    url = database_url(redis_url, LOG_DB)
    with start_worker(url, concurrency=1, env_extra={"FLEET_ALLOW_SHELL": "1"}) as worker:
        wait_for_workers(url, [worker.name])
        assert "fleet worker: bash limits per call: cgroup" in worker.log(), worker.log()
