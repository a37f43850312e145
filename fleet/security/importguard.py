"""Every module a fleet process imports comes from outside the workspace roots.

A workspace root is where agents write (`write_file` needs no shell), so a `celery/`,
`redis/` or `fleet/` folder an agent leaves there must never be imported. Three ways it
could have been, each closed here or at the spawn:

- `python -m ...` puts its working directory first on `sys.path`; `fleet up` started its
  workers that way in its own directory, by default a root. The fleet's launchers now pass
  `-P` (no such entry; `fleetops.supervisor.python_module`); an entry inside a root that is
  there anyway (`PYTHONPATH`, a hand-typed `python -m`) is passed over by `RootGuard`.
- Celery puts the working directory back on `sys.path` while it imports task modules
  (`celery.utils.imports.cwd_in_path`), and a worker's working directory is a workspace;
  a module imported lazily later (a tool's HTTP client, a provider SDK) walks `sys.path`
  again. `RootGuard`, first on `sys.meta_path`, never loads a file that lies in a root,
  whoever put its folder on the path: it takes the copy found outside the roots, else
  the import fails.
- A module already imported from a root has run: `guard_imports` refuses to go on.

What this cannot catch: code that runs before the check, i.e. a shadowed `fleetops` or
`fleet` package itself under a bare `python -m` in a root. Only the launcher's `-P` (or
`fleet`'s console script, whose first path entry is its `bin/` folder) prevents that.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from fleet.errors import ConfigError


def _inside(path: str, roots: tuple[Path, ...]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(root) for root in roots)


def _origins(spec: importlib.machinery.ModuleSpec | None) -> list[str]:
    """The files and folders a module is (or would be) loaded from."""
    if spec is None:
        return []
    found = [spec.origin] if spec.origin and os.path.isabs(spec.origin) else []
    return found + [p for p in (spec.submodule_search_locations or []) if os.path.isabs(p)]


def module_origins(module: ModuleType) -> list[str]:
    """Where an imported module came from: its spec's origin and package folders, its file."""
    found = _origins(getattr(module, "__spec__", None))
    file = getattr(module, "__file__", None)
    return found + ([file] if isinstance(file, str) and os.path.isabs(file) else [])


class RootGuard(importlib.abc.MetaPathFinder):
    """A meta-path finder, first in line, that never loads code from a workspace root.

    It asks the finders after it for the module's spec. A spec whose file or package
    folder lies in a root is a shadow: the module is looked up again on the path without
    the roots' entries (the fleet's own copy, usually), and if there is none the import
    fails with `ImportError` naming the module and the file.
    """

    def __init__(self, roots: tuple[Path, ...]) -> None:
        """Guard imports against `roots` (real paths)."""
        self.roots = roots

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec the other finders give, or the one found outside the roots."""
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if isinstance(finder, RootGuard) or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is None:
                continue
            shadow = self._in_root(spec)
            if shadow is None:
                return spec
            entries = sys.path if path is None else path
            outside = [p for p in entries if not _inside(p or os.curdir, self.roots)]
            again = importlib.machinery.PathFinder.find_spec(fullname, outside, target)
            if again is not None and self._in_root(again) is None:
                return again
            raise ImportError(
                f"refused to import {fullname!r} from {shadow!r}: it is inside a workspace"
                " root where agents write",
                name=fullname,
            )
        return None

    def _in_root(self, spec: importlib.machinery.ModuleSpec) -> str | None:
        return next((o for o in _origins(spec) if _inside(o, self.roots)), None)


def guard_imports(roots: tuple[Path, ...]) -> None:
    """Keep this process's imports out of `roots`, now and for every later import.

    Refuses to go on when a module was already imported from a root, then puts a
    `RootGuard` for these roots first on `sys.meta_path` (replacing an earlier one), which
    covers every `sys.path` entry, those added later included (`''`, the working
    directory, is one: a bare `python -m` adds it).

    Raises:
        ConfigError: a loaded module's file lies in a root; names the module and file.
    """
    real = tuple(Path(os.path.realpath(root)) for root in roots)
    for name, module in list(sys.modules.items()):
        for origin in module_origins(module):
            if _inside(origin, real):
                raise ConfigError(
                    f"module {name!r} was imported from {origin!r}, inside a workspace root"
                    " where agents write: start the fleet with `fleet ...` or `python -P`,"
                    " outside the roots"
                )
    sys.meta_path[:] = [RootGuard(real)] + [
        f for f in sys.meta_path if not isinstance(f, RootGuard)
    ]
