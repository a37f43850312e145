"""The import graph: no cycles (hidden in functions or TYPE_CHECKING or not), layers kept.

Every `import` statement of every module counts, wherever it stands: an import moved into
a function or under `TYPE_CHECKING` still couples the two modules, it only hides the cycle.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fleet", "workers", "fleetops", "tests", "bench")
LAYERS = {"fleet": set(), "workers": {"fleet"}, "fleetops": {"fleet", "workers"}}
"""What each package may import of the others (anything outside the project is free)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The project modules `name` imports, each resolved to the module it names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import mod` names a module; `from mod import thing` names its module.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        elif isinstance(node, ast.Call) and _is_import_module(node):
            targets = [node.args[0].value]  # type: ignore[attr-defined]
        else:
            continue
        yield from (t for t in targets if t in modules and t != name)


def _is_import_module(node: ast.Call) -> bool:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (
        called == "import_module"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    modules = project_modules()
    return {name: frozenset(imported(name, path, modules)) for name, path in modules.items()}


def find_cycle(graph: Mapping[str, AbstractSet[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_no_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_package_imports_only_the_layers_below_it(package: str) -> None:
    allowed = LAYERS[package] | {package}
    wrong = sorted(
        f"{source} -> {target}"
        for source, targets in import_graph().items()
        if source.split(".")[0] == package
        for target in targets
        if target.split(".")[0] in LAYERS and target.split(".")[0] not in allowed
    )
    assert not wrong, wrong


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    # The check itself must be able to fail: a -> b at top level, b -> a inside a function.
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f() -> None:\n    from a import x\n")
    modules = {"a": a, "b": b}
    graph = {name: set(imported(name, path, modules)) for name, path in modules.items()}
    assert find_cycle(graph) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


PRODUCT = ("fleet", "workers", "fleetops")
"""Packages that ship: the environment and test support rules below apply to them."""
ENV_READERS = {
    "fleet.settings": "the one reader: Settings, process_env() and process_redactor()",
    "fleet.tools.shell": "a launcher: bash's environment is a filtered copy of the worker's",
    "fleetops.cli.ops": "a launcher: `fleet worker` hands its Celery runtime the fleet's URLs",
}
"""Product modules allowed to touch `os.environ`, each with the reason."""
_ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def environment_reads(path: Path) -> list[str]:
    """Where a module touches the process environment: `os.environ`, `from os import getenv`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _ENV_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{path.name}:{node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = [a.name for a in node.names if a.name in _ENV_NAMES]
            found += [f"{path.name}:{node.lineno}: from os import {n}" for n in names]
    return found


def test_only_settings_reads_the_environment() -> None:
    # Settings are read once, in fleet/settings.py, and passed down (`Settings.env` for the
    # raw mapping); a launcher may build a child's environment, and says so.
    modules = project_modules()
    wrong = [
        read
        for name, path in modules.items()
        if name.split(".")[0] in PRODUCT and name not in ENV_READERS
        for read in environment_reads(path)
    ]
    assert not wrong, wrong
    stale = [name for name in ENV_READERS if not environment_reads(modules[name])]
    assert not stale, f"allowed but reading nothing: {stale}"


def test_the_environment_scan_finds_every_form(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "import os\nfrom os import getenv as g\n"
        "def f() -> str:\n    return os.environ['A'] + os.getenv('B', '') + g('C')\n"
    )
    assert environment_reads(path) == [
        "m.py:2: from os import getenv",
        "m.py:4: os.environ",
        "m.py:4: os.getenv",
    ]


def test_product_code_never_imports_fleet_testing() -> None:
    # Test support ships for tests and users; scripted models load from fleet.llm.scripted.
    wrong = sorted(
        source
        for source, targets in import_graph().items()
        if source.split(".")[0] in PRODUCT and source != "fleet.testing"
        if "fleet.testing" in targets
    )
    assert not wrong, wrong


def test_importing_the_worker_reads_no_settings() -> None:
    # Settings are read on first use: a bad variable fails the command that needs it, with
    # one line, instead of every import of the tasks (a fresh interpreter: nothing cached).
    env = {**os.environ, "FLEET_LEASE_TTL_MS": "not-a-number"}
    code = "import workers.tasks, workers.signals, fleetops.cli.main; print('imported')"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.strip()) == (0, "imported"), done.stderr[-2000:]


FLEET_LAYERS = (
    # The base: plain values and the one exception family; how a process imports redis-py.
    "hidden_imports",
    "errors",
    "ids",
    "goals",
    "runstate",
    "models",
    # The schemas of fleet.yaml's and preset files' blocks (they import only the base).
    "config",
    # Pieces that know no run: secret handling, Redis and memory storage, queries over
    # it, settings.
    "security",
    "storage",
    "memory",
    "control",
    "settings",
    "discovery",
    "llm",
    "limits",
    "presets",
    "tools",
    "mcp",
    "observe",
    "experiences",
    # The wiring every run shares, then what runs on it.
    "runtime",
    "history",
    "lifecycle",
    "owners",
    "batchapi",
    "conversation",
    "remote",
    "children",
    "loop",
    "batch",
    # The public face.
    "inprocess",
    "backends",
    "client",
    "aio",
    "testing",
    "",
)
"""fleet's packages and top-level modules, lowest first: each may import only those above
it in this list (`""` is `fleet/__init__.py`). docs/architecture.md draws the same stack."""
FLEET_KNOTS: set[tuple[str, str]] = set()
"""Imports against the direction above that are not untied yet, each with why."""


def fleet_unit(module: str) -> str | None:
    """The entry of FLEET_LAYERS a fleet module belongs to (its package, or itself)."""
    parts = module.split(".")
    return None if parts[0] != "fleet" else (parts[1] if len(parts) > 1 else "")


def layer_violations(graph: Mapping[str, AbstractSet[str]]) -> list[str]:
    """Every import from a fleet unit to one at its level or above it, knots excepted."""
    rank = {unit: i for i, unit in enumerate(FLEET_LAYERS)}
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if (unit := fleet_unit(source)) is not None
        for target in targets
        if (other := fleet_unit(target)) is not None and other != unit
        if rank[other] >= rank[unit] and (source, target) not in FLEET_KNOTS
    )


def test_fleet_packages_import_only_downwards() -> None:
    assert not layer_violations(import_graph())


def test_every_fleet_package_has_a_place_and_every_knot_is_still_tied() -> None:
    graph = import_graph()
    units = {fleet_unit(name) for name in graph} - {None}
    assert units == set(FLEET_LAYERS), "place new packages in FLEET_LAYERS"
    untied = [knot for knot in FLEET_KNOTS if knot[1] not in graph.get(knot[0], ())]
    assert not untied, f"no longer imported, drop from FLEET_KNOTS: {untied}"


def test_the_layer_check_finds_an_upward_import() -> None:
    # storage importing the loop is exactly what the table forbids.
    graph = {"fleet.storage.store": {"fleet.loop.runner", "fleet.errors"}, "fleet.errors": set()}
    assert layer_violations(graph) == ["fleet.storage.store -> fleet.loop.runner"]


BASE_UNITS = frozenset(FLEET_LAYERS[: FLEET_LAYERS.index("models") + 1])
"""The base layer: plain values, ids, the exception family."""


def imports_outside(
    graph: Mapping[str, AbstractSet[str]], package: str, allowed: AbstractSet[str]
) -> list[str]:
    """Each import from `package` to a fleet unit outside it and outside `allowed`."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source == package or source.startswith(package + ".")
        for target in targets
        if (unit := fleet_unit(target)) is not None
        if unit != fleet_unit(package) and unit not in allowed
    )


def test_the_config_schemas_import_only_the_base() -> None:
    # fleet.yaml's and preset files' blocks sit below every package that reads them.
    assert imports_outside(import_graph(), "fleet.config", BASE_UNITS) == []


TOOL_PACKAGES = ("fleet.tools", "fleet.mcp")
"""Tools: each reaches the store only through a role its context or the runtime hands it."""


def storage_reached(graph: Mapping[str, AbstractSet[str]], package: str) -> list[str]:
    """Each import from `package` into `fleet.storage`."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source == package or source.startswith(package + ".")
        for target in targets
        if fleet_unit(target) == "storage"
    )


@pytest.mark.parametrize("package", TOOL_PACKAGES)
def test_a_tool_sees_a_role_never_the_storage_package(package: str) -> None:
    assert storage_reached(import_graph(), package) == []


def test_the_storage_check_finds_a_tool_importing_keys() -> None:
    graph = {"fleet.tools.web": {"fleet.storage.keys", "fleet.errors"}, "fleet.tools": set()}
    assert storage_reached(graph, "fleet.tools") == ["fleet.tools.web -> fleet.storage.keys"]
    assert imports_outside(graph, "fleet.tools", BASE_UNITS) == [
        "fleet.tools.web -> fleet.storage.keys"
    ]


READ_ONCE = {
    "FLEET_CONFIG": "CONFIG_ENV",
    "FLEET_MODEL": "MODEL_ENV",
    "FLEET_AGENTS_DIR": "AGENTS_DIR_ENV",
}
"""Variables once read in two places each: now only by their reader in fleet.security.envvalues."""


def variable_reads(source: str, variable: str, constant: str) -> int:
    """How often a module reads `variable` from a mapping (`.get(...)` or `[...]`)."""
    names = {variable, constant}
    found = 0
    for node in ast.walk(ast.parse(source)):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop") and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript):
            key = node.slice
        if isinstance(key, ast.Constant) and key.value in names:
            found += 1
        elif isinstance(key, ast.Name) and key.id in names:
            found += 1
    return found


@pytest.mark.parametrize("variable", sorted(READ_ONCE))
def test_each_of_these_variables_has_one_reader(variable: str) -> None:
    readers = sorted(
        name
        for name, path in project_modules().items()
        if name.split(".")[0] in PRODUCT
        and variable_reads(path.read_text(), variable, READ_ONCE[variable])
    )
    assert readers == ["fleet.security.envvalues"], readers


def test_the_reader_scan_finds_both_forms() -> None:
    source = "a = env.get('FLEET_MODEL') or x\nb = env[MODEL_ENV]\nc = {'FLEET_MODEL': 1}\n"
    assert variable_reads(source, "FLEET_MODEL", "MODEL_ENV") == 2
