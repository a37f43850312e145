"""`fleet up` as a supervisor: a killed worker comes back, a killed `fleet up` leaves nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.discovery import UpState, read_state
from fleetops.supervisor import HEALTHY_AFTER_S, Child, restart_delay_s
from tests.fleetkit import wait_until
from tests.procs import children_of, pid_alive
from tests.test_cli_ops import FLEET, up_env, up_state_dir
from tests.test_fleet_recovery import assert_collected_once, fleet_client, survey_script

STARTUP_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 90.0


@pytest.mark.parametrize(
    ("failures", "delay_s"), [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (40, 30.0)]
)
def test_restart_backoff_doubles_up_to_thirty_seconds(failures: int, delay_s: float) -> None:
    assert restart_delay_s(failures) == delay_s


def test_a_dead_child_is_restarted_after_its_backoff_and_healthy_again_later(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "60"]))
        return started[-1]

    child = Child.launch("sleeper", start, tmp_path / "none.log")
    try:
        child.tend(0.0, said.append)
        started[0].kill()
        started[0].wait()
        assert not child.tend(10.0, said.append)  # noticed: restart scheduled in 1 s
        assert "sleeper" in said[-1] and "restarting in 1 s" in said[-1]
        assert not child.tend(10.5, said.append)
        assert child.tend(11.0, said.append) and len(started) == 2
        assert said[-1] == f"sleeper restarted (pid {started[1].pid})"
        child.tend(11.0 + HEALTHY_AFTER_S, said.append)
        assert child.failures == 0
    finally:
        for process in started:
            process.kill()
            process.wait()


@contextlib.contextmanager
def fleet_up(
    directory: Path, *args: str, **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], UpState]]:
    """`fleet up` in `directory` (and `env`) until ready; SIGKILLs what is left at the end."""
    up = subprocess.Popen(
        [*FLEET, "up", *args],
        env=up_env(directory, FLEET_WORKSPACE=str(directory), FLEET_ALLOW_SCRIPTED="1", **env),
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    state_dir = up_state_dir(directory)
    started: list[int] = []
    try:

        def ready() -> bool:
            state = read_state(state_dir)
            return up.poll() is None and state is not None and state.pid == up.pid and state.ready

        wait_until(ready, STARTUP_TIMEOUT_S, "a ready fleet up")
        state = read_state(state_dir)
        assert state is not None
        started += [*state.worker_pids, state.embedded_redis_pid or 0]
        yield up, state
    finally:
        latest = read_state(state_dir)
        started += [*latest.worker_pids, latest.embedded_redis_pid or 0] if latest else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up.pid, signal.SIGKILL)
        up.communicate()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                if pid and pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_up_restarts_a_killed_worker_and_the_explore_in_flight_completes(tmp_path: Path) -> None:
    model = survey_script(tmp_path / "m.yaml", 8, latency_ms=400, turns=3)
    with fleet_up(tmp_path, "--workers", "2", "--concurrency", "4") as (up, state):
        victim, sibling = state.worker_pids
        with fleet_client(state.redis_url, state.redis_url, tmp_path) as fleet:
            handle = fleet.submit("survey", model=model)
            root = handle.trace_id
            wait_until(
                lambda: (
                    len([c for c in fleet.store.children(root) if fleet.trace(c).iteration]) >= 4
                ),
                RUN_TIMEOUT_S,
                "branches under way",
            )
            os.kill(victim, signal.SIGKILL)

            def restarted() -> bool:
                now = read_state(up_state_dir(tmp_path))
                return now is not None and victim not in now.worker_pids

            wait_until(restarted, 30, "fleet up to restart the killed worker")
            trace = handle.wait(timeout_s=RUN_TIMEOUT_S)
            assert_collected_once(fleet, trace.trace_id, 8)
        assert up.poll() is None, "fleet up keeps running"
        assert pid_alive(sibling), "the healthy sibling was never stopped"
        now = read_state(up_state_dir(tmp_path))
        assert now is not None and now.worker_pids[1] == sibling
        up.send_signal(signal.SIGINT)
        output = up.communicate(timeout=60)[0].decode()
    assert f"worker 1 (pid {victim}) exited with code -9" in output
    assert "restarting in 1 s" in output and "worker 1 restarted" in output
    assert up.returncode == 0, output


@pytest.mark.integration
def test_a_sigkilled_up_leaves_no_process_and_the_next_up_starts(tmp_path: Path) -> None:
    with fleet_up(tmp_path, "--workers", "2", "--concurrency", "2") as (up, state):
        group = [up.pid, *children_of(up.pid)]
        assert len(group) == 4  # Redis and two workers
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
        wait_until(lambda: not any(pid_alive(p) for p in group), 30, "every child to exit")
    with fleet_up(tmp_path, "--workers", "1", "--concurrency", "2") as (second, again):
        assert again.pid == second.pid and again.embedded_redis_pid not in group
        second.send_signal(signal.SIGINT)
        assert second.wait(60) == 0
