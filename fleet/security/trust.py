"""What the operator decides and nothing an agent writes can change.

The model's output, batch files and anything an agent reads are untrusted. These checks
keep each of them inside what the operator set in the environment:

- every workspace lies under one of `FLEET_WORKSPACE_ROOTS` (checked at submission *and*
  where a tool runs, so a forged task message cannot point a worker at `/`);
- `fleet.yaml` comes only from the operator (`FLEET_CONFIG` or an explicit path) and never
  from inside a workspace root, where an agent could have written it;
- `api_key_env` names only variables the operator allows, so a config cannot make a worker
  send `AWS_SECRET_ACCESS_KEY` as a bearer token;
- `scripted:` models, which read a file the trace names, load only when enabled;
- the worker's own interpreter, site-packages and package lie outside every root, so no
  tool can plant code it runs later (a `.pth` file runs at every interpreter start), and
  nothing it imports comes from a root (`fleet.security.importguard`).
"""

from __future__ import annotations

import functools
import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse

from fleet.errors import ConfigError
from fleet.security.importguard import guard_imports

WORKSPACE_ROOTS_ENV = "FLEET_WORKSPACE_ROOTS"
ALLOW_SCRIPTED_ENV = "FLEET_ALLOW_SCRIPTED"
API_KEY_ENVS_ENV = "FLEET_API_KEY_ENVS"
_PROVIDER_KEY_NAME = re.compile(r"[A-Z][A-Z0-9_]*_API_KEY")
"""`api_key_env` names allowed without listing them: `OPENROUTER_API_KEY` and the like."""


def parse_roots(value: str | None, defaults: Iterable[Path]) -> tuple[Path, ...]:
    """`FLEET_WORKSPACE_ROOTS` (colon-separated) as absolute real paths, else `defaults`."""
    raw = [Path(p).expanduser() for p in (value or "").split(os.pathsep) if p.strip()]
    return tuple(dict.fromkeys(p.resolve() for p in (raw or list(defaults))))


def under_roots(path: Path, roots: Iterable[Path]) -> bool:
    """Whether the real `path` is one of `roots` or inside one (symlinks followed)."""
    return _real_under(path.expanduser().resolve(), roots)


def _real_under(real: Path, roots: Iterable[Path]) -> bool:
    return any(real.is_relative_to(root) for root in _real_roots(tuple(roots)))


@functools.lru_cache(maxsize=32)
def _real_roots(roots: tuple[Path, ...]) -> tuple[Path, ...]:
    """The operator's roots as real paths, resolved once per process.

    Settings are read once; a root later swapped for a symlink keeps its first real path,
    the stricter check. The workspace itself is resolved at every check.
    """
    return tuple(root.resolve() for root in roots)


def check_workspace_root(path: Path, roots: tuple[Path, ...]) -> Path:
    """The real workspace path, or `ConfigError` when it lies outside every root.

    The message names the workspace and the variable to change, never file contents.
    """
    real = path.expanduser().resolve()
    if not _real_under(real, roots):  # resolved once: this runs before every tool turn
        allowed = os.pathsep.join(str(r) for r in roots) or "(none)"
        raise ConfigError(
            f"workspace {str(path)!r} is outside {WORKSPACE_ROOTS_ENV} ({allowed}):"
            " choose one inside them (--workspace DIR, or FLEET_WORKSPACE), or add its"
            f" folder to {WORKSPACE_ROOTS_ENV} on the workers and the client"
        )
    return real


def check_config_path(path: Path, roots: tuple[Path, ...]) -> None:
    """Refuse a `fleet.yaml` an agent could have written: one inside a workspace root."""
    if under_roots(path, roots):
        raise ConfigError(
            f"{path}: config file is inside a workspace root, where agents can write;"
            f" move it out of {WORKSPACE_ROOTS_ENV} and point FLEET_CONFIG at it"
        )


def worker_paths() -> tuple[Path, ...]:
    """Where this process's code comes from: interpreter, prefixes, stdlib, site dirs, `fleet`.

    Unresolved where it matters: a venv's `bin/python` is a symlink to the system's, but the
    venv's `site-packages`, whose `.pth` files it runs, sits beside the link.
    """
    paths = [Path(sys.executable).parent, Path(sys.prefix), *map(Path, site.getsitepackages())]
    # A venv still imports the base interpreter's standard library, and so does grep's -S helper.
    paths += [Path(sys.base_prefix), Path(sysconfig.get_path("stdlib"))]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        paths.append(Path(site.getusersitepackages()))
    paths.append(Path(__file__).resolve().parents[1])  # the fleet package
    return tuple(dict.fromkeys(p.absolute() for p in paths))


def check_interpreter(roots: tuple[Path, ...]) -> None:
    """Refuse to run from code an agent could write; keep every later import out of the roots.

    Any `worker_paths()` inside a root is refused; then `guard_imports` drops the
    `sys.path` entries inside a root, refuses a module already imported from one, and
    guards every later import (lazy ones, Celery's `cwd_in_path`).
    """
    for path in worker_paths():
        if _real_under(path.resolve(), roots) or _real_under(path, roots):
            raise ConfigError(
                f"the fleet's own code {str(path)!r} is inside a workspace root, where agents"
                f" can write: install it outside {WORKSPACE_ROOTS_ENV}"
                f" ({os.pathsep.join(str(r) for r in roots)}) or narrow the roots"
            )
    guard_imports(roots)


def allowed_key_envs(value: str | None) -> frozenset[str]:
    """The extra `api_key_env` names listed in `FLEET_API_KEY_ENVS` (comma or colon list)."""
    return frozenset(n.strip() for n in re.split(r"[,:]", value or "") if n.strip())


def check_key_env(where: str, name: str, extra: frozenset[str]) -> None:
    """`name` must look like a provider key (`*_API_KEY`) or be listed by the operator."""
    if name and not _PROVIDER_KEY_NAME.fullmatch(name) and name not in extra:
        raise ConfigError(
            f"{where}: api_key_env {name!r} is not allowed: name a *_API_KEY variable"
            f" or list it in {API_KEY_ENVS_ENV}"
        )


def check_scripted_allowed(allowed: bool) -> None:
    """`scripted:` models read a file the trace names: only with `FLEET_ALLOW_SCRIPTED=1`."""
    if not allowed:
        raise ConfigError(
            f"scripted models are disabled: set {ALLOW_SCRIPTED_ENV}=1 (tests and demos only)"
        )


PUBLIC_API_HOSTS = frozenset({"api.openai.com", "api.anthropic.com"})
"""A provider at one of these hosts cannot work without a key, so a missing one fails early."""


def api_key(env: Mapping[str, str], api_key_env: str, base_url: str, provider: str) -> str:
    """A provider's key from the environment; a public API without one is a `ConfigError`.

    Raises:
        ConfigError: the key holds control characters (it would forge headers), or a
            provider at a public API host has none; the message names the variable only.
    """
    key = (env.get(api_key_env, "") if api_key_env else "").strip()
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise ConfigError(f"{api_key_env} contains control characters")
    if not key and urlparse(base_url).hostname in PUBLIC_API_HOSTS:
        # Keys are read where the model is called: a worker started before the key was
        # exported has none, whatever the submitting shell holds.
        how = (
            f"set {api_key_env} in the workers' environment (export it before `fleet up`"
            " or `fleet worker` starts them)"
            if api_key_env
            else "give the provider an api_key_env in fleet.yaml"
        )
        raise ConfigError(f"provider {provider!r} needs an API key: {how}")
    return key
