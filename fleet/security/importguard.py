"""Every module a fleet process imports comes from outside the workspace roots.

A workspace root is where agents write (`write_file` needs no shell), so a `celery/`,
`redis/` or `fleet/` folder an agent leaves there must never be imported. Three ways it
could have been, each closed here or at the spawn:

- `python -m ...` puts its working directory first on `sys.path`; `fleet up` started its
  workers that way in its own directory, by default a root. The fleet's launchers now pass
  `-P` (no such entry; `fleetops.supervisor.python_module`), and `guard_imports` drops any
  entry inside a root that is there anyway (`PYTHONPATH`, a hand-typed `python -m`).
- Celery puts the working directory back on `sys.path` while it imports task modules
  (`celery.utils.imports.cwd_in_path`), and a worker's working directory is a workspace;
  a module imported lazily later (a tool's HTTP client, a provider SDK) walks `sys.path`
  again. `RootGuard`, first on `sys.meta_path`, refuses any import whose file lies in a
  root, whoever put its folder on the path.
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
    """A meta-path finder that refuses to import anything from inside a workspace root.

    It asks the finders after it for the module's spec and returns that spec unchanged,
    or raises `ImportError` when the spec's file or package folder lies in a root: the
    import fails loudly instead of falling back to another copy.
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
        """The spec the other finders give, unless it would load code from a root."""
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, RootGuard):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is None:
                continue
            for origin in _origins(spec):
                if _inside(origin, self.roots):
                    raise ImportError(
                        f"refused to import {fullname!r} from {origin!r}: it is inside a"
                        " workspace root, where agents write",
                        name=fullname,
                    )
            return spec
        return None


def guard_imports(roots: tuple[Path, ...]) -> None:
    """Keep this process's imports out of `roots`, now and for every later import.

    Drops each `sys.path` entry inside a root (`''` is the working directory), refuses to
    go on when a module was already imported from one, and puts a `RootGuard` for these
    roots first on `sys.meta_path` (replacing an earlier one).

    Raises:
        ConfigError: a loaded module's file lies in a root; names the module and file.
    """
    real = tuple(Path(os.path.realpath(root)) for root in roots)
    sys.path[:] = [p for p in sys.path if not _inside(p or os.curdir, real)]
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
