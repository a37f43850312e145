"""Container probes for workers: a heartbeat file for liveness, a ready file for readiness.

No probe talks to the broker. A Redis restart must not make the kubelet restart every
worker at once (a restarted worker would only wait for the same Redis); the worker's own
reconnect loop handles that. Liveness catches what a restart does fix: a process that is
wedged, so its heartbeat thread no longer runs.

    fleet probe --max-age-s 60     # liveness: the heartbeat file is fresh
    fleet probe --ready            # readiness: the worker is consuming its queues
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PROBE_DIR_ENV = "FLEET_PROBE_DIR"
"""Where the probe files live (`Settings.probe_dir`, default /tmp)."""
ALIVE_FILE = "fleet-worker-alive"
"""Touched every HEARTBEAT_INTERVAL_S by the worker's heartbeat thread."""
READY_FILE = "fleet-worker-ready"
"""Present from `worker_ready` until the worker starts shutting down."""
HEARTBEAT_INTERVAL_S = 10.0
DEFAULT_MAX_AGE_S = 60.0
"""Liveness fails when the heartbeat is older: several missed beats, not one slow one."""
SOFT_SHUTDOWN_WINDOW_S = 180
"""How long a worker told to stop (SIGTERM) may take to let go of its work.

Running agents stop after their current turn and are re-queued (see `workers.signals`),
so the window is one turn: a model request (the HTTP clients time out at 120 s) plus its
tool calls. Compose's `stop_grace_period` and Kubernetes' `terminationGracePeriodSeconds`
must be longer; past them the worker is killed and the sweeper re-enqueues its traces once
their leases expire, repeating only the turn that was cut off."""


class HeartbeatFile:
    """A daemon thread touching the alive file every `interval_s` until `stop`."""

    def __init__(self, directory: Path, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        """Prepare; `start` writes the first beat at once."""
        self.path = directory / ALIVE_FILE
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat now, then every `interval_s`."""
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the file: the process is going away."""
        self._stop.set()
        self.path.unlink(missing_ok=True)

    def beat(self) -> None:
        """Touch the file (create it if needed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError:  # a full or read-only /tmp must not kill the worker
                log.warning("heartbeat file %s not written", self.path, exc_info=True)


def mark_ready(directory: Path, ready: bool = True) -> None:
    """Write (or, with `ready=False`, remove) the ready file."""
    path = directory / READY_FILE
    if ready:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()}\n")
    else:
        path.unlink(missing_ok=True)


def check(
    directory: Path, *, ready: bool, max_age_s: float, now_s: float | None = None
) -> str | None:
    """Why the probe fails, or None when it passes.

    Args:
        directory: The probe directory of the worker.
        ready: Check readiness (the ready file) instead of liveness (the heartbeat's age).
        max_age_s: The oldest heartbeat that still counts as alive.
        now_s: The current time (epoch seconds), for tests.
    """
    if ready:
        return None if (directory / READY_FILE).exists() else "worker not ready"
    try:
        age_s = (time.time() if now_s is None else now_s) - (directory / ALIVE_FILE).stat().st_mtime
    except FileNotFoundError:
        return "no heartbeat yet"
    if age_s > max_age_s:
        return f"heartbeat is {age_s:.0f} s old (limit {max_age_s:g} s)"
    return None
