"""The previous release in a venv of its own, for the mixed-version tests.

`previous_release()` exports the release's tree from git (`FLEET_PREVIOUS_REF`, default
`PREVIOUS_REF`: the last release) into `.venv/prev-<sha>/src` and makes a venv there whose
`fleet`, `workers` and `fleetops` are that tree's, beside this venv's third-party packages
(the releases of one window pin the same Celery, kombu and redis-py; a release that changes
a dependency's range says so in the CHANGELOG and this test installs it from the index).
Built once per checkout: the venv is kept, and a later session reuses it in ~0 s.

`git archive`, not `git worktree add`: the same tree, without a worktree registered in
the repository that a test killed mid-way would leave behind (`git worktree prune`).
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

PREVIOUS_REF = "8e0d467"
"""The last release (tag it `v0.1.0`): the fleet this session's work started from. From it to
0.2.0 is a stop-the-world upgrade (docs/operations.md "Upgrading"); once 0.2.0 is tagged, this
names it and the two releases run side by side."""
REF_ENV = "FLEET_PREVIOUS_REF"
CHECKOUT = Path(__file__).resolve().parent.parent
PACKAGES = ("fleet", "fleetops", "workers")


@dataclass(frozen=True)
class Release:
    """An installed release: its interpreter, its tree, and where to start it from."""

    ref: str
    sha: str
    python: Path
    src: Path

    def env(self) -> dict[str, str]:
        """The environment its processes need on top of the test's (none beyond its venv)."""
        return {"VIRTUAL_ENV": str(self.python.parent.parent)}


def resolve(ref: str) -> str | None:
    """The commit `ref` names in this checkout; None if git or the commit is missing."""
    try:
        out = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def previous_release(ref: str | None = None) -> Release | None:
    """The previous release installed (built on first use); None if the ref is not here."""
    ref = ref or os.environ.get(REF_ENV) or PREVIOUS_REF
    sha = resolve(ref)
    if sha is None:
        return None
    home = Path(sys.prefix) / f"prev-{sha[:12]}"
    release = Release(ref, sha, home / "bin" / "python", home / "src")
    lock_path = Path(sys.prefix) / f".prev-{sha[:12]}.lock"
    with lock_path.open("a") as lock:  # xdist processes build it once between them
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".built").exists():
            _build(sha, home)
    return release


def _build(sha: str, home: Path) -> None:
    """Export the tree and make the venv; `.built` last, so a build cut short is redone."""
    shutil.rmtree(home, ignore_errors=True)
    (home / "src").mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(CHECKOUT), "archive", "--format=tar", sha, *PACKAGES],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(home / "src", filter="data")
    venv = [sys.executable, "-m", "venv", "--without-pip", str(home)]
    subprocess.run(venv, check=True, capture_output=True)
    _link_packages(home, home / "src")
    (home / ".built").touch()


def _link_packages(venv: Path, src: Path) -> None:
    """The release's tree first, then this venv's third-party packages (no checkout)."""
    here = Path(sysconfig.get_paths()["purelib"])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / "previous-release.pth").write_text(f"{src}\n{here}\n")
