"""The previous release in a venv of its own, for the mixed-version tests.

`previous_release()` exports a release's tree from git into `.venv/prev-<sha>/src` and makes
a venv there whose `fleet`, `workers` and `fleetops` are that tree's, beside this venv's
third-party packages (the releases of one window pin the same Celery, kombu and redis-py; a
release that changes a dependency's range says so in the CHANGELOG and this test installs it
from the index). Built once per checkout: the venv is kept, and a later session reuses it in
~0 s.

Which release: `FLEET_PREVIOUS_REF` (any git revision), else `PREVIOUS` (the last release).
A release is pinned by its tag *and* its commit: a clone of main (what CI runs) has every
commit of main's history but not always its tags (a tag is pushed apart, and a mirror may
not carry them), so the commit is what is resolved; a tag that is present must name the
same commit, or the test stops at once rather than test another tree. A shallow clone has
neither: then `previous_release` returns None and the fixture fails under CI (`CI` set),
skipping only on a developer's machine.

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


@dataclass(frozen=True)
class Pin:
    """A release as git knows it: its tag and the commit the tag names."""

    tag: str
    commit: str


RELEASE_0_1_0 = Pin("v0.1.0", "8e0d467ccd1d73a0085a82773be41ecb9f8b99f2")
"""The first release: from it to 0.2.0 is a stop-the-world upgrade (docs/operations.md)."""
RELEASE_0_2_0 = Pin("v0.2.0", "91f6984a6bd8c3c5efcefae950c8899e905bd4fe")
"""The first release of the rules between releases: it and the next roll side by side."""
PREVIOUS = RELEASE_0_2_0
"""The last release: what this checkout must serve one fleet with (move it at each release)."""
REF_ENV = "FLEET_PREVIOUS_REF"
CHECKOUT = Path(__file__).resolve().parent.parent
PACKAGES = ("fleet", "fleetops", "workers")


class MovedTag(RuntimeError):
    """A release's tag names another commit than the one pinned here."""


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


def resolve_pin(pin: Pin) -> str | None:
    """The pinned commit if this checkout has it (its tag, if present, must agree).

    Raises:
        MovedTag: the tag is here and names another commit.
    """
    tagged = resolve(f"refs/tags/{pin.tag}")
    if tagged is not None and tagged != pin.commit:
        raise MovedTag(f"tag {pin.tag!r} names {tagged[:12]}, but the release is {pin.commit[:12]}")
    return resolve(pin.commit)


def previous_release(release: Pin | str | None = None) -> Release | None:
    """A release installed (built on first use); None if its commit is not in this checkout.

    `release`: a pin, or any git revision; by default `FLEET_PREVIOUS_REF`, else `PREVIOUS`.
    """
    release = release or os.environ.get(REF_ENV) or PREVIOUS
    if isinstance(release, Pin):
        ref, sha = release.tag, resolve_pin(release)
    else:
        ref, sha = release, resolve(release)
    if sha is None:
        return None
    home = Path(sys.prefix) / f"prev-{sha[:12]}"
    installed = Release(ref, sha, home / "bin" / "python", home / "src")
    lock_path = Path(sys.prefix) / f".prev-{sha[:12]}.lock"
    with lock_path.open("a") as lock:  # xdist processes build it once between them
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".built").exists():
            _build(sha, home)
    return installed


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
