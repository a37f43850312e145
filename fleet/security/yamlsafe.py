"""YAML from outside, bounded: size, nesting, and what aliases may expand to.

`yaml.safe_load` builds no objects of arbitrary types, but it happily follows aliases:
a 600-byte "billion laughs" document (nine anchors, each nine aliases of the one before)
is a few hundred nodes to parse and 9**9 values to anything that walks the result
(pydantic, `json.dumps`, a trace write). Here the node graph is composed first and
measured — every node counted as often as aliases make it appear — before anything is
constructed; a recursive alias, nesting deeper than `MAX_DEPTH` or an expansion beyond
`MAX_ALIAS_EXPANSION` extra nodes is a one-line `ConfigError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fleet.errors import ConfigError

MAX_YAML_BYTES = 16 * 1024 * 1024
"""Larger YAML inputs are refused before parsing (batch files that big should be JSONL)."""
MAX_DEPTH = 64
"""Nesting of lists and mappings."""
MAX_ALIAS_EXPANSION = 10_000
"""How many nodes aliases may add beyond the document's own: anchors stay usable for
sharing a block or two, never for multiplying one."""

_WALK_LIMIT = 1000 * MAX_ALIAS_EXPANSION

_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML has it (several times faster), else the pure-Python one."""


def load(text: str, where: str) -> Any:
    """The Python value of one YAML document, after the bounds are checked.

    A drop-in for `yaml.safe_load`: a YAML syntax error still raises `yaml.YAMLError`, so
    each caller keeps its own way of reporting one (some must never quote the text).

    Raises:
        ConfigError: too large, too deep, or an alias bomb; one line naming `where`.
        yaml.YAMLError: not valid YAML.
    """
    loader = compose(text, where)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_node(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_file(path: Path) -> Any:
    """A YAML file, bounded as `load` bounds text; `ConfigError`: one line, file and where."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return load(text, str(path))  # bounded: size, depth, aliases
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise ConfigError(f"{path}: {where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML: {' '.join(str(exc).split())}") from None


def compose(text: str, where: str) -> Any:
    """A safe loader for `text`, its size checked; compose, check, construct with it.

    Raises:
        ConfigError: `text` is larger than MAX_YAML_BYTES.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{where}: YAML is {size} bytes, more than {MAX_YAML_BYTES}")
    return _SAFE_LOADER(text)


def check_node(root: yaml.Node, where: str) -> None:
    """Refuse a composed document that nests too deep or whose aliases multiply it.

    Raises:
        ConfigError: one line naming `where` and the line of the offending node.
    """
    sizes: dict[int, int] = {}
    expanded = _size(root, sizes, set(), 0, where)
    if expanded - len(sizes) > MAX_ALIAS_EXPANSION:
        raise ConfigError(
            f"{where}: YAML aliases expand {len(sizes)} nodes to {expanded};"
            f" at most {MAX_ALIAS_EXPANSION} more are allowed"
        )


def _size(node: yaml.Node, sizes: dict[int, int], path: set[int], depth: int, where: str) -> int:
    """How many nodes `node` stands for once every alias in it is expanded (memoised)."""
    key = id(node)
    if key in path:
        raise ConfigError(f"{where}:{node.start_mark.line + 1}: recursive YAML alias")
    if key in sizes:
        return sizes[key]
    if depth > MAX_DEPTH:
        raise ConfigError(
            f"{where}:{node.start_mark.line + 1}: YAML nested deeper than {MAX_DEPTH}"
        )
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    path.add(key)
    total = 1 + sum(_size(child, sizes, path, depth + 1, where) for child in children)
    path.discard(key)
    sizes[key] = total
    if total > _WALK_LIMIT:  # stop walking a bomb early
        line = node.start_mark.line + 1
        raise ConfigError(f"{where}:{line}: YAML aliases expand to more than {_WALK_LIMIT} nodes")
    return total
