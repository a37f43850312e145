"""The package path of the README: a wheel installs into a fresh venv and `fleet demo` runs.

Built from this tree with pip (what `python -m build --wheel` does, without needing the
`build` package here), installed into a new venv in a temporary folder far from the
checkout, and `fleet demo` run there with no FLEET_* variable: its scripted example and
redis-server come from the installed package and its dependencies, not the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_the_wheel_installs_in_a_fresh_venv_and_fleet_demo_completes(tmp_path: Path) -> None:
    started = time.monotonic()
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("agent_fleet-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=400,
    )
    work = tmp_path / "somewhere"
    work.mkdir()
    (work / "notes.md").write_text("# notes\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "VIRTUAL_ENV"))}
    env |= {"XDG_STATE_HOME": str(tmp_path / "state"), "PATH": f"{venv / 'bin'}:{env['PATH']}"}
    demo = subprocess.run(
        ["fleet", "demo"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "5 branches, 5 completed" in demo.stdout
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fleet; print(fleet.__file__)"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert not installed.startswith(str(ROOT))  # the package, not the checkout
    print(f"\nwheel built, installed and demo run in {time.monotonic() - started:.0f} s")  # noqa: T201
