"""A tool's JSON schema from its Python signature and Google-style docstring."""

from __future__ import annotations

import inspect
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Examples?|Notes?):\s*$")
_ARG_ENTRY = re.compile(r"^\*{0,2}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its Args entries.

    Returns:
        The text before the first section, and each argument's description with
        continuation lines joined.
    """
    description: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] = description
    for line in inspect.cleandoc(doc or "").splitlines():
        header = _SECTION.match(line)
        if header:
            current = sections.setdefault(header.group(1), [])
        else:
            current.append(line)
    args_lines = sections.get("Args", []) + sections.get("Arguments", [])
    return "\n".join(description).strip(), _parse_args(args_lines)


def _parse_args(lines: list[str]) -> dict[str, str]:
    entries = [line for line in lines if line.strip()]
    if not entries:
        return {}
    indent = min(len(line) - len(line.lstrip()) for line in entries)
    args: dict[str, str] = {}
    current: str | None = None
    for line in entries:
        match = _ARG_ENTRY.match(line.strip())
        if match and len(line) - len(line.lstrip()) == indent:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return args


def json_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a parameter type: scalars, list, dict, Literal, unions.

    Raises:
        TypeError: The type has no JSON form.
    """
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return {}
    if hint is type(None):
        return {"type": "null"}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is Literal:
        return _literal_schema(args)
    if origin in (Union, types.UnionType):
        return {"anyOf": [json_schema(arg) for arg in args]}
    if hint is list or origin is list:
        return {"type": "array", "items": json_schema(args[0])} if args else {"type": "array"}
    if hint is dict or origin is dict:
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": json_schema(args[1])}
        return {"type": "object"}
    raise TypeError(f"no JSON schema for type {hint!r}")


def _literal_schema(values: tuple[Any, ...]) -> dict[str, Any]:
    kinds = {_SCALARS.get(type(value)) for value in values}
    schema: dict[str, Any] = {"enum": list(values)}
    if len(kinds) == 1 and None not in kinds:
        schema["type"] = kinds.pop()
    return schema
