"""The shell's limits: who a `bash` call runs as and what it may use (FLEET_SHELL_*)."""

from __future__ import annotations

from dataclasses import dataclass

SHELL_NETWORKS = ("host", "none")
"""FLEET_SHELL_NETWORK: bash shares the worker's network, or has none (`unshare --net`)."""


@dataclass(frozen=True)
class ShellLimits:
    """Who one `bash` call runs as and what it may use (`fleet.tools.sandbox` applies it)."""

    user: str | None = None
    """FLEET_SHELL_USER, a name or uid. Unset: `nobody` (65534) when the worker is root,
    else the worker's own uid (a non-root worker cannot switch users)."""
    max_procs: int = 256
    """FLEET_SHELL_MAX_PROCS: processes one call may have at once: its own cgroup's
    `pids.max` where the host has cgroups, else `RLIMIT_NPROC` of the shell user (counted
    over all of that user's processes; applied when bash runs as its own user)."""
    max_file_bytes: int = 1 << 30
    """FLEET_SHELL_MAX_FILE_BYTES: largest file one process may write (`RLIMIT_FSIZE`)."""
    cpu_s: int = 60
    """FLEET_SHELL_CPU_S: CPU seconds each process of the call may use (`RLIMIT_CPU`)."""
    max_memory_bytes: int = 2 << 30
    """FLEET_SHELL_MAX_MEMORY_BYTES: memory all processes of one call may hold together
    (its own cgroup, `fleet.tools.cgroups`; not bounded on a host without cgroups)."""
    network: str = "host"
    """FLEET_SHELL_NETWORK: `host`, or `none` for a network namespace with no interface."""
