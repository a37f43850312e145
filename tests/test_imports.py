"""The import graph: no cycles (hidden in functions or TYPE_CHECKING or not), layers kept.

Every `import` statement of every module counts, wherever it stands: an import moved into
a function or under `TYPE_CHECKING` still couples the two modules, it only hides the cycle.
"""

from __future__ import annotations

import ast
import functools
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
