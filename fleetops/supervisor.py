"""The processes `fleet up` keeps alive: restarted with backoff, never taken down together.

A worker (or the embedded Redis, or Flower) that dies is restarted after 1 s, 2 s, 4 s ...
up to 30 s, with a log line each time; a process that then stays up for a minute counts as
healthy again and its next death restarts after 1 s. Its siblings are never touched: only
Ctrl-C/SIGTERM to `fleet up` stops everything (`stop_all`).

Every child dies with `fleet up`, even when `fleet up` is SIGKILLed: the kernel sends it
SIGTERM (`PR_SET_PDEATHSIG`, set between fork and exec), and a worker whose supervisor is
gone gives its drain `ORPHAN_GRACE_S` before it exits hard (`guard_orphan`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

FIRST_RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0
HEALTHY_AFTER_S = 60.0
"""A process up this long is healthy again: its next death restarts it after 1 s."""
STOP_TIMEOUT_S = 10.0
"""Warm shutdown gets this long; then SIGKILL (the sweeper resumes what was cut off)."""
ORPHAN_GRACE_S = 10.0
"""How long a worker whose `fleet up` died may drain before it exits hard."""
SUPERVISOR_PID_ENV = "FLEET_SUPERVISOR_PID"
"""Set in a supervised worker's environment: the pid whose death makes it an orphan."""
_PR_SET_PDEATHSIG = 1

Say = Callable[[str], None]


def restart_delay_s(failures: int) -> float:
    """Backoff before restart number `failures` (1, 2, 3 ...): 1 s, 2 s, 4 s ... 30 s."""
    return float(min(MAX_RESTART_DELAY_S, FIRST_RESTART_DELAY_S * 2 ** max(0, failures - 1)))


def die_with_parent() -> None:
    """Run in a child before exec: SIGTERM it when its parent dies, even by SIGKILL."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def python_module(module: str, *args: str) -> list[str]:
    """The argv running `python -m module args` on this interpreter, without `-m`'s path entry.

    `-P`: `python -m` would put the working directory (for `fleet up`, by default a
    workspace root) first on the child's `sys.path`, so a package an agent wrote there would
    shadow the fleet's own (`fleet.security.importguard`).
    """
    return [sys.executable, "-P", "-m", module, *args]


def spawn(argv: list[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `argv` in its own process group, output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # safe: `fleet up` starts no other threads
        )


@dataclass
class Child:
    """A process `fleet up` started and keeps running; `start` makes a new one."""

    name: str
    start: Callable[[], subprocess.Popen[bytes]]
    log_path: Path
    process: subprocess.Popen[bytes]
    started_s: float = field(default_factory=time.monotonic)
    failures: int = 0
    """Deaths since it was last healthy."""
    restart_at_s: float | None = None
    """Set while it is dead and waiting for its backoff."""

    @classmethod
    def launch(
        cls, name: str, start: Callable[[], subprocess.Popen[bytes]], log_path: Path
    ) -> Child:
        """Start the process now."""
        return cls(name, start, log_path, start())

    @property
    def pid(self) -> int:
        """The pid of its current process."""
        return self.process.pid

    def death(self) -> str | None:
        """Why it is dead (its exit code and log tail), or None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        return f"{self.name} (pid {self.pid}) exited with code {code}: {log_tail(self.log_path)}"

    def tend(self, now_s: float, say: Say) -> bool:
        """Notice a death (schedule a restart) or restart when due; True if it restarted."""
        if self.process.poll() is None:
            if now_s - self.started_s >= HEALTHY_AFTER_S:
                self.failures = 0
            return False
        if self.restart_at_s is None:
            self.failures += 1
            delay_s = restart_delay_s(self.failures)
            self.restart_at_s = now_s + delay_s
            say(f"{self.death()}; restarting in {delay_s:.0f} s (log {self.log_path})")
            return False
        if now_s < self.restart_at_s:
            return False
        try:
            self.process = self.start()
        except Exception as exc:  # e.g. Redis would not come up: try again later
            self.restart_at_s = None
            say(f"{self.name} did not restart: {exc}")
            return False
        self.started_s, self.restart_at_s = now_s, None
        say(f"{self.name} restarted (pid {self.pid})")
        return True


def supervise(
    children: list[Child], say: Say, on_restart: Callable[[], None], poll_s: float = 0.2
) -> None:
    """Keep every child running until interrupted (KeyboardInterrupt from the signal handler)."""
    while True:
        now_s = time.monotonic()
        restarted = [child.tend(now_s, say) for child in children]  # every child, each poll
        if any(restarted):
            on_restart()
        time.sleep(poll_s)


def stop_all(children: list[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every child's group, wait up to `timeout_s` in all, SIGKILL the rest."""
    running = [c for c in children if c.process.poll() is None]
    for child in running:
        _signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in running:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child.pid, signal.SIGKILL)  # the leader is unreaped: the group is ours
            child.process.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a log, joined on one line."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(text[-lines:]) or "empty log"


def guard_orphan(env: Mapping[str, str], poll_s: float = 0.5) -> None:
    """In a supervised worker: exit hard `ORPHAN_GRACE_S` after its `fleet up` is gone.

    The kernel's SIGTERM (PDEATHSIG) starts a warm drain; this bounds it, so a worker never
    outlives its supervisor by more than the grace (its leases lapse; the next `fleet up`'s
    sweepers resume what it was running). No-op outside `fleet up` (`env` does not name
    its pid).
    """
    supervisor = env.get(SUPERVISOR_PID_ENV)
    if not supervisor:
        return

    def watch() -> None:
        while os.getppid() == int(supervisor):
            time.sleep(poll_s)
        time.sleep(ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="fleet-orphan-guard", daemon=True).start()
