"""Issue 24, items 1 and 4: code an agent plants is never run by the fleet; shells are bounded.

Routes: a `.pth` file written into a venv's site-packages ran in grep's helper (with the
worker's uid and environment) and in any interpreter bash started; a worker ran from a
venv inside the workspace root; one bash call ran 404 processes, and nothing bounded a fork
bomb or a file-size bomb.
"""

from __future__ import annotations

import ast
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.tools.base import ToolContext
from fleet.tools.files import write_file
from fleet.tools.search import GREP_CHILD, grep
from tests.fleetkit import wait_until
from tests.procs import start_worker
from tests.security.attacker import (
    SHELL_UID,
    leaked,
    live_processes_with,
    peak_processes,
    processes_of,
    world_writable,
)
from tests.security.conftest import (
    SHELL_MAX_FILE_BYTES,
    SHELL_MAX_PROCS,
    TOOL_TIMEOUT_S,
    HardenedFleet,
    hardened_worker,
    run_forged,
    steps_script,
    tool_outputs,
    tool_step,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
"""An interpreter the shell user can reach (the test venv's base may sit under /root)."""
PTH_PROBE = (
    "import os; p = os.environ.get('PROBE_OUT') or 'pth-ran.txt';"
    " f = open(p, 'w'); f.write('uid=%d\\n' % os.getuid());"
    " exec(\"try: f.write(open('/proc/%s/environ' % os.environ.get('WORKER_PID', os.getppid()))"
    ".read())\\nexcept OSError as e: f.write('refused: %s\\\\n' % e.strerror)\"); f.close()\n"
)
"""A `.pth` line: records who ran it and tries to copy the worker's environment beside it."""


def make_venv(python: Path, where: Path) -> Path:
    """A venv without pip at `where`; returns its site-packages folder."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(where)], check=True)
    return next(where.glob("lib/python3*/site-packages"))


def test_a_pth_written_by_write_file_never_runs_in_greps_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Route: write_file put `zz.pth` into the site-packages of the venv the worker ran from;
    the next grep started `python -I grep_child.py`, and site ran the `.pth` with the worker's
    uid. Control: the helper runs with `-I -S` (no site import, so no `.pth` anywhere)."""
    packages = make_venv(Path(sys.executable), tmp_path / ".venv")
    rel = packages.relative_to(tmp_path) / "zz.pth"
    ctx = ToolContext(workspace=tmp_path)
    write_file(ctx, str(rel), PTH_PROBE)
    write_file(ctx, "notes.txt", "needle\n")
    monkeypatch.setattr(sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    monkeypatch.chdir(tmp_path)  # where the probe would write its marker

    result = grep(ctx, "needle")

    assert "notes.txt:1: needle" in result.output
    assert not (tmp_path / "pth-ran.txt").exists()


def test_a_worker_whose_code_is_inside_a_workspace_root_refuses_to_start(
    redis_url: str,
) -> None:
    """Route: `make demo` ran workers from the checkout's .venv with the checkout as the
    workspace root, so write_file could plant a `.pth` the worker's next interpreter ran.
    Control: the worker refuses to start, one line, exit 2, before it takes any task."""
    env = {"FLEET_WORKSPACE_ROOTS": str(REPO)}
    with start_worker(redis_url, env_extra=env) as worker:
        code = worker.process.wait(timeout=60)
        log = worker.log()
    assert code == 2, log
    refusal = [line for line in log.splitlines() if line.startswith("fleet worker:")]
    assert len(refusal) == 1 and "inside a workspace root" in refusal[0], log
    assert "Traceback" not in log and "ready" not in log


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["run", "--inline", "--model", "scripted:x.yaml", "go"], id="run-inline"),
        pytest.param(["up", "--workers", "1"], id="up"),
        pytest.param(["demo", "--workspace", str(REPO)], id="demo"),
    ],
)
def test_commands_that_run_tools_from_a_root_holding_their_code_refuse(
    tmp_path: Path, command: list[str]
) -> None:
    """Route: `fleet run --inline` runs the tools in the CLI's process, the same exposure;
    `fleet up` and `fleet demo` start such workers. Control: the same refusal, one clear
    line, exit 2, before anything is started (no Redis, no state folder)."""
    env = {**os.environ, "FLEET_WORKSPACE_ROOTS": str(REPO), "FLEET_WORKSPACE": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", *command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "inside a workspace root" in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


def test_greps_helper_needs_nothing_but_the_standard_library() -> None:
    """`-S` drops site-packages from the helper's path: it may import the stdlib only."""
    tree = ast.parse(GREP_CHILD.read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert {name.split(".")[0] for name in imported} <= {*sys.stdlib_module_names, "__future__"}


@pytest.mark.skipif(os.geteuid() != 0, reason="switching bash's user needs a root worker")
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no system python for the shell user")
def test_a_pth_planted_by_bash_runs_only_as_the_shell_user(
    hardened: HardenedFleet, tmp_path: Path
) -> None:
    """Route: bash wrote a `.pth` into a venv it found and started that venv's python, which
    ran it with the worker's uid; the same for the worker's own venv. Control: bash runs as
    `nobody`: the `.pth` runs with no way to the worker's environment, and the worker's
    venv is not writable."""
    workspace = hardened.root / f"pth-{tmp_path.name}"
    packages = make_venv(SYSTEM_PYTHON, workspace / "venv")
    world_writable(workspace)
    worker_pth = Path(site.getsitepackages()[0]) / "zz-attack.pth"
    command = (
        f"cat > {packages.relative_to(workspace)}/zz.pth <<'EOF'\n{PTH_PROBE}EOF\n"
        f"WORKER_PID={hardened.worker_pid} venv/bin/python -c pass;"
        f" echo planted > {worker_pth}; touch {sys.prefix}/zz-attack"
    )
    script = steps_script(tmp_path / "s.yaml", [tool_step("bash", command=command)])

    try:
        trace = run_forged(hardened, script, str(workspace))
        planted = worker_pth.exists() or Path(sys.prefix, "zz-attack").exists()
    finally:  # on a failing run, the planted files must not stay in the suite's own venv
        worker_pth.unlink(missing_ok=True)
        Path(sys.prefix, "zz-attack").unlink(missing_ok=True)

    output = tool_outputs(hardened, trace.trace_id)[0]
    assert trace.status == "completed" and (workspace / "pth-ran.txt").exists(), output
    probe = (workspace / "pth-ran.txt").read_text()
    assert probe.startswith(f"uid={SHELL_UID}\n"), probe
    assert "refused:" in probe and leaked(probe) == [], probe
    assert not planted
    assert "Permission denied" in output


FLOOD_UID = 65530
"""bash's user in the flood tests alone: the kernel counts RLIMIT_NPROC over a uid, so the
bash calls other test processes make meanwhile (as nobody) neither count here nor starve."""
FLOOD_DB = 14


@pytest.fixture(scope="module")
def flood_fleet(redis_url: str) -> Iterator[HardenedFleet]:
    """The hardened worker with bash as `FLOOD_UID`, on a database of its own."""
    with hardened_worker(redis_url, FLOOD_DB, FLEET_SHELL_USER=str(FLOOD_UID)) as fleet:
        yield fleet


@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC needs bash on a uid of its own")
@pytest.mark.parametrize(
    "command",
    [
        pytest.param("for i in $(seq 1000); do sleep 30.24 & done; wait", id="flood"),
        pytest.param("bomb() { bomb | bomb & }; bomb; sleep 30.24", id="fork-bomb"),
    ],
)
def test_a_process_flood_is_cut_at_the_limit_and_leaves_nothing(
    flood_fleet: HardenedFleet, tmp_path: Path, command: str
) -> None:
    """Route: one bash call ran 404 processes; a fork bomb would take the host's pids for the
    whole time limit. Control: RLIMIT_NPROC on bash's own user (FLEET_SHELL_MAX_PROCS); the
    call ends with its time-limit error and the pid namespace takes every process with it."""
    script = steps_script(tmp_path / "s.yaml", [tool_step("bash", command=command)])
    started = time.monotonic()

    with peak_processes("30.24") as peak:
        trace = run_forged(flood_fleet, script, str(flood_fleet.root))

    assert trace.status == "completed", trace
    assert time.monotonic() - started < TOOL_TIMEOUT_S + 15
    # The shell user's processes, plus the root `unshare` that holds the namespace.
    assert 0 < peak[0] <= SHELL_MAX_PROCS + 1, peak
    output = tool_outputs(flood_fleet, trace.trace_id)[0]
    assert "Resource temporarily unavailable" in output, output
    assert live_processes_with("30.24") == []
    wait_until(lambda: processes_of(FLOOD_UID) == 0, 5, "the pid namespace to be reaped")
    os.kill(flood_fleet.worker_pid, 0)  # the worker lives on
    after = run_forged(
        flood_fleet,
        steps_script(tmp_path / "ok.yaml", [tool_step("bash", command="echo fine; id -u")]),
        str(flood_fleet.root),
    )
    assert tool_outputs(flood_fleet, after.trace_id)[0].split() == ["fine", str(FLOOD_UID)]


def test_a_file_size_bomb_is_cut_at_the_limit(hardened: HardenedFleet, tmp_path: Path) -> None:
    """Route: `head -c 2G /dev/zero > f` filled the disk for the whole time limit.
    Control: RLIMIT_FSIZE (FLEET_SHELL_MAX_FILE_BYTES): the writer gets SIGXFSZ at the cap."""
    workspace = world_writable(hardened.root / f"fsize-{tmp_path.name}")
    bomb = tool_step("bash", command="head -c 2G /dev/zero > f; echo exit=$?")
    script = steps_script(tmp_path / "s.yaml", [bomb])

    try:
        trace = run_forged(hardened, script, str(workspace))
        size = (workspace / "f").stat().st_size
    finally:
        shutil.rmtree(workspace)

    assert trace.status == "completed", trace
    assert size == SHELL_MAX_FILE_BYTES
    output = tool_outputs(hardened, trace.trace_id)[0]
    assert "File size limit exceeded" in output and "exit=153" in output, output
