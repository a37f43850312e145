"""`fleet worker` (what `fleet up` runs) talks to the result backend the settings name.

It set Celery's result backend to FLEET_REDIS_URL whatever FLEET_RESULT_BACKEND_URL said: on a
Redis Cluster store, its workers ran Celery's results and the chord join on a cluster node
(`ClusterCrossSlotError` in the join, and a run's last write refused for keys of two slots),
which is how six explores under `fleet up` never ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import STOP_TIMEOUT_S

pytestmark = pytest.mark.integration

BANNER_TIMEOUT_S = 60.0
STORE_DB, RESULTS_DB = 4, 3
"""Databases of their own: the worker's presence and queues touch no other test's."""


def test_fleet_worker_uses_the_result_backend_it_is_given(redis_url: str, tmp_path: Path) -> None:
    server = redis_url.rsplit("/", 1)[0]
    results = f"{server}/{RESULTS_DB}"
    env = {
        **os.environ,
        "FLEET_REDIS_URL": f"{server}/{STORE_DB}",
        "FLEET_RESULT_BACKEND_URL": results,
        "FLEET_WORKSPACE": str(tmp_path),
    }
    log = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "fleetops.cli.main", "worker", "-c", "1", "-n", "urls@test"]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            argv,
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + BANNER_TIMEOUT_S
        while "results:" not in log.read_text(errors="replace"):
            assert worker.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "no banner"
            time.sleep(0.1)
    finally:  # its start-up is all this needs: killed, not drained
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(STOP_TIMEOUT_S)
    banner = next(line for line in log.read_text().splitlines() if "results:" in line)
    assert banner.rstrip().endswith(f"/{RESULTS_DB}"), banner
