"""bash's box (`fleet.tools.sandbox`): its user, its limits, its network, its PATH."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.config.shell import ShellLimits
from fleet.errors import ConfigError, ToolError
from fleet.settings import Settings
from fleet.tools import sandbox
from fleet.tools.base import ToolContext
from fleet.tools.sandbox import NOBODY_UID, ShellUser, shell_user
from fleet.tools.shell import bash, shell_env
from tests.security.attacker import shell_writable

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching bash's user needs root")


def boxed_ctx(workspace: Path, **limits: object) -> ToolContext:
    return ToolContext(
        workspace=shell_writable(workspace),
        allow_shell=True,
        bash_timeout_s=10,
        tool_timeout_s=10,
        shell_limits=replace(ShellLimits(), **limits),  # type: ignore[arg-type]
    )


@as_root
def test_a_root_worker_runs_bash_as_nobody_in_the_workspace(tmp_path: Path) -> None:
    result = bash(boxed_ctx(tmp_path), "id -u; id -G; touch made.txt")
    assert result.output.split() == [str(NOBODY_UID), str(NOBODY_UID)]
    assert (tmp_path / "made.txt").stat().st_uid == NOBODY_UID


def test_the_shell_user_is_resolved_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert shell_user(None) == ShellUser(NOBODY_UID, NOBODY_UID)
    assert shell_user("nobody") == ShellUser(NOBODY_UID, NOBODY_UID)
    assert shell_user("4242") == ShellUser(4242, 4242)  # a bare uid needs no passwd entry
    with pytest.raises(ToolError, match=r"FLEET_SHELL_USER='no-such-user': no such user"):
        shell_user("no-such-user")
    with pytest.raises(ToolError, match=r"FLEET_SHELL_USER='root': bash must not run as root"):
        shell_user("root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert shell_user(None) is None and shell_user("1000") is None
    with pytest.raises(ToolError, match=r"not root cannot switch users"):
        shell_user("nobody")


@as_root
def test_bash_is_refused_when_its_user_could_write_the_workers_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Attack: the worker's site-packages is writable by bash's user (owned by it here).
    packages = shell_writable(tmp_path / "site-packages")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "worker_paths", lambda: (packages,))
    with pytest.raises(ToolError, match=r"uid 65534, which can write the worker's .*site-pack"):
        sandbox.check_not_writable(ShellUser(NOBODY_UID, NOBODY_UID))
    os.chown(packages, 0, 0)
    sandbox.check_not_writable(ShellUser(NOBODY_UID, NOBODY_UID))  # root-owned 0755: fine
    packages.chmod(0o777)
    with pytest.raises(ToolError, match=r"can write the worker's"):
        sandbox.check_not_writable(ShellUser(NOBODY_UID, NOBODY_UID))


def test_path_loses_every_virtual_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    worker_bin = Path(sys.prefix) / "bin"
    path = os.pathsep.join([str(venv / "bin"), str(worker_bin), "/usr/bin", "/bin"])
    assert shell_env({"PATH": path})["PATH"] == "/usr/bin:/bin"
    assert shell_env({"PATH": str(venv / "bin")})["PATH"] == sandbox.DEFAULT_PATH


def test_a_cpu_spinner_is_killed_at_the_cpu_limit(tmp_path: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = bash(boxed_ctx(tmp_path, cpu_s=1), "bash -c 'while :; do :; done'; echo rc=$?")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert "rc=152" in result.output  # 128 + SIGXCPU
    # CPU seconds, not wall time: on a loaded machine one CPU second may take many more.
    used_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert used_s < 2.5, used_s  # (0.86 s counted once: the kill lands at the limit's tick)


def test_without_network_bash_reaches_nothing(tmp_path: Path) -> None:
    if sandbox.sandbox_prefix(True) is None:
        pytest.skip("this kernel refuses network namespaces")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        command = f"cat /proc/net/dev | tail -n +3 | cut -d: -f1; echo > /dev/tcp/127.0.0.1/{port}"
        result = bash(boxed_ctx(tmp_path, network="none"), command)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # the listener in the worker's network saw nothing
    assert result.output.split()[0] == "lo" and "unreachable" in result.output
    with_network = bash(boxed_ctx(tmp_path), "cat /proc/net/dev | wc -l")
    assert int(with_network.output) >= 3  # the host network has lo and more


def test_no_network_without_namespaces_refuses_bash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "sandbox_prefix", lambda network_off=False: None)
    with pytest.raises(ToolError, match=r"FLEET_SHELL_NETWORK=none needs network namespaces"):
        bash(boxed_ctx(tmp_path, network="none"), "true")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("FLEET_SHELL_NETWORK", "off", r"FLEET_SHELL_NETWORK='off': expected one of"),
        ("FLEET_SHELL_MAX_PROCS", "0", r"FLEET_SHELL_MAX_PROCS='0': expected a whole number"),
        ("FLEET_SHELL_MAX_FILE_BYTES", "-1", r"FLEET_SHELL_MAX_FILE_BYTES='-1': expected"),
        ("FLEET_SHELL_CPU_S", "1.5", r"FLEET_SHELL_CPU_S='1.5': expected a whole number"),
    ],
)
def test_bad_shell_settings_are_one_clear_error(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: value})


def test_a_bad_shell_setting_stops_the_cli_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_SHELL_NETWORK": "off"}
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "run", "--inline", "task"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fleet: error: FLEET_SHELL_NETWORK='off': expected one of ('host', 'none')"
    ]
