"""A control group per `bash` call: its processes and memory bounded apart from every other.

`RLIMIT_NPROC` counts every process of a user, and every call runs as the same shell user,
so one call's fork bomb would leave every other call on the host unable to fork. Where the
host lets the worker make cgroups, each call gets its own, made before the call starts and
removed after it:

- **cgroup v2** (one unified hierarchy offering `pids` and `memory`): the calls' groups
  live under `fleet-shell/` at the hierarchy's root (the only place a group with
  processes of its own may still hand controllers down), `pids.max` and `memory.max` set,
  `memory.swap.max` 0 where it exists;
- **cgroup v1** (a `pids` and a `memory` hierarchy, as on this project's machines): the
  groups live under `fleet-shell/` beside the worker's own group in each hierarchy,
  `pids.max` and `memory.limit_in_bytes` set (`memory.memsw.limit_in_bytes` too where it
  exists, so swapping out is no way round it);
- **none** (no cgroup file system the worker may write, e.g. an unprivileged container):
  the old per-user `RLIMIT_NPROC` stays, and `fleet doctor` says so as a warning.

The call's first process joins its groups (`sh -c 'echo $$ > .../cgroup.procs; exec ...'`,
before the namespaces, limits and user switch of `fleet.tools.sandbox`), so every process
it ever starts is inside. When the call ends its groups are emptied (SIGKILL to whatever
is left: `cgroup.kill` on v2, each listed pid on v1) and removed. A worker killed mid-call
leaves its groups behind; the next worker on the host removes those of dead workers
(`call-<pid>-<id>`, by the pid) when it first probes.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fleet.errors import ToolError

BASE_NAME = "fleet-shell"
EMPTY_WAIT_S = 2.0
"""How long a finished call's group may take to empty after SIGKILL before it is left."""
_JOIN = 'for p in "$@"; do [ "$p" = -- ] && break; echo $$ > "$p" || exit 126; shift; done; '
_JOIN += 'shift; exec "$@"'


@dataclass(frozen=True)
class CgroupHost:
    """What this host gives a call: its cgroup version and where the calls' groups go."""

    version: Literal["v2", "v1", "none"]
    pids: Path | None = None
    """The folder each call's pids group is made in."""
    memory: Path | None = None
    """The folder each call's memory group is made in (v2: the same as `pids`)."""
    why: str = ""
    """For `none`: why not, as `fleet doctor` shows it."""

    def describe(self) -> str:
        """One line for `fleet doctor`."""
        if self.version == "none":
            return f"per user only (RLIMIT_NPROC of the shell user): {self.why}"
        made = ", ".join(
            f"{n} under {p}" for n, p in (("pids", self.pids), ("memory", self.memory)) if p
        )
        return f"per call: cgroup {self.version} ({made})"


@functools.cache
def probe() -> CgroupHost:
    """The cgroups this process may make per call, found once per process."""
    mounts = _mounts()
    refused = ""
    for found in (_v2, _v1):
        try:
            host = found(mounts)
        except OSError as exc:  # EACCES (not root), EROFS, EBUSY (v2 inside a namespace)
            refused = f"cannot make cgroups: {exc}"
            continue
        if host is not None:
            return host
    return CgroupHost("none", why=refused or _why_none(mounts))


@contextmanager
def call_group(
    host: CgroupHost, max_procs: int, max_memory_bytes: int
) -> Iterator[tuple[str, ...]]:
    """The argv prefix that puts one call in groups of its own, removed when it ends.

    Yields `()` on a host without cgroups. A group that cannot be made or limited is the
    call's `ToolError`: bash never runs unbounded where bounds were expected.
    """
    if host.version == "none":
        yield ()
        return
    name = f"call-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    made: list[Path] = []
    try:
        try:
            for base in dict.fromkeys(p for p in (host.pids, host.memory) if p is not None):
                group = base / name
                group.mkdir()
                made.append(group)
                _limit(host, base, group, max_procs, max_memory_bytes)
        except OSError as exc:
            raise ToolError(f"bash is unavailable: cannot make its cgroup: {exc}") from None
        sh = shutil.which("sh", path="/usr/bin:/bin") or "/bin/sh"
        procs = tuple(str(g / "cgroup.procs") for g in made)
        yield (sh, "-c", _JOIN, "fleet-cgroup", *procs, "--")
    finally:
        for group in made:
            _remove(group)


def _limit(host: CgroupHost, base: Path, group: Path, max_procs: int, memory: int) -> None:
    if base == host.pids:
        (group / "pids.max").write_text(str(max_procs))
    if base != host.memory:
        return
    if host.version == "v2":
        (group / "memory.max").write_text(str(memory))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        return
    (group / "memory.limit_in_bytes").write_text(str(memory))
    if (group / "memory.memsw.limit_in_bytes").exists():
        (group / "memory.memsw.limit_in_bytes").write_text(str(memory))


def _remove(group: Path) -> None:
    """Kill whatever is left in `group`, then remove it (left, empty or not, on failure)."""
    kill = group / "cgroup.kill"
    deadline = time.monotonic() + EMPTY_WAIT_S
    while time.monotonic() < deadline:
        try:
            if kill.exists():
                kill.write_text("1")
            else:
                for pid in (group / "cgroup.procs").read_text().split():
                    with suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)  # EBUSY: its processes are still being reaped


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(type, mount point, options) of every cgroup file system this process sees."""
    found = []
    with suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                found.append((parts[2], Path(parts[1]), set(parts[3].split(","))))
    return found


def _own(controller: str) -> str:
    """The path of the group this process is in, in the hierarchy of `controller`."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    raise FileNotFoundError(f"no {controller or 'unified'} hierarchy in /proc/self/cgroup")


def _v2(mounts: list[tuple[str, Path, set[str]]]) -> CgroupHost | None:
    for kind, point, _ in mounts:
        if kind != "cgroup2":
            continue
        offered = (point / "cgroup.controllers").read_text().split()
        if not {"pids", "memory"} <= set(offered):
            continue
        base = point / BASE_NAME
        (point / "cgroup.subtree_control").write_text("+pids +memory")
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+pids +memory")
        _sweep(base)
        return CgroupHost("v2", base, base)
    return None


def _v1(mounts: list[tuple[str, Path, set[str]]]) -> CgroupHost | None:
    """Per-call groups in the v1 `pids` hierarchy, and in `memory` where that one lets us."""
    pids = _v1_base(mounts, "pids")
    if pids is None:
        return None
    try:
        memory = _v1_base(mounts, "memory")
    except OSError:
        memory = None  # processes bounded per call all the same; memory by the host
    return CgroupHost("v1", pids, memory)


def _v1_base(mounts: list[tuple[str, Path, set[str]]], controller: str) -> Path | None:
    """`fleet-shell/` beside this process's group in the v1 hierarchy of `controller`."""
    for kind, point, options in mounts:
        if kind == "cgroup" and controller in options:
            base = point / _own(controller) / BASE_NAME
            base.mkdir(exist_ok=True)
            _sweep(base)
            return base
    return None


def _sweep(base: Path) -> None:
    """Remove the groups of workers that died mid-call (their pid is gone)."""
    for group in base.glob("call-*"):
        pid = group.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove(group)


def _why_none(mounts: list[tuple[str, Path, set[str]]]) -> str:
    if not mounts:
        return "no cgroup file system is mounted"
    return "no writable cgroup hierarchy offers the pids controller"
