"""The `bash` tool: off unless allowed, timed, capped, and blind to the worker's secrets.

Why a sandbox and not a scrub. A command run with the worker's uid can read the worker's
environment through `/proc/$PPID/environ`, whatever variables were removed from its own
environment, and a name-based scrub misses `GH_PAT`, `DB_PWD` or `redis://pw@host`. So:

1. **Allow-list, not deny-list.** The command sees PATH, HOME, LANG, TERM, TZ and the names
   the operator lists in `FLEET_SHELL_ENV`; nothing else of the worker's environment.
2. **It cannot see the worker's process.** The command runs as pid 1 of a new pid
   namespace with its own `/proc` (`unshare --pid --mount --mount-proc`), so the worker's
   pid, `/proc/$PPID` (0 there) and the real `/proc/1` do not exist for it. As root that
   needs CAP_SYS_ADMIN; a non-root worker adds `--user --map-root-user`.
3. **No capabilities.** `setpriv` empties the bounding, inheritable and ambient sets and sets
   no_new_privs before bash starts. Workers often run as root (these machines, many
   containers), and a root child keeps CAP_SYS_PTRACE, which reads any process's environ
   whatever PR_SET_DUMPABLE says, and CAP_SYS_ADMIN, which could unmount the private /proc.
   Without capabilities it can do neither.
4. **Fallback where namespaces are refused** (Docker's default seccomp profile blocks
   them): the worker marks itself non-dumpable (`PR_SET_DUMPABLE=0`) and the command runs
   without capabilities, so `/proc/<worker>/environ` answers EACCES (a non-dumpable
   target needs CAP_SYS_PTRACE, which the command lacks). Without `setpriv` as root, or
   without both mechanisms, bash is refused rather than run unprotected.
5. **Nothing outlives the call.** In the pid namespace, when bash (pid 1) exits the kernel
   kills every process left in it, `setsid` or not; `--kill-child` takes bash down if the
   `unshare` process is killed. In the fallback, the process group is killed and every
   process still carrying this call's marker variable is hunted down.
6. **Its own user and limits** (`fleet.tools.sandbox`): a root worker runs bash as
   `FLEET_SHELL_USER` (default `nobody`), which cannot write the worker's venv, package or
   state, with per-call file-size and CPU limits, its own cgroup bounding its processes
   and memory (`fleet.tools.cgroups`; per user where the host has no cgroups), and
   optionally no network.
7. **Output is capped while it streams**: at most `output_limit_chars * 4` bytes are kept,
   the rest is read and dropped, so `yes` or a 300 MB file cannot grow the worker.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleet.config.shell import ShellLimits
from fleet.errors import ToolError
from fleet.tools import cgroups
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.sandbox import DEFAULT_PATH, box

ALLOW_SHELL_ENV = "FLEET_ALLOW_SHELL"
"""Environment switch that, set to 1, lets a worker run shell commands at all."""
BASE_ENV = ("PATH", "HOME", "LANG", "TERM", "TZ")
"""The worker's variables every command sees; FLEET_SHELL_ENV adds more by name."""
MARKER_ENV = "FLEET_SHELL_CALL"
"""Set to a fresh id per call: the fallback finds the call's stray processes by it."""
_READ_CHUNK = 65_536


@dataclass(frozen=True)
class _Outcome:
    output: bytes
    dropped_bytes: int
    exit_code: int | None
    """None: killed at the time limit."""


def bash(ctx: ToolContext, command: str, timeout_s: float | None = None) -> ToolResult:
    """Run a shell command with bash in the workspace folder; stderr is merged into stdout.

    The command sees only a few environment variables, cannot see the worker's process,
    and no process it starts outlives it.

    Args:
        ctx: The run's workspace and limits.
        command: The command line, run as `bash -c COMMAND`.
        timeout_s: Seconds before the command is killed; defaults to (and is capped
            at) the configured limit.
    """
    if not ctx.allow_shell:
        raise ToolError(
            f"bash is disabled: set {ALLOW_SHELL_ENV}=1 on the worker "
            "and use a preset that allows bash"
        )
    limit_s = min(ctx.bash_timeout_s, ctx.tool_timeout_s)
    limit_s = limit_s if timeout_s is None else min(timeout_s, limit_s)
    if limit_s <= 0:
        raise ToolError("timeout_s must be positive")
    # A launcher building its child's environment (tests/test_imports.py allows this read):
    # only PATH, HOME, LANG, TERM, TZ and the FLEET_SHELL_ENV names pass to bash.
    env = shell_env(os.environ, ctx.shell_env)
    outcome = _run(
        command, ctx.workspace, env, ctx.shell_limits, limit_s, ctx.output_limit_chars * 4
    )
    output = _cut(outcome, ctx.output_limit_chars)
    if outcome.exit_code is None:
        return ToolResult(
            title=f"bash timed out after {limit_s:g}s",
            output=output or "(no output)",
            is_error=True,
            metadata={"exit_code": None, "timed_out": True},
        )
    return ToolResult(
        title=f"bash exit {outcome.exit_code}",
        output=output or "(no output)",
        metadata={"exit_code": outcome.exit_code, "timed_out": False},
    )


def _cut(outcome: _Outcome, limit_chars: int) -> str:
    """The kept output cut to `limit_chars`, the marker counting what was never kept too."""
    text = outcome.output.decode("utf-8", errors="replace")
    dropped = max(0, len(text) - limit_chars) + outcome.dropped_bytes
    return f"{text[:limit_chars]}\n… [truncated {dropped} chars]" if dropped else text


def shell_env(env: Mapping[str, str], extra_names: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables a command may see: PATH, HOME, LANG, TERM, TZ and `extra_names`.

    PATH loses every folder of a Python virtual environment: bash must not find (and
    plant a `.pth` in) an interpreter the worker uses.
    """
    kept = {name: env[name] for name in (*BASE_ENV, *extra_names) if name in env}
    folders = [f for f in kept.get("PATH", "").split(os.pathsep) if f and not _in_venv(f)]
    kept["PATH"] = os.pathsep.join(folders) or DEFAULT_PATH
    return kept


def _in_venv(folder: str) -> bool:
    """Whether `folder` is a venv's `bin` (its parent holds `pyvenv.cfg`) or inside this one."""
    path = Path(folder)
    in_own = sys.prefix != sys.base_prefix and path.is_relative_to(sys.prefix)
    return in_own or (path.parent / "pyvenv.cfg").exists()


def _run(
    command: str,
    cwd: Path,
    env: dict[str, str],
    limits: ShellLimits,
    timeout_s: float,
    keep_bytes: int,
) -> _Outcome:
    """Run `command` sandboxed; output past `keep_bytes` is read and dropped."""
    bash_path = shutil.which("bash", path=DEFAULT_PATH) or "/bin/bash"
    host = cgroups.probe()
    boxed = box(limits, per_call_pids=host.pids is not None)
    marker = ""
    if not boxed.namespaced:
        marker = uuid.uuid4().hex
        env = {**env, MARKER_ENV: marker}
    with cgroups.call_group(host, limits.max_procs, limits.max_memory_bytes) as join:
        return _boxed(
            [*join, *boxed.prefix, bash_path, "-c", command],
            cwd,
            env,
            marker,
            timeout_s,
            keep_bytes,
        )


def _boxed(
    argv: list[str], cwd: Path, env: dict[str, str], marker: str, timeout_s: float, keep_bytes: int
) -> _Outcome:
    """Run the boxed argv; every process it left is killed when it ends or times out."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own group, so a kill reaches every child
    ) as proc:
        assert proc.stdout is not None
        try:
            kept, dropped, finished = _stream(proc, timeout_s, keep_bytes)
        finally:
            _kill_group(proc.pid)
            if marker:
                _kill_marked(marker)
            proc.stdout.close()
        code = proc.wait() if finished else None
        return _Outcome(kept, dropped, code)


def _stream(
    proc: subprocess.Popen[bytes], timeout_s: float, keep_bytes: int
) -> tuple[bytes, int, bool]:
    """Read until EOF or the deadline; True when the output ended before the deadline."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    kept = dropped = 0
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break  # output closed but still running: it is killed as timed out
            return b"".join(chunks), dropped, True
        room = max(0, keep_bytes - kept)
        chunks.append(chunk[:room])
        kept += min(room, len(chunk))
        dropped += max(0, len(chunk) - room)
    return b"".join(chunks), dropped, False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _kill_marked(marker: str) -> None:
    """Kill processes whose environment carries `marker` (fallback mode's `setsid` escapees)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone, or not ours to read
