"""The `bash` tool: off unless allowed, timed, capped, and without the worker's secrets."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from fleet.errors import ToolError
from fleet.tools.base import ToolContext, ToolResult
from fleet.tools.workspace import truncate

ALLOW_SHELL_ENV = "FLEET_ALLOW_SHELL"
"""Environment switch that, set to 1, lets a worker run shell commands at all."""
DRAIN_TIMEOUT_S = 2.0
"""After a kill, how long to wait for the last output of the killed command."""
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
_URL_WITH_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@|[?&]password=", re.IGNORECASE)


def bash(ctx: ToolContext, command: str, timeout_s: float | None = None) -> ToolResult:
    """Run a shell command with bash in the workspace folder; stderr is merged into stdout.

    Background processes do not outlive the command.

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
    limit_s = ctx.bash_timeout_s if timeout_s is None else min(timeout_s, ctx.bash_timeout_s)
    if limit_s <= 0:
        raise ToolError("timeout_s must be positive")
    raw, exit_code = _run(command, ctx.workspace, limit_s)
    output = truncate(raw.decode("utf-8", errors="replace"), ctx.output_limit_chars)
    if exit_code is None:
        return ToolResult(
            title=f"bash timed out after {limit_s:g}s",
            output=output or "(no output)",
            is_error=True,
            metadata={"exit_code": None, "timed_out": True},
        )
    return ToolResult(
        title=f"bash exit {exit_code}",
        output=output or "(no output)",
        metadata={"exit_code": exit_code, "timed_out": False},
    )


def scrubbed_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without variables that look like secrets (API keys, tokens, passwords in URLs).

    The model reads whatever a command prints, and what it reads lands in the trace.
    """
    return {
        name: value
        for name, value in env.items()
        if not _SECRET_NAME.search(name) and not _URL_WITH_PASSWORD.search(value)
    }


def _run(command: str, cwd: Path, timeout_s: float) -> tuple[bytes, int | None]:
    """Run `command` in its own process group; exit code None means it timed out."""
    shell = shutil.which("bash") or "/bin/sh"
    with subprocess.Popen(
        [shell, "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=scrubbed_env(os.environ),
        start_new_session=True,  # its own group, so a kill reaches every child
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            return out, proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            return _drain(proc), None
        finally:
            _kill_group(proc.pid)


def _drain(proc: subprocess.Popen[bytes]) -> bytes:
    """Output printed before the kill; empty if a stray process still holds the pipe."""
    try:
        out, _ = proc.communicate(timeout=DRAIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return b""
    return out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
