"""The argv prefix that puts one `bash` call in its box: namespaces, limits, user, no caps.

`fleet.tools.shell` runs `[*prefix, bash, "-c", command]`, the prefix built here:

    unshare [--net] --pid --fork --kill-child --mount --mount-proc --   (namespaces)
    prlimit --fsize=N --cpu=N [--nproc=N] --                            (limits)
    setpriv [--reuid U --regid G --clear-groups] --no-new-privs ... --  (user, no caps)

Why each piece, in order:

- **Its own user.** A command with the worker's uid can write what the worker runs later:
  its venv (a `.pth` file runs at every interpreter start), its package, its state. So a
  root worker runs bash as `FLEET_SHELL_USER`, by default `nobody` (65534), which owns
  nothing of the worker; and bash is refused outright when the user it would run as can
  write the worker's interpreter, site-packages or package (`check_not_writable`).
- **Limits per call.** `RLIMIT_FSIZE` cuts a file-size bomb (the writer gets SIGXFSZ),
  `RLIMIT_CPU` a spinning process. A fork bomb and a memory hog stop at the call's own
  cgroup (`fleet.tools.cgroups`: `pids.max`, `memory.max`) where the host has cgroups;
  only where it has none does `RLIMIT_NPROC` stand in, which the kernel counts over every
  process of the real uid, that is over every call at once (so one call's fork bomb
  starves the others), and which is only applied when bash has a uid of its own: applied
  to the worker's uid it would count the worker's threads.
  `prlimit` sets them (not `preexec_fn`, which is unsafe in a threaded worker).
- **No network** (`FLEET_SHELL_NETWORK=none`): a network namespace with only a down
  loopback. Without namespaces that cannot be had, and bash is refused instead.
"""

from __future__ import annotations

import ctypes
import functools
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleet.config.shell import ShellLimits
from fleet.errors import ToolError
from fleet.security.trust import worker_paths

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
NOBODY_UID = 65534
"""The unprivileged uid (and gid) bash runs as under a root worker without FLEET_SHELL_USER."""
_DROP_CAPS = ("--no-new-privs", "--inh-caps=-all", "--bounding-set=-all")
_PR_SET_DUMPABLE = 4


@dataclass(frozen=True)
class ShellUser:
    """The uid and gid bash switches to (supplementary groups are cleared)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class Box:
    """How one call is boxed: the argv prefix, and whether a pid namespace holds it."""

    prefix: tuple[str, ...]
    namespaced: bool


def box(limits: ShellLimits, *, per_call_pids: bool = False) -> Box:
    """The prefix for a call under `limits`; `ToolError` when it cannot be boxed safely.

    `per_call_pids`: the call has a pids cgroup of its own (`fleet.tools.cgroups`), so
    no `RLIMIT_NPROC`, which would count every other call of the same user too.
    """
    user = shell_user(limits.user)
    check_not_writable(user)
    network_off = limits.network == "none"
    namespaces = sandbox_prefix(network_off)
    if namespaces is None and network_off:
        raise ToolError(
            "bash is unavailable: FLEET_SHELL_NETWORK=none needs network namespaces"
            " (unshare --net), which this host refuses"
        )
    if namespaces is None:
        _make_worker_undumpable()
    return Box(
        (
            *(namespaces or ()),
            *_limits_prefix(limits, user if not per_call_pids else None),
            *_drop_prefix(user),
        ),
        namespaced=namespaces is not None,
    )


def shell_user(configured: str | None) -> ShellUser | None:
    """The user bash switches to, or None to keep the worker's own uid.

    Raises:
        ToolError: an unknown user, root, or a switch a non-root worker cannot make.
    """
    euid = os.geteuid()
    if configured is None:
        return _nobody() if euid == 0 else None
    user = _lookup(configured)
    if user.uid == 0:
        raise ToolError(f"FLEET_SHELL_USER={configured!r}: bash must not run as root")
    if user.uid == euid:
        return None
    if euid != 0:
        raise ToolError(
            f"FLEET_SHELL_USER={configured!r}: a worker that is not root cannot switch users;"
            " unset it, or run the worker as root"
        )
    return user


def check_not_writable(user: ShellUser | None) -> None:
    """Refuse bash when its user could write what the worker runs (a `.pth`, a module)."""
    for path in worker_paths():
        if _writable(path, user):
            who = f"uid {user.uid}" if user else f"the worker's uid {os.geteuid()}"
            raise ToolError(
                f"bash is unavailable: it would run as {who}, which can write the worker's"
                f" {str(path)!r}; install the worker read-only for that user, or run the"
                " worker as root (bash then runs as FLEET_SHELL_USER, default nobody)"
            )


def _writable(path: Path, user: ShellUser | None) -> bool:
    if user is None:
        return os.access(path, os.W_OK)
    try:
        info = path.stat()
    except OSError:
        return False
    mode = info.st_mode
    return bool(
        (info.st_uid == user.uid and mode & stat.S_IWUSR)
        or (info.st_gid == user.gid and mode & stat.S_IWGRP)
        or mode & stat.S_IWOTH
    )


def _lookup(configured: str) -> ShellUser:
    try:
        entry = pwd.getpwuid(int(configured)) if configured.isdecimal() else None
        entry = entry or pwd.getpwnam(configured)
    except KeyError:
        if configured.isdecimal():  # a bare uid need not have a passwd entry
            return ShellUser(int(configured), int(configured))
        raise ToolError(f"FLEET_SHELL_USER={configured!r}: no such user") from None
    return ShellUser(entry.pw_uid, entry.pw_gid)


def _nobody() -> ShellUser:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return ShellUser(NOBODY_UID, NOBODY_UID)
    return ShellUser(entry.pw_uid, entry.pw_gid)


def _limits_prefix(limits: ShellLimits, nproc_user: ShellUser | None) -> tuple[str, ...]:
    prlimit = shutil.which("prlimit", path=DEFAULT_PATH)
    if prlimit is None:
        raise ToolError("bash is unavailable: it needs prlimit (util-linux) to bound each call")
    nproc = (f"--nproc={limits.max_procs}",) if nproc_user else ()
    # SIGXCPU at the soft limit (a process may save its work), SIGKILL a second later.
    cpu = f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}"
    return (prlimit, f"--fsize={limits.max_file_bytes}", cpu, *nproc, "--")


def _drop_prefix(user: ShellUser | None) -> tuple[str, ...]:
    setpriv = shutil.which("setpriv", path=DEFAULT_PATH)
    if setpriv is None and user is None and os.geteuid() != 0:
        return ()  # an unprivileged command has no capabilities to drop
    if setpriv is None:
        raise ToolError("bash is unavailable: a root worker needs setpriv (util-linux)")
    switch = (f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups") if user else ()
    return (setpriv, *switch, *_DROP_CAPS, "--")


@functools.cache
def sandbox_prefix(network_off: bool = False) -> tuple[str, ...] | None:
    """The namespace part of the prefix, or None when this host refuses namespaces.

    Probed once per process by running `true` inside it: as root without a user namespace
    first (it keeps the workspace's file ownership simple), then with one.
    """
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not unshare or not setpriv:
        return None
    namespaces: tuple[str, ...] = ("--pid", "--fork", "--kill-child", "--mount", "--mount-proc")
    namespaces += ("--net",) if network_off else ()
    userns = ("--user", "--map-root-user")
    for user in [(), userns] if os.geteuid() == 0 else [userns]:
        prefix = (unshare, *user, *namespaces, "--")
        try:
            probe = subprocess.run(
                [*prefix, setpriv, *_DROP_CAPS, "--", "true"],
                capture_output=True,
                timeout=10,
                env={"PATH": DEFAULT_PATH},
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


@functools.cache
def _make_worker_undumpable() -> None:
    """No pid namespace: `/proc/<worker>/environ` must answer EACCES to the command."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise ToolError("bash is unavailable: cannot protect the worker's environment")
