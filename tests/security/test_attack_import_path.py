"""Issue 39, route 1: the worker's import path held a folder agents write.

`fleet up` started its workers with `python -m ...` in its own directory, by default the
workspace root, and `python -m` puts that directory first on `sys.path`: a package an
agent wrote there with `write_file` shadowed the fleet's own on the next worker start and
read every provider key and the embedded Redis password. Celery also puts the working
directory back on `sys.path` while it imports task modules, and a worker's working
directory is a workspace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.discovery import read_state
from tests.fleetkit import wait_until
from tests.security.attacker import SECRET_ENV
from tests.security.conftest import steps_script, tool_step
from tests.test_cli_ops import up_env, up_state_dir
from tests.test_supervisor import fleet_up

RUN_TIMEOUT_S = 90.0
SAFE_CLI = [sys.executable, "-P", "-m", "fleetops.cli.main"]
"""The test's own commands: they run in the planted folder too, and must not import it."""
SHADOWED = ("fleetops", "fleet", "workers", "celery", "kombu", "redis", "billiard")
"""Packages a worker imports at start, each planted as a folder of the workspace."""


def probe(marker: Path, name: str) -> str:
    """Planted code: leaves `marker` (named by what ran) with the environment it saw."""
    return (
        "import os, sys\n"
        f"with open({str(marker)!r} + '-' + {name!r}, 'w') as out:\n"
        "    out.write(repr(sys.argv) + repr(dict(os.environ)))\n"
    )


def plant_steps(marker: Path) -> list[dict[str, object]]:
    """`write_file` calls planting every shadow, `sitecustomize` and a `.pth` at the root."""
    steps = [
        tool_step("write_file", path=f"{name}/__init__.py", content=probe(marker, name))
        for name in SHADOWED
    ]
    for name in ("sitecustomize", "usercustomize"):
        steps.append(tool_step("write_file", path=f"{name}.py", content=probe(marker, name)))
    pth = f"import os; open({str(marker)!r} + '-pth', 'w').write('ran')\n"
    return [*steps, tool_step("write_file", path="zz.pth", content=pth)]


def fleet_run(workspace: Path, script: Path, task: str) -> subprocess.CompletedProcess[str]:
    """The operator's plain `fleet run --json` in the fleet's directory."""
    return subprocess.run(
        [*SAFE_CLI, "run", "--json", "--model", f"scripted:{script}", task],
        env=up_env(workspace, FLEET_ALLOW_SCRIPTED="1", FLEET_NO_WORKER_TIMEOUT_S="10"),
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def answer(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The JSON `fleet run --json` printed (it succeeded)."""
    assert done.returncode == 0, done.stdout + done.stderr
    parsed: dict[str, object] = json.loads(done.stdout)
    return parsed


@pytest.mark.integration
def test_a_package_planted_in_fleet_ups_directory_never_runs_in_a_restarted_worker(
    tmp_path: Path,
) -> None:
    """Route: `write_file` planted `celery/`, `fleetops/`, ... in the directory `fleet up`
    ran in; the next worker start imported them with the worker's keys and Redis password.
    Control: workers start with `-P` and guard every import against the roots; the planted
    code never runs and the restarted worker takes the next task."""
    workspace = (tmp_path / "project").resolve()
    workspace.mkdir()
    marker = tmp_path / "ran"
    plant = steps_script(tmp_path / "plant.yaml", plant_steps(marker))
    env = {**SECRET_ENV, "FLEET_NO_WORKER_TIMEOUT_S": "10"}
    with fleet_up(workspace, "--workers", "1", "--concurrency", "2", **env) as (_, state):
        planted = answer(fleet_run(workspace, plant, "plant the shadows"))
        assert planted["status"] == "completed", planted
        assert (workspace / "celery" / "__init__.py").exists()
        (old,) = state.worker_pids
        os.kill(old, signal.SIGKILL)  # `fleet up` restarts it, in the planted directory

        def restarted() -> bool:
            latest = read_state(up_state_dir(workspace))
            return latest is not None and latest.worker_pids not in ([], [old])

        wait_until(restarted, 60, "a restarted worker")
        after = fleet_run(workspace, steps_script(tmp_path / "noop.yaml", []), "still there?")
    ran = sorted(p.name for p in tmp_path.glob("ran-*"))
    assert ran == [], f"planted code ran: {ran}"
    assert answer(after)["status"] == "completed", after  # the restarted worker took it


LAZY_PROBE = """
import sys
from pathlib import Path
from celery.utils.imports import import_from_cwd
from fleet.security.trust import check_interpreter
check_interpreter((Path.cwd(),))
try:
    import_from_cwd("planted_tool")  # Celery puts the working directory on sys.path
except ImportError as exc:
    print("refused:", exc)
sys.path.insert(0, ".")  # anything else that adds it, then a lazy import
try:
    import planted_lazy
except ImportError as exc:
    print("refused:", exc)
import colorsys  # a shadow of a real module: the real one is imported
assert colorsys.__file__.startswith(sys.base_prefix), colorsys.__file__
"""


def test_imports_from_a_root_are_refused_after_the_start_up_check(tmp_path: Path) -> None:
    """Route: a module imported late (Celery's `import_from_cwd` of a task module, a lazy
    import after something put the working directory on `sys.path`) came from the root.
    Control: after the start-up check a meta-path guard refuses any import whose file is
    inside a root: the planted module never runs; a shadow of a real module gives way to
    it, a module found only in the root fails to import with one line."""
    for name in ("planted_tool", "planted_lazy", "colorsys"):
        (tmp_path / f"{name}.py").write_text(f"open('ran-{name}', 'w').write('x')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    done = subprocess.run(
        [sys.executable, "-P", "-c", LAZY_PROBE],
        cwd=tmp_path,
        env={**env, "FLEET_WORKSPACE_ROOTS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == []
    refusals = done.stdout.strip().splitlines()
    assert len(refusals) == 2 and all("inside a workspace root" in r for r in refusals), refusals


def test_a_module_already_imported_from_a_root_stops_the_start(tmp_path: Path) -> None:
    """Route: `python -m fleetops.cli.main worker` typed by hand in a root, after planted
    code was imported from it (through `PYTHONPATH`, say). Control: the start-up check
    looks at every loaded module's file and refuses in one line, exit 2."""
    (tmp_path / "planted_early.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    code = (
        "import planted_early, sys\n"
        "from fleetops.cli.main import main\n"
        "sys.exit(main(['worker', '--queues', 'fleet.main']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "FLEET_WORKSPACE_ROOTS": str(tmp_path), "FLEET_REDIS_URL": "redis://x:1/0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "'planted_early'" in line and "inside a workspace root" in line, line
