"""A preset file's text and checks: the YAML frontmatter, its tool names, cache keys, schema.

What the settings mean is `fleet.presets.preset` (`_PresetFrontmatter`, `load_preset_file`);
each error here is one line naming the setting.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import yaml
from pydantic_core import ErrorDetails

from fleet.config.mcp_names import PREFIX as MCP_PREFIX
from fleet.errors import ConfigError
from fleet.security import yamlsafe

CACHE_ARGUMENTS = ("task", "messages", "context", "skills")
"""`agent` arguments a `cache.keys` entry may name; `context.FIELD` names one field of
`context` (the sub-agent's own arguments, seed-style `city`, `forecast_type`)."""
_CONTEXT_FIELD = re.compile(r"^context\.[A-Za-z_][A-Za-z0-9_]*$")


def split(text: str) -> tuple[str, str]:
    """The YAML between the leading `---` lines, and the body after them."""
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ConfigError("missing YAML frontmatter: the file must start with a '---' line")
    for index, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :])
    raise ConfigError("frontmatter is not closed by a '---' line")


def parse_yaml(header: str) -> dict[str, Any]:
    """The frontmatter's settings as a mapping (empty for an empty header)."""
    try:
        data = yamlsafe.load(header, "frontmatter")
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML frontmatter: {' '.join(str(exc).split())}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("frontmatter must be a mapping of settings")
    return data


def describe(error: ErrorDetails) -> str:
    """One pydantic error as `field: message`."""
    field = ".".join(str(part) for part in error["loc"])
    message = "unknown setting" if error["type"] == "extra_forbidden" else error["msg"]
    return f"{field}: {message}" if field else str(message)


def check_schema(schema: object, where: str) -> dict[str, Any]:
    """A preset's `output_schema`, checked to be a JSON Schema object.

    Raises:
        ConfigError: `where: output_schema: what is wrong`.
    """
    if not isinstance(schema, dict):
        raise ConfigError(f"{where}: output_schema must be a mapping (a JSON Schema)")
    # jsonschema (~50 ms) only when a schema is checked: every client loads the presets.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(f"{where}: output_schema: {exc.message}") from None
    return schema


def check_tools(
    tools: list[str] | None, denied_tools: list[str], known_tools: Collection[str]
) -> None:
    """`tools:` and `denied_tools:` name only known tools (any `mcp__` name is allowed)."""
    for setting, names in (("tools", tools or []), ("denied_tools", denied_tools)):
        # MCP tools are known only once their server answers: any `mcp__` name may be listed.
        unknown = sorted(n for n in set(names) - set(known_tools) if not n.startswith(MCP_PREFIX))
        if unknown:
            known = ", ".join(sorted(known_tools))
            raise ConfigError(f"{setting}: unknown tool {unknown[0]!r} (known: {known})")


def check_cache_keys(keys: list[str]) -> None:
    """Each `cache.keys` entry must name an `agent` argument or a field of `context`.

    A name that matches nothing would read as null in every call, so every call would
    share one cache entry (a Paris forecast answered with Beijing's).
    """
    for name in keys:
        if name not in CACHE_ARGUMENTS and not _CONTEXT_FIELD.match(name):
            known = ", ".join(CACHE_ARGUMENTS)
            raise ConfigError(
                f"cache.keys: unknown argument {name!r} (known: {known};"
                f" a field of the call's context is 'context.{name}')"
            )
