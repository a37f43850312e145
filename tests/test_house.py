"""The house rules a newcomer relies on, checked on the source (issue 22's Done-when rows).

No Protocol wider than 15 methods, no module longer than 400 lines, at most 16 modules at
the top of `fleet/`, and no caller outside `fleet/storage/` that asks which store it has or
reaches for the store's Redis client.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("fleet", "workers", "fleetops")
MAX_PROTOCOL_METHODS = 15


def product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def protocol_widths(source: str) -> dict[str, int]:
    """Each Protocol class of a module -> its methods, those of its Protocol bases not counted."""
    widths = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) in ("Protocol", "typing.Protocol") for base in node.bases
        ):
            widths[node.name] = sum(isinstance(n, ast.FunctionDef) for n in node.body)
    return widths


MAX_MODULE_LINES = 400
MAX_TOP_LEVEL_MODULES = 16
LONG_BY_CONCEPT = {
    "fleetops/cli/commands.py": 500,
    "fleet/client.py": 440,
    "fleet/loop/fenced_run.py": 430,
}
"""Modules that are one concept longer than the cap, each with its own: the argument table
of every `fleet` command, read top to bottom (`fleet --help` imports it alone, so it must
stay one module of declarations; cutting it would split the table, not a concept); and
`Fleet`, the public client, one method per action a user takes (each a few lines handing
over to the package that does it); the fenced run, one loop and the match of every outcome
it meets (the waits, a cut, a stop landing at each instant: apart, each reads as a
fragment of the loop)."""


def test_no_module_is_longer_than_400_lines() -> None:
    long = {
        name: lines
        for path in product_files()
        if (lines := len(path.read_text(encoding="utf-8").splitlines()))
        > LONG_BY_CONCEPT.get(name := str(path.relative_to(ROOT)), MAX_MODULE_LINES)
    }
    assert not long, long


def test_the_top_of_fleet_keeps_only_the_public_face() -> None:
    modules = sorted(p.name for p in (ROOT / "fleet").glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_no_protocol_has_more_than_15_methods() -> None:
    wide = {
        f"{path.relative_to(ROOT)}:{name}": width
        for path in product_files()
        for name, width in protocol_widths(path.read_text(encoding="utf-8")).items()
        if width > MAX_PROTOCOL_METHODS
    }
    assert not wide, wide


def test_the_width_check_counts_a_protocols_own_methods() -> None:
    source = "class P(Protocol):\n" + "".join(
        f"    def m{i}(self) -> None: ...\n" for i in range(16)
    )
    assert protocol_widths(source) == {"P": 16}
    assert protocol_widths("class Q(P, Protocol):\n    pass\n") == {"Q": 0}


STORE_SIDE_DOOR = re.compile(r"isinstance\([^)]*(RedisStore|MemoryStore)|\bstore\.client\b")


def test_only_the_storage_package_knows_which_store_it_has() -> None:
    doors = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in product_files()
        if not path.is_relative_to(ROOT / "fleet" / "storage")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if STORE_SIDE_DOOR.search(line)
    ]
    assert not doors, doors


def test_the_side_door_check_finds_one() -> None:
    assert STORE_SIDE_DOOR.search("if isinstance(store, RedisStore):")
    assert STORE_SIDE_DOOR.search("Budgets(store.client)")
    assert not STORE_SIDE_DOOR.search("from fleet.client import Fleet")


def trace_events_built(source: str) -> list[int]:
    """The lines of a module that build a trace's status event (`Event(kind="trace", ...)`)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).split(".")[-1] == "Event"
        and any(
            k.arg == "kind" and isinstance(k.value, ast.Constant) and k.value.value == "trace"
            for k in node.keywords
        )
    ]


def test_only_the_lifecycle_builds_a_status_event() -> None:
    """A status change and its `trace` event are written in one place (`fleet.lifecycle`)."""
    outside = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in product_files()
        if not path.is_relative_to(ROOT / "fleet" / "lifecycle")
        for line in trace_events_built(path.read_text(encoding="utf-8"))
    ]
    assert not outside, outside


def test_the_status_event_check_finds_one() -> None:
    assert trace_events_built('store.emit(r, Event(kind="trace", trace_id=r, status="queued"))')
    assert trace_events_built('models.Event(kind="trace")') == [1]
    assert not trace_events_built('Event(kind="message", trace_id=r)')


def store_roles() -> dict[str, frozenset[str]]:
    """Each role Protocol of `fleet/storage/store.py` -> its methods (TraceStore, the sum, not)."""
    tree = ast.parse((ROOT / "fleet" / "storage" / "store.py").read_text(encoding="utf-8"))
    return {
        node.name: frozenset(n.name for n in node.body if isinstance(n, ast.FunctionDef))
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name != "TraceStore"
        if any(ast.unparse(base) == "Protocol" for base in node.bases)
    }


def whole_store_where_a_role_would_do(source: str, roles: dict[str, frozenset[str]]) -> list[str]:
    """Functions taking a `TraceStore` they only call methods of one role on.

    Only a parameter used solely as `store.method` is judged: one passed on whole (to another
    function, a constructor) may need the whole store there, which this scan cannot see.
    """
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            if arg.annotation is None or ast.unparse(arg.annotation) != "TraceStore":
                continue
            names = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == arg.arg]
            used = {
                n.attr
                for n in ast.walk(fn)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == arg.arg
            }
            if used and len(names) == sum(1 for n in ast.walk(fn) if _attribute_of(n, arg.arg)):
                fits = sorted(role for role, methods in roles.items() if used <= methods)
                if fits:
                    found.append(f"{fn.name}({arg.arg}): {fits[0]}")
    return found


def _attribute_of(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
    )


def test_no_signature_takes_the_whole_store_where_a_role_would_do() -> None:
    roles = store_roles()
    wide = [
        f"{path.relative_to(ROOT)}: {found}"
        for path in product_files()
        for found in whole_store_where_a_role_would_do(path.read_text(encoding="utf-8"), roles)
    ]
    assert not wide, wide


def test_the_role_check_finds_a_whole_store_used_for_one_role() -> None:
    roles = {"TraceRecords": frozenset({"get_trace"}), "Leases": frozenset({"beat"})}
    one_role = "def f(store: TraceStore) -> None:\n    store.get_trace('r')\n"
    two_roles = "def f(store: TraceStore) -> None:\n    store.get_trace('r')\n    store.beat()\n"
    passed_on = "def f(store: TraceStore) -> None:\n    store.get_trace('r')\n    g(store)\n"
    assert whole_store_where_a_role_would_do(one_role, roles) == ["f(store): TraceRecords"]
    assert whole_store_where_a_role_would_do(two_roles, roles) == []
    assert whole_store_where_a_role_would_do(passed_on, roles) == []


EXIT_CONSTANT = re.compile(r"^\s*EXIT_[A-Z_]+\s*[,=]", re.MULTILINE)


def test_the_exit_codes_are_declared_once() -> None:
    # One enum (fleetops.cli.exit_codes.ExitCode), not EXIT_* constants in each command module.
    from fleetops.cli.exit_codes import ExitCode

    declared = [
        str(path.relative_to(ROOT))
        for path in product_files()
        if EXIT_CONSTANT.search(path.read_text(encoding="utf-8"))
    ]
    assert not declared, declared
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "FAILED": 1,
        "BAD_INPUT": 2,
        "WAITING": 3,
        "INTERRUPTED": 130,
    }
    assert ExitCode(2).name == "BAD_INPUT" and ExitCode["NO_WORKERS"] == 2
    assert EXIT_CONSTANT.search("EXIT_OK, EXIT_FAILED = 0, 1\n")
